"""Follow /dev/kmsg without blocking the event loop, and remember where we stopped.

Each read(2) of /dev/kmsg returns exactly one record. The descriptor is non-blocking and
watched with ``loop.add_reader``, so a burst is drained in slices of ``batch`` records and
other tasks run between slices. A read failing with EPIPE means the ring buffer overwrote
records before we read them: the kernel moves us to the oldest record still there, and
the gap in sequence numbers is the number lost.

The position ``{boot_id, seq}`` is saved in the state directory (atomically, mode 0640).
On start: no saved position -> the end of the ring (old records are not news); the same
boot -> just after the saved record; another boot -> the start of the ring, since nothing
of this boot has been reported yet.
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


def save_position(path: Path, pos: Position) -> None:
    """Write-then-rename so a crash leaves the old or the new position, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = json.dumps({"boot_id": pos.boot_id, "seq": pos.seq, "cursor": pos.cursor})
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class KmsgFollower:
    """Reads records from a kmsg device and hands them to ``on_records`` in batches."""

    def __init__(
        self,
        path: Path,
        state_file: Path,
        on_records: Callable[[list[KernelRecord]], None],
        boot_id: str = "",
        boot_time: float | None = None,
        batch: int = 512,
    ) -> None:
        self.path = path
        self.state_file = state_file
        self.on_records = on_records
        self.boot_id = boot_id or read_boot_id()
        self.boot_time = boot_time
        self.batch = batch
        self.records_read = 0
        self.records_lost = 0
        self.overruns = 0
        self.last_seq: int | None = None
        self._skip_through: int | None = None  # resume: drop records up to this seq
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dirty = False

    # --- lifecycle ---------------------------------------------------------------
    def open(self) -> None:
        """Open and position the device (blocking: call it off the loop).
        Raises OSError when the device cannot be read (not root, sandboxed)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            start = self._start_from_saved()
            if start == "end":
                os.lseek(fd, 0, os.SEEK_END)
            else:
                os.lseek(fd, 0, os.SEEK_SET)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd

    def adopt(self, fd: int) -> None:
        """Follow an already open, non-blocking source of one record per read (a
        SOCK_SEQPACKET socket in tests); the saved position still applies."""
        self._start_from_saved()
        self._fd = fd

    def _start_from_saved(self) -> str:
        """Where to start: "end", "resume" (skip through the saved seq) or "start"."""
        saved: Position | None = None
        try:
            saved = load_position(self.state_file)
        except StateError as exc:
            log.warning("%s; starting at the end of the kernel log", exc)
        if saved is not None and saved.boot_id == self.boot_id and saved.seq is not None:
            self._skip_through = saved.seq
            self.last_seq = saved.seq
            return "resume"
        if saved is not None and saved.boot_id and saved.boot_id != self.boot_id:
            return "start"
        return "end"

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

    # --- reading -----------------------------------------------------------------
    def read_some(self, limit: int) -> list[KernelRecord]:
        """Up to ``limit`` records that are ready now; [] when none are."""
        out: list[KernelRecord] = []
        fd = self._fd
        if fd is None:
            return out
        while len(out) < limit:
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
                if self._skip_through is not None:
                    if rec.seq <= self._skip_through:
                        continue
                    self._skip_through = None
                if self.last_seq is not None and rec.seq > self.last_seq + 1:
                    self.records_lost += rec.seq - self.last_seq - 1
                self.last_seq = rec.seq
            self.records_read += 1
            out.append(rec)
        if out:
            self._dirty = True
        return out

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

    def save(self) -> None:
        """Persist the position if it moved (blocking: call it off the loop)."""
        if not self._dirty:
            return
        save_position(self.state_file, Position(self.boot_id, self.last_seq))
        self._dirty = False  # only once saved: a failed save (a full disk) is tried again
