"""Paths moptd writes as root, used only after looking at them.

moptd runs as root on many hosts (outside the shipped unit) and writes into its state
directory and next to its API socket. A directory another user can write lets that user
put a symbolic link where moptd is about to create a file, and a mode change or an unlink
done by name then reaches whatever the link names. So: a directory moptd did not create
keeps its mode; a state directory another user can write is refused; files are created
and re-moded through a descriptor opened with O_NOFOLLOW; and only a socket is removed to
make room for the API socket.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def kind_of(mode: int) -> str:
    """What a non-regular file is, for an error message ("FIFO", "directory", ...)."""
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device node"
    if stat.S_ISLNK(mode):
        return "symbolic link"
    return "special file"


class UnsafePath(OSError):
    """A path moptd will not write through; the message names it and says why."""


def ensure_dir(path: Path, mode: int) -> bool:
    """Create `path` (and its parents) with `mode`; True when this call created it. A
    directory that exists keeps its mode: a shared one (/run, a 1777 folder) is not moptd's
    to change."""
    if path.is_dir():  # a link to a directory is root's choice: only root writes its parent
        return False
    path.mkdir(parents=True, exist_ok=False)
    os.chmod(path, mode)  # explicit, whatever the umask: moptd just made it
    return True


def ensure_private_dir(path: Path, mode: int) -> None:
    """moptd's own directory (state_dir): created with `mode`, or, when it exists and
    belongs to root or this user, brought to `mode` (tightened: it is moptd's); then
    checked with check_private_dir. Another user's directory is refused, never changed."""
    if not ensure_dir(path, mode):
        st = os.stat(path)
        if st.st_uid in (0, os.geteuid()) and stat.S_IMODE(st.st_mode) != mode:
            os.chmod(path, mode)
    check_private_dir(path)


def check_private_dir(path: Path) -> None:
    """Raise UnsafePath unless `path` is a directory owned by root or this user that no one
    else can write (group or others), so nobody can plant links in it."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a directory")
    if st.st_uid not in (0, os.geteuid()):
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not root or moptd's user")
    if st.st_mode & 0o022:
        raise UnsafePath(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            "another user could plant links in it"
        )


def create_file(path: Path, mode: int) -> None:
    """Create `path` with `mode` if it does not exist, never through a link."""
    try:
        fd = os.open(
            path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, mode
        )
    except FileExistsError:
        return
    try:
        os.fchmod(fd, mode)  # whatever the umask
    finally:
        os.close(fd)


def set_mode(path: Path, mode: int) -> None:
    """chmod a regular file moptd owns; a link or anything else is refused. By name after
    lstat, not through a descriptor of our own: closing any descriptor of a file drops
    every POSIX lock this process holds on it, SQLite's included (its -wal and -shm files
    are re-moded while it has them open). Safe because the directory is private
    (check_private_dir): nobody else can swap the name between the two calls."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{path} is not a regular file; its mode is left alone")
    os.chmod(path, mode)


def remove_stale_socket(path: Path) -> None:
    """Make room for a Unix socket at `path`: remove an old socket there, refuse anything
    else (a regular file, a link, a directory) rather than delete what is not moptd's."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UnsafePath(f"{path} exists and is not a socket; not removed")
    path.unlink()
