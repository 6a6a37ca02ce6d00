"""Whether the systemd unit `moptd install-service` writes can run the moptd it names.

The unit runs as `User=` with `ProtectHome=` and `PrivateTmp=`: a moptd under /root, /home
or /tmp (a virtual environment there, its interpreter in the script's #! line) is hidden
from it, or not executable by that user, and the service fails at its first start with
status 203/EXEC. install-service says so, and why, before it writes anything.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

# systemd.exec(5): what each setting hides from the service
_HOME_DIRS = ("/home", "/root", "/run/user")
_TMP_DIRS = ("/tmp", "/var/tmp")  # noqa: S108 - paths named, not used


def unit_settings(unit: str) -> dict[str, str]:
    """The [Service] settings of a unit file (the last assignment of a key wins)."""
    out: dict[str, str] = {}
    for line in unit.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _under(path: str, dirs: tuple[str, ...]) -> str | None:
    return next((d for d in dirs if path == d or path.startswith(d + "/")), None)


def _paths_needed(executable: str) -> list[str]:
    """The moptd named, where its links lead, and the interpreter of its #! line."""
    paths = [executable]
    real = os.path.realpath(executable)
    if real != executable:
        paths.append(real)
    try:
        with open(real, "rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return paths
    if first.startswith(b"#!"):
        words = first[2:].decode("utf-8", "replace").split()
        if words and words[0] != "/usr/bin/env":
            paths.append(words[0])
            if os.path.realpath(words[0]) != words[0]:
                paths.append(os.path.realpath(words[0]))
    return paths


def _can(st: os.stat_result, user: pwd.struct_passwd | None, groups: set[int], bit: int) -> bool:
    """Whether `user` has the permission `bit` (4 read, 1 execute) by the mode bits."""
    if user is not None and user.pw_uid == 0:
        return bool(st.st_mode & 0o111) if bit == 1 and stat.S_ISREG(st.st_mode) else True
    if user is not None and st.st_uid == user.pw_uid:
        return bool(st.st_mode & (bit << 6))
    if st.st_gid in groups:
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)


def cannot_run(unit: str, executable: str) -> str | None:
    """Why the unit cannot execute `executable`, or None where it can."""
    settings = unit_settings(unit)
    name = settings.get("User", "root") or "root"
    protect_home = settings.get("ProtectHome", "no").lower()
    private_tmp = settings.get("PrivateTmp", "no").lower() in ("yes", "true", "1", "on")
    try:
        user: pwd.struct_passwd | None = pwd.getpwnam(name)
    except KeyError:
        user = None  # created by sysusers on install: no file is its own, it is in no group
    groups: set[int] = set()
    if user is not None:
        groups = {user.pw_gid, *os.getgrouplist(user.pw_name, user.pw_gid)}
    paths = _paths_needed(executable)
    for path in paths:  # hidden by the sandbox first: the plainer reason
        home = _under(path, _HOME_DIRS)
        if home and protect_home in ("yes", "true", "1", "on", "tmpfs"):
            return f"{path} is under {home}, which ProtectHome={protect_home} hides from the unit"
        tmp = _under(path, _TMP_DIRS)
        if tmp and private_tmp:
            return f"{path} is under {tmp}, which PrivateTmp=yes replaces with an empty one"
    for path in paths:
        p = Path(path)
        try:
            st = p.stat()
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        for parent in reversed(p.parents):
            pst = parent.stat()
            if not _can(pst, user, groups, 1):
                return f"user {name} cannot enter {parent} (mode {stat.filemode(pst.st_mode)})"
        if not _can(st, user, groups, 1):
            return f"user {name} cannot execute {path} (mode {stat.filemode(st.st_mode)})"
    return None
