"""Follow /dev/kmsg without blocking the event loop, from where the committed position says.

Each read(2) of /dev/kmsg returns exactly one record. The descriptor is non-blocking and
watched with ``loop.add_reader``, so a burst is drained in slices of ``batch`` records and
other tasks run between slices. A read failing with EPIPE means the ring buffer overwrote
records before we read them: the kernel moves us to the oldest record still there, and
the gap in sequence numbers is the number lost.

Reading always starts at the oldest record of the ring, which holds only this boot's
records. With a position ``{boot_id, seq}`` of this boot (the daemon keeps it in the
findings database, committed in the same transaction as the events it covers), the
records up to ``seq`` are *replayed*: handed to ``on_replay``, so that the parser state
they built (a multi-line message, the GPU UUIDs, the incident of an Xid) is there again,
and not to ``on_records``, since their events are stored already. Without one (a first
start, another boot, a one-shot command) every record of the ring is new.

The JSON file of earlier versions (``load_position``) is read once, when the database has
no position yet, so an upgrade neither repeats nor misses what the old daemon stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moptd.kernel.logparse import KernelRecord, parse_raw_record

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
RECORD_MAX = 8192  # a kmsg record (text plus dictionary) fits; a shorter buffer gets EINVAL
# The event field naming the record an event came from ({"source", "boot_id", "seq",
# "cursor"}); the findings database commits it as the log's position with the event.
POSITION_FIELD = "log_position"


class StateError(ValueError):
    """A saved position that cannot be used (the message names the file)."""


@dataclass
class Position:
    boot_id: str
    seq: int | None  # last record handed on; None: none yet
    cursor: str = ""  # the journal source's position


def read_boot_id(path: Path = BOOT_ID) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def load_position(path: Path) -> Position | None:
    """The saved position, None when there is none; StateError when it is unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path}: cannot read the saved kernel-log position: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateError(f"{path}: saved kernel-log position is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("boot_id", ""), str):
        raise StateError(f"{path}: key 'boot_id': expected a string")
    seq = data.get("seq")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 0):
        raise StateError(f"{path}: key 'seq': expected a non-negative integer, got {seq!r}")
    cursor = data.get("cursor", "")
    if not isinstance(cursor, str):
        raise StateError(f"{path}: key 'cursor': expected a string")
    return Position(data.get("boot_id", ""), seq, cursor)


class KmsgFollower:
    """Reads records from a kmsg device and hands them to ``on_records`` in batches."""

    def __init__(
        self,
        path: Path,
        on_records: Callable[[list[KernelRecord]], None],
        boot_id: str = "",
        boot_time: float | None = None,
        batch: int = 512,
        resume: Position | None = None,
        on_replay: Callable[[list[KernelRecord]], None] | None = None,
    ) -> None:
        self.path = path
        self.on_records = on_records
        self.on_replay = on_replay
        self.boot_id = boot_id or read_boot_id()
        self.boot_time = boot_time
        self.batch = batch
        self.records_read = 0  # new records handed on (replayed ones are not counted)
        self.records_lost = 0
        self.overruns = 0
        self.last_seq: int | None = None
        # records up to this seq were handed on before a restart: replayed, not new
        self.replay_through: int | None = None
        if resume is not None and resume.boot_id == self.boot_id and resume.seq is not None:
            self.replay_through = resume.seq
            self.last_seq = resume.seq  # a gap after it was lost while moptd was down
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replayed_last = 0  # records replayed by the last read_some

    # --- lifecycle ---------------------------------------------------------------
    def open(self) -> None:
        """Open the device at its oldest record (blocking: call it off the loop).
        Raises OSError when the device cannot be read (not root, sandboxed)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.lseek(fd, 0, os.SEEK_SET)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd

    def adopt(self, fd: int) -> None:
        """Follow an already open, non-blocking source of one record per read (a
        SOCK_SEQPACKET socket in tests); the resume position still applies."""
        self._fd = fd

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._fd is None:
            raise RuntimeError("open() first")
        self._loop = loop
        loop.add_reader(self._fd, self.drain)

    def close(self) -> None:
        if self._fd is None:
            return
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = None

    def position(self) -> Position:
        """Where the records handed on so far end (the replayed ones included)."""
        return Position(self.boot_id, self.last_seq)

    # --- reading -----------------------------------------------------------------
    def read_some(self, limit: int) -> list[KernelRecord]:
        """Up to ``limit`` new records that are ready now; [] when none are. Replayed
        records read on the way go to ``on_replay`` and do not count against ``limit``."""
        out: list[KernelRecord] = []
        replayed: list[KernelRecord] = []
        fd = self._fd
        if fd is None:
            return out
        while len(out) < limit and len(replayed) < limit:
            try:
                data = os.read(fd, RECORD_MAX)
            except BlockingIOError:
                break
            except BrokenPipeError:
                # overwritten before we read them; the next record tells how many
                self.overruns += 1
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                break
            rec = parse_raw_record(data.decode("utf-8", "replace"), self.boot_time)
            if rec.seq is not None:
                if self.replay_through is not None:
                    if rec.seq <= self.replay_through:
                        replayed.append(rec)
                        continue
                    self.replay_through = None
                if self.last_seq is not None and rec.seq > self.last_seq + 1:
                    self.records_lost += rec.seq - self.last_seq - 1
                self.last_seq = rec.seq
            self.records_read += 1
            out.append(rec)
        self._replayed_last = len(replayed)
        if replayed and self.on_replay is not None:
            self.on_replay(replayed)
        return out

    def read_slice(self) -> bool:
        """Hand on one slice of what is ready now; False when nothing was (a one-shot
        command reads the backlog this way, the loop free between slices)."""
        records = self.read_some(self.batch)
        if records:
            self.on_records(records)
        return bool(records) or self._replayed_last > 0

    def drain(self) -> None:
        """The loop's reader callback: one slice, then back to the loop."""
        try:
            records = self.read_some(self.batch)
        except OSError as exc:
            log.warning("reading %s failed: %s; kernel-log following stopped", self.path, exc)
            self.close()
            return
        if records:
            self.on_records(records)
