"""The managed server outlives no moptd: it dies with its parent, and one left behind by a
moptd killed outside systemd is found and stopped before another is started.

Two parts. In the child, before exec, ``PR_SET_PDEATHSIG`` asks the kernel to SIGKILL the
server when the thread that started it ends (the event loop's thread, which lives as long
as moptd; a parent gone before the prctl took effect is caught by the child itself).
Workers the server forks are not covered by it, so the supervisor also writes a record of
the process it started (pid, start time in clock ticks since boot from ``/proc/PID/stat``
field 22, process group, boot id) in its state directory. A restarted moptd reads it
first: when the recorded process still runs with the recorded start time in this boot,
or, the leader gone, members of its group still run, the whole group is stopped (SIGTERM,
then SIGKILL after the grace) before anything starts. A pid that merely came round again
has another start time and is never signalled. A group that cannot be stopped (EPERM, a
process stuck in D state) is reported, and nothing is started beside it.

Linux keeps a process-group number allocated while any member lives, so members of the
recorded group that started no earlier than the recorded leader are the leader's group.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from moptd.serving.gates import GateResult
from moptd.serving.managed_record import (
    PROC,
    ManagedRecord,
    boot_id,
    group_members,
    read_record,
    record_path,
    start_ticks,
)

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def _libc_prctl() -> Callable[..., int] | None:
    # resolved here, in the parent: the child after fork only calls it (no dlopen there)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _libc_prctl()


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn``: the child asks for SIGKILL when its parent's thread ends. Built in
    the parent, so it knows the parent's pid: a parent that died before the prctl took
    effect leaves the child reparented, and the child kills itself at once."""
    parent = os.getpid()
    prctl = _PRCTL

    def child() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return child


def write_record(state_dir: Path, pid: int) -> ManagedRecord | None:
    """Write the record of the process just started; None (logged) when it cannot be."""
    ticks = start_ticks(pid)
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        pgid = pid  # already gone: its own session made it its group's leader
    if ticks is None:
        return None
    rec = ManagedRecord(pid, ticks, pgid, boot_id())
    body = json.dumps(
        {"pid": rec.pid, "start_ticks": rec.start_ticks, "pgid": rec.pgid, "boot_id": rec.boot_id}
    )
    path = record_path(state_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot record the managed process in %s: %s", path, exc)
        return None
    return rec


def clear_record(state_dir: Path) -> None:
    """The process exited and its group was reaped: nothing is left to find."""
    try:
        record_path(state_dir).unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove %s: %s", record_path(state_dir), exc)


def stop_orphan(state_dir: Path, grace: float, proc: Path = PROC) -> str:
    """Stop the group a previous moptd left running; "" when none is left (or none was),
    else why it could not be stopped. Blocking (up to grace + 5 s): run it off the loop."""
    rec = read_record(state_dir)
    if rec is None:
        return ""
    members = group_members(rec, proc)
    if not members:
        clear_record(state_dir)
        return ""
    log.warning(
        "a managed server left by an earlier moptd still runs (pid %d, group %d, %d "
        "processes): stopping its group before starting another",
        rec.pid,
        rec.pgid,
        len(members),
    )
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(rec.pgid, sig)
        except ProcessLookupError:
            break
        except PermissionError as exc:
            return (
                f"a managed server left by an earlier moptd (pid {rec.pid}, group "
                f"{rec.pgid}) still runs and cannot be stopped: {exc.strerror}"
            )
        deadline = time.monotonic() + wait
        while group_members(rec, proc) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not group_members(rec, proc):
            break
    left = group_members(rec, proc)
    if left:
        return (
            f"a managed server left by an earlier moptd (pid {rec.pid}, group {rec.pgid}) "
            f"still runs after SIGKILL ({len(left)} processes, e.g. pid {left[0]}); "
            "not starting another beside it"
        )
    clear_record(state_dir)
    log.info("stopped the managed server group %d an earlier moptd left", rec.pgid)
    return ""


def orphan_gate(state_dir: Path | None, grace: float) -> list[GateResult]:
    """The supervisor's first check before a start: [] when no orphan is left (one found
    is stopped), else the refusal (the port and the GPUs are still held: PORT_CONFLICT)."""
    if state_dir is None:
        return []
    held = stop_orphan(state_dir, grace)
    return [GateResult("orphan", False, "PORT_CONFLICT", held)] if held else []
