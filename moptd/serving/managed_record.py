"""The record of the managed server moptd started, and who still runs of it: read-only.

The supervisor writes the record (moptd.serving.orphan); a restarted moptd reads it to find
a server an earlier one left, and `moptd doctor` to know the port's holder is moptd's own
server. Nothing here signals or removes anything.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RECORD_NAME = "managed.json"
RECORD_MAX = 4096  # bytes: the record is a few dozen
PROC = Path("/proc")
BOOT_ID = PROC / "sys/kernel/random/boot_id"


@dataclass(frozen=True, slots=True)
class ManagedRecord:
    pid: int
    start_ticks: int  # /proc/PID/stat field 22
    pgid: int
    boot_id: str


def stat_fields(pid: int, proc: Path = PROC) -> list[str] | None:
    """/proc/PID/stat's fields from field 3 on (state first); None when the pid is gone.
    The command name (field 2) may hold spaces and parentheses: cut at the last ')'."""
    try:
        text = (proc / str(pid) / "stat").read_bytes()[:4096].decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    _, sep, rest = text.rpartition(")")
    return rest.split() if sep else None


def start_ticks(pid: int, proc: Path = PROC) -> int | None:
    fields = stat_fields(pid, proc)
    # field 22 (starttime) is index 19 counted from field 3
    if fields is None or len(fields) < 20:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def boot_id(path: Path = BOOT_ID) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def record_path(state_dir: Path) -> Path:
    return state_dir / RECORD_NAME


def read_record(state_dir: Path) -> ManagedRecord | None:
    """The record a previous moptd left; None when there is none. A record that is not a
    regular file or does not parse is reported and set aside (never trusted)."""
    path = record_path(state_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("ignoring the managed-process record %s: %s", path, exc)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            log.warning("ignoring the managed-process record %s: not a regular file", path)
            return None
        raw = os.read(fd, RECORD_MAX)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
        rec = ManagedRecord(
            int(data["pid"]), int(data["start_ticks"]), int(data["pgid"]), str(data["boot_id"])
        )
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the managed-process record %s: %s", path, exc)
        return None
    if rec.pid <= 1 or rec.pgid <= 1:
        log.warning("ignoring the managed-process record %s: pid %d", path, rec.pid)
        return None
    return rec


def _pids(proc: Path) -> Iterator[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def group_members(rec: ManagedRecord, proc: Path = PROC) -> list[int]:
    """Live processes of the recorded group that are the recorded one's: the leader with
    its recorded start time, or members of its group (and session) started no earlier."""
    if rec.boot_id and rec.boot_id != boot_id(proc / "sys/kernel/random/boot_id"):
        return []  # another boot: every pid and start time is another process's
    leader_ticks = start_ticks(rec.pid, proc)
    if leader_ticks is not None and leader_ticks != rec.start_ticks:
        return []  # the pid came round again: someone else's process, never signalled
    members = []
    for pid in _pids(proc):
        fields = stat_fields(pid, proc)
        if fields is None or len(fields) < 20:
            continue
        try:
            pgrp, session, ticks = int(fields[2]), int(fields[3]), int(fields[19])
        except ValueError:
            continue
        if fields[0] == "Z":
            continue  # a zombie holds nothing; its parent (init) reaps it
        if pgrp == rec.pgid and session == rec.pgid and ticks >= rec.start_ticks:
            members.append(pid)
    return members
