"""The alternative source: the systemd journal's kernel transport (extra ``systemd``).

For hosts where /dev/kmsg is closed to moptd but the journal is readable (a member of
systemd-journal). The position is the journal cursor, saved like the kmsg sequence
number; without one, reading starts at the end of the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from moptd.collector import Unavailable
from moptd.kernel.kmsg import Position, StateError, load_position, read_boot_id, save_position
from moptd.kernel.logparse import MAX_TEXT, KernelRecord

log = logging.getLogger(__name__)


class JournalFollower:
    def __init__(
        self,
        state_file: Path,
        on_records: Callable[[list[KernelRecord]], None],
        batch: int = 512,
    ) -> None:
        self.state_file = state_file
        self.on_records = on_records
        self.batch = batch
        self.records_read = 0
        self.records_lost = 0  # the journal does not say; kept for the common counters
        self.boot_id = read_boot_id()
        self._reader: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cursor = ""
        self._dirty = False

    def open(self) -> None:
        try:
            from systemd import journal  # type: ignore[attr-defined]
        except ImportError:
            raise Unavailable(
                "systemd-python is not installed (pip install 'moptd[systemd]')"
            ) from None
        reader = journal.Reader()
        reader.add_match(_TRANSPORT="kernel")
        saved: Position | None = None
        try:
            saved = load_position(self.state_file)
        except StateError as exc:
            log.warning("%s; starting at the end of the journal", exc)
        if saved is not None and saved.cursor:
            reader.seek_cursor(saved.cursor)
            reader.get_next()  # the saved entry itself was already handed on
        else:
            reader.seek_tail()
            reader.get_previous()
        self._reader = reader

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._reader.fileno(), self.drain)

    def close(self) -> None:
        if self._reader is None:
            return
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._reader.fileno())
        self._reader.close()
        self._reader = None

    def drain(self) -> None:
        reader = self._reader
        if reader is None:
            return
        reader.process()  # acknowledge the wake-up
        out: list[KernelRecord] = []
        while len(out) < self.batch:
            entry = reader.get_next()
            if not entry:
                break
            out.append(self.to_record(entry))
            self._cursor = str(entry.get("__CURSOR", self._cursor))
        if out:
            self.records_read += len(out)
            self._dirty = True
            self.on_records(out)
            if len(out) == self.batch and self._loop is not None:
                self._loop.call_soon(self.drain)  # more may wait; the fd will not wake us

    @staticmethod
    def to_record(entry: dict[str, Any]) -> KernelRecord:
        message = entry.get("MESSAGE", "")
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        t = entry.get("__REALTIME_TIMESTAMP")
        mono = entry.get("_SOURCE_MONOTONIC_TIMESTAMP")
        return KernelRecord(
            str(message)[:MAX_TEXT],
            t.timestamp() if isinstance(t, datetime) else None,
            _seconds(mono),
            level=entry.get("PRIORITY") if isinstance(entry.get("PRIORITY"), int) else None,
            fmt="journal",
        )

    def save(self) -> None:
        if self._dirty:
            self._dirty = False
            save_position(self.state_file, Position(self.boot_id, None, self._cursor))


def _seconds(mono: Any) -> float | None:
    # systemd-python gives a Monotonic named tuple whose first item is a timedelta
    delta = getattr(mono, "timestamp", None)
    return delta.total_seconds() if delta is not None else None
