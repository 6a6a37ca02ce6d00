"""One daemon per state directory.

Two daemons on one state directory each stored the same Xid (one event, two rows), and one
could open the other's database or remove its socket. The daemon holds an exclusive flock on
STATE_DIR/moptd.lock for as long as it runs (the kernel drops it when the process dies, a
SIGKILL included, so there is no stale lock to clean up); a second daemon refuses to start
and names the holder's pid.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = "moptd.lock"


class StateDirBusy(Exception):
    """Another moptd holds the state directory; the text says which."""


def lock_state_dir(state_dir: Path) -> int | None:
    """The locked file's descriptor (kept open while the daemon runs); None when the file
    cannot be made (a read-only or missing directory: the daemon runs in memory then and
    says so elsewhere). Raises StateDirBusy when another process holds it."""
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StateDirBusy(
                f"state directory {state_dir} is in use by another moptd (pid {holder}); "
                "two daemons cannot share one: stop it, or give this one another "
                "state_dir (and api.socket)"
            ) from None
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
