"""Who may change the daemon through the API.

Reads are open to whoever can reach the socket (its mode and group decide). Mutating calls
(rule reload, serving restart) are allowed on the Unix socket only to peers that are root,
the daemon's own user or members of the configured group, read from the socket's peer
credentials; on TCP only with the bearer token from the token file.
"""

from __future__ import annotations

import contextlib
import grp
import hmac
import logging
import os
import pwd
import socket
import struct
from dataclasses import dataclass

from aiohttp import web

from moptd.daemon.http import ApiError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ApiAuth:
    group: str | None = None  # may call mutating endpoints on the Unix socket
    token: str | None = None  # required for mutating endpoints on TCP


def load_token(path: os.PathLike[str] | str | None) -> str | None:
    """The TCP API's bearer token; a file others can read is refused (logged)."""
    if path is None:
        return None
    try:
        # the mode is checked on the file that was opened, not on the name (no race)
        with open(path, encoding="utf-8") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if mode & 0o077:
                log.error(
                    "api token file %s is readable by others (mode %o); TCP mutations off",
                    path,
                    mode & 0o777,
                )
                return None
            token = fh.read(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        log.error("cannot read api token file %s: %s; TCP mutations off", path, exc)
        return None
    return token or None


AUTH = web.AppKey("auth", ApiAuth)


def peer_credentials(request: web.Request) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of a Unix-socket peer; None on TCP."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def _peer_in_group(pid: int, uid: int, gid: int, group: str) -> bool:
    try:
        g = grp.getgrnam(group)
    except KeyError:
        return False
    if gid == g.gr_gid:
        return True
    with contextlib.suppress(KeyError):
        if pwd.getpwuid(uid).pw_name in g.gr_mem:
            return True
    # supplementary groups of the peer process itself
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Groups:"):
                    return str(g.gr_gid) in line.split()[1:]
    return False


def authorise_mutation(request: web.Request) -> None:
    auth = request.app[AUTH]
    creds = peer_credentials(request)
    if creds is None:
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        if not auth.token:
            raise ApiError(403, "mutating calls over TCP need api.token_file configured")
        if not hmac.compare_digest(given.encode(), auth.token.encode()):
            raise ApiError(401, "missing or wrong bearer token")
        return
    pid, uid, gid = creds
    if uid in (0, os.geteuid()):
        return
    if auth.group and _peer_in_group(pid, uid, gid, auth.group):
        return
    who = f"uid {uid}"
    raise ApiError(
        403,
        f"{who} may not change the daemon: only root"
        + (f" or members of group {auth.group!r}" if auth.group else ""),
    )
