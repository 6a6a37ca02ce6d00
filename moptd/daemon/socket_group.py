"""Give the API socket to ``api.group``, the group whose members may use the local API.

An unprivileged moptd (the shipped unit: User=moptd, no CAP_CHOWN) may give a file it owns
to a group it is a member of, and to no other: the unit's SupplementaryGroups= names the
groups. The unit's SystemCallFilter= allows @chown for this call alone.
"""

from __future__ import annotations

import grp
import os
from pathlib import Path


def give_to_group(path: Path, group: str) -> str | None:
    """chown `path` to `group`; None when done (or already so), else why not, for the log."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return f"api.group {group!r}: no such group"
    try:
        if os.stat(path, follow_symlinks=False).st_gid == gid:
            return None  # the unit's own Group=: nothing to change
        os.chown(path, -1, gid, follow_symlinks=False)
    except PermissionError as exc:
        if os.geteuid() != 0 and gid not in (os.getegid(), *os.getgroups()):
            return (
                f"cannot give {path} to group {group}: this process is not a member of it "
                f"(add SupplementaryGroups={group} to moptd.service with a drop-in)"
            )
        return f"cannot give {path} to group {group}: {exc.strerror}"
    except OSError as exc:
        return f"cannot give {path} to group {group}: {exc.strerror or exc}"
    return None
