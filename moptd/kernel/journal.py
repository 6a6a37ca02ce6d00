"""The alternative source: the systemd journal's kernel transport (extra ``systemd``).

For hosts where /dev/kmsg is closed to moptd but the journal is readable (a member of
systemd-journal). Only this boot's entries are read. The position is the journal cursor,
committed like the kmsg sequence number (each record carries its entry's cursor in
``meta["__CURSOR"]``): with a cursor of this boot, reading goes on just after it; without
one (a first start, another boot, a one-shot command), from the first entry of this boot.
Unlike kmsg, the entries before the cursor are not replayed: a cursor is not ordered
against other cursors, and the journal may have rotated the saved entry away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from moptd.collector import Unavailable
from moptd.kernel.kmsg import Position, read_boot_id
from moptd.kernel.logparse import MAX_TEXT, KernelRecord

log = logging.getLogger(__name__)

CURSOR = "__CURSOR"  # the journal field (and the record's meta key) naming an entry


class JournalFollower:
    def __init__(
        self,
        on_records: Callable[[list[KernelRecord]], None],
        batch: int = 512,
        resume: Position | None = None,
    ) -> None:
        self.on_records = on_records
        self.batch = batch
        self.records_read = 0
        self.records_lost = 0  # the journal does not say; kept for the common counters
        self.boot_id = read_boot_id()
        self.resume = resume
        self._reader: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cursor = ""

    def open(self) -> None:
        try:
            from systemd import journal  # type: ignore[attr-defined]
        except ImportError:
            raise Unavailable(
                "systemd-python is not installed (pip install 'moptd[systemd]')"
            ) from None
        reader = journal.Reader()
        reader.add_match(_TRANSPORT="kernel")
        reader.this_boot()
        saved = self.resume
        if saved is not None and saved.cursor and saved.boot_id == self.boot_id:
            reader.seek_cursor(saved.cursor)
            reader.get_next()  # the saved entry itself was already handed on
            self._cursor = saved.cursor
        else:
            reader.seek_head()
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
        if self._slice() == self.batch and self._loop is not None:
            self._loop.call_soon(self.drain)  # more may wait; the fd will not wake us

    def read_slice(self) -> bool:
        """Hand on one slice of what is there now; False when that was all."""
        return self._slice() == self.batch

    def _slice(self) -> int:
        reader = self._reader
        if reader is None:
            return 0
        reader.process()  # acknowledge the wake-up
        out: list[KernelRecord] = []
        while len(out) < self.batch:
            entry = reader.get_next()
            if not entry:
                break
            out.append(self.to_record(entry))
            self._cursor = str(entry.get(CURSOR, self._cursor))
        if out:
            self.records_read += len(out)
            self.on_records(out)
        return len(out)

    @staticmethod
    def to_record(entry: dict[str, Any]) -> KernelRecord:
        message = entry.get("MESSAGE", "")
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        t = entry.get("__REALTIME_TIMESTAMP")
        mono = entry.get("_SOURCE_MONOTONIC_TIMESTAMP")
        rec = KernelRecord(
            str(message)[:MAX_TEXT],
            t.timestamp() if isinstance(t, datetime) else None,
            _seconds(mono),
            level=entry.get("PRIORITY") if isinstance(entry.get("PRIORITY"), int) else None,
            fmt="journal",
        )
        cursor = entry.get(CURSOR)
        if isinstance(cursor, str):
            rec.meta[CURSOR] = cursor
        return rec

    def position(self) -> Position:
        """Where the entries handed on so far end."""
        return Position(self.boot_id, None, self._cursor)


def _seconds(mono: Any) -> float | None:
    # systemd-python gives a Monotonic named tuple whose first item is a timedelta
    delta = getattr(mono, "timestamp", None)
    return delta.total_seconds() if delta is not None else None
