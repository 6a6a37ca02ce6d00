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
from moptd.serving.errorrecords import STREAM as UNCLASSIFIED
from moptd.serving.logparse import LogState
from moptd.serving.logring import LineSplitter, LogRing
from moptd.serving.spec import flag_value

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


def fill_managed(
    b: Batch,
    subject: str,
    pid: int | None,
    state: str,
    st: LogState,
    command: tuple[str, ...],
    now: float,
) -> None:
    """What either backend of the managed process reports alike: whether it runs, a crash
    loop, model loading, --max-num-seqs from its command line, and its log's state."""
    b.add("serving.process_up", subject, 1.0 if pid is not None else 0.0)
    b.add("serving.crash_loop", subject, 1.0 if state == "crash_loop" else 0.0)
    b.add("serving.starting", subject, 1.0 if pid is not None and not st.started else 0.0)
    b.add("serving.stopping", subject, 1.0 if state == "stopping" else 0.0)
    seqs = flag_value(command, "--max-num-seqs")
    if seqs is not None and seqs.isdigit():
        b.add("serving.max_num_seqs", subject, float(seqs))
    fill_log_state(b, subject, st, now)


def log_events(
    lines: list[str],
    now: float,
    subject: str,
    ring: LogRing,
    state: LogState,
    stopping: Callable[[LogState], bool],
) -> list[Event]:
    """Keep each line in the ring, update the log state, and return the events the lines
    carry. Engine-death lines printed while the server stops on request (``stopping``)
    are not events: vLLM prints EngineDeadError on every requested shutdown, and the
    errors of a stop (cancelled tasks) are no unclassified errors either."""
    events: list[Event] = []
    for line in lines:
        ring.append(now, line)
        state.observe(line)
        rec = state.record(line)
        if rec is None:
            continue
        state.update(rec, now)
        if rec.stream in ("serving.engine_dead", UNCLASSIFIED) and stopping(state):
            continue
        events.append(Event(rec.stream, subject, now, state.event_fields(rec), line[:1000]))
    return events


class JournalTail:
    """``journalctl --follow`` of one unit in the background; each chunk's lines go to
    ``on_lines(lines, now)``. Used for unmanaged servers and for the systemd backend."""

    def __init__(
        self, argv: list[str], on_lines: Callable[[list[str], float], None], what: str
    ) -> None:
        self.argv = argv
        self.on_lines = on_lines
        self.what = what
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except OSError as exc:
            log.warning("%s: cannot follow the journal: %s", self.what, exc)
            return
        self._task = asyncio.create_task(self._read(self._proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        splitter = LineSplitter()
        while chunk := await proc.stdout.read(65536):
            self.on_lines(splitter.feed(chunk), time.time())

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self._proc.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def journal_follow_argv(unit: str, follow: bool = True, lines: int = 0) -> list[str]:
    argv = ["journalctl", "--unit", unit, "--output", "cat", "--no-pager"]
    argv += ["--lines", str(lines)]
    if follow:
        argv.append("--follow")
    return argv


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
        self._journal: JournalTail | None = None

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
        self._journal = JournalTail(
            journal_follow_argv(self.unit), self.feed, f"{self.subject} (unit {self.unit})"
        )
        await self._journal.start()

    async def stop(self) -> None:
        if self._journal is not None:
            await self._journal.stop()

    def feed(self, lines: list[str], now: float) -> None:
        events = log_events(
            lines, now, self.subject, self.ring, self.state, lambda st: st.shutting_down
        )
        if events:
            self.publish(events)
