"""Logs of servers moptd does not run: a file (followed like ``tail -F``) or a journal unit.

The lines go through the same parsers and bounded ring as the managed process's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from moptd.observations import Batch, Event
from moptd.serving.logparse import LogState, parse_line
from moptd.serving.logring import LineSplitter, LogRing

log = logging.getLogger(__name__)

READ_MAX = 4 << 20  # per pass: a flood is read over several passes, memory stays bounded


def fill_log_state(b: Batch, subject: str, st: LogState, now: float) -> None:
    """What the log has told so far, as samples (shared by every log source)."""
    if st.cuda_graphs:
        b.add("serving.cuda_graphs_enabled", subject, 1.0 if st.cuda_graphs == "captured" else 0.0)
    if st.kv_tokens is not None:
        b.add("serving.kv_cache_capacity_tokens", subject, st.kv_tokens)
    if st.max_concurrency is not None:
        b.add("serving.kv_cache_max_concurrency", subject, st.max_concurrency)
    if st.last_stats_t is not None:
        b.add("serving.log_stats_age", subject, max(0.0, now - st.last_stats_t))


class LogFollower:
    def __init__(
        self,
        subject: str,
        publish: Callable[[list[Event]], None],
        file: Path | None = None,
        unit: str | None = None,
        max_lines: int = 5000,
    ) -> None:
        self.subject = subject
        self.publish = publish
        self.file = file
        self.unit = unit
        self.state = LogState()
        self.ring = LogRing(max_lines)
        self._splitter = LineSplitter()
        self._inode: int | None = None
        self._offset = 0
        self._journal: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None

    # --- a file: read what was appended since the last pass (blocking; collector thread) ---

    def read_file(self) -> list[str]:
        assert self.file is not None
        try:
            st = os.stat(self.file)
        except OSError:
            return []  # not there yet, or rotated away for a moment
        if self._inode is None:
            # start at the end: old lines were written before moptd watched
            self._inode, self._offset = st.st_ino, st.st_size
            return []
        if st.st_ino != self._inode or st.st_size < self._offset:
            self._inode, self._offset = st.st_ino, 0  # rotated or truncated
            self._splitter = LineSplitter()
        if st.st_size == self._offset:
            return []
        with open(self.file, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read(READ_MAX)
        self._offset += len(data)
        return self._splitter.feed(data)

    # --- a journal unit: journalctl --follow in the background ---

    async def start(self) -> None:
        if self.unit is None:
            return
        argv = ["journalctl", "--unit", self.unit, "--output", "cat", "--no-pager"]
        argv += ["--lines", "0", "--follow"]
        try:
            self._journal = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except OSError as exc:
            log.warning("%s: cannot follow journal unit %s: %s", self.subject, self.unit, exc)
            return
        self._task = asyncio.create_task(self._read_journal(self._journal))

    async def _read_journal(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        splitter = LineSplitter()
        while chunk := await proc.stdout.read(65536):
            self.feed(splitter.feed(chunk), time.time())

    async def stop(self) -> None:
        if self._journal is not None and self._journal.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._journal.terminate()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self._journal.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def feed(self, lines: list[str], now: float) -> None:
        events: list[Event] = []
        for line in lines:
            self.ring.append(now, line)
            rec = parse_line(line)
            if rec is None:
                continue
            self.state.update(rec, now)
            if rec.stream == "serving.engine_dead" and self.state.shutting_down:
                continue
            events.append(Event(rec.stream, self.subject, now, rec.fields, line[:1000]))
        if events:
            self.publish(events)
