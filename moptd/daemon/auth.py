"""Who may read and change the daemon through the API.

On the Unix socket, reads are open to whoever can reach the socket (its mode and group
decide) and mutating calls (rule reload, serving restart) to peers that are root, the
daemon's own user or members of the configured group, read from the socket's peer
credentials. A loopback TCP port has no such gate (every local user reaches it), so on TCP
every request, reads too, needs the bearer token from the token file, and its Host and
Origin headers must name a loopback address (a web page's DNS-rebinding cannot send one).
Failed tokens are logged and, past FAILED_TOKEN_BURST a minute from one source, answered 429.

The throttle must not be a weapon. Every local user is 127.0.0.1 on loopback, so a throttle
that refused a *source* would let any unprivileged user lock root out with four wrong
guesses a minute. So: a correct token always passes, throttled or not (the comparison is
constant-time and costs no more than the refusal); only wrong ones count and are refused.
And because a local user can send from any of 127.0.0.0/8 (and ::1, ::ffff:127.x), all of
loopback is one source: rotating addresses does not buy more guesses. What a wrong guess
costs the daemon is bounded: one comparison, a log line a minute per source, and at most
MAX_SOURCES sources remembered.
"""

from __future__ import annotations

import contextlib
import grp
import hmac
import ipaddress
import logging
import os
import pwd
import socket
import stat
import struct
import time
from dataclasses import dataclass, field

from aiohttp import web

from moptd.daemon.http import ApiError, Handler

log = logging.getLogger(__name__)


FAILED_TOKEN_BURST = 5  # wrong tokens from one source in FAILED_TOKEN_WINDOW, then 429
FAILED_TOKEN_WINDOW = 60.0
MAX_SOURCES = 4096  # sources remembered, whatever the number of addresses
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


@dataclass(slots=True)
class FailedTokens:
    """Wrong-token attempts per source (throttle_key), in fixed one-minute windows."""

    windows: dict[str, tuple[float, int]] = field(default_factory=dict)
    logged: dict[str, float] = field(default_factory=dict)

    def blocked(self, peer: str, now: float) -> bool:
        start, count = self.windows.get(peer, (now, 0))
        return now - start < FAILED_TOKEN_WINDOW and count >= FAILED_TOKEN_BURST

    def record(self, peer: str, now: float) -> int:
        start, count = self.windows.get(peer, (now, 0))
        if now - start >= FAILED_TOKEN_WINDOW:
            start, count = now, 0
        self.windows[peer] = (start, count + 1)
        if len(self.windows) > MAX_SOURCES:
            oldest = min(self.windows, key=lambda k: self.windows[k][0])
            del self.windows[oldest]
        return count + 1

    def should_log(self, peer: str, now: float) -> bool:
        if now - self.logged.get(peer, float("-inf")) < FAILED_TOKEN_WINDOW:
            return False
        self.logged[peer] = now
        if len(self.logged) > MAX_SOURCES:
            self.logged.pop(next(iter(self.logged)))
        return True


def throttle_key(remote: str | None) -> str:
    """The source a wrong token is charged to: all of loopback is one (any local user can
    bind 127.0.0.2..127.255.255.254 or ::1), an IPv6 peer its /64 (one host's usual share),
    any other address itself."""
    if not remote:
        return "?"
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return remote
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass(slots=True)
class ApiAuth:
    group: str | None = None  # may call mutating endpoints on the Unix socket
    # required for every request on TCP; replaced when SIGHUP reads the token file again
    token: str | None = None
    failed: FailedTokens = field(default_factory=FailedTokens, compare=False)


def load_token(path: os.PathLike[str] | str | None) -> str | None:
    """The TCP API's bearer token; a file others can read is refused (logged)."""
    if path is None:
        return None
    try:
        # the mode is checked on the file that was opened, not on the name (no race);
        # O_NONBLOCK: a FIFO swapped in after the config check must not hang start-up
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, encoding="utf-8") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if not stat.S_ISREG(mode):
                log.error("api token file %s is not a regular file; TCP API refused", path)
                return None
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


def _host_name(value: str) -> str:
    """The host part of a Host header or an Origin's authority, lower-cased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _bearer(header: str) -> str:
    scheme, _, credentials = header.strip().partition(" ")
    # RFC 9110 11.1: the scheme is case-insensitive ("bearer", "BEARER")
    return credentials.strip() if scheme.lower() == "bearer" else ""


def check_tcp_request(request: web.Request) -> None:
    """Raise ApiError unless a TCP request names a loopback Host, comes from no foreign
    Origin and carries the token. Unix-socket requests pass untouched."""
    if peer_credentials(request) is not None:
        return
    auth = request.app[AUTH]
    host = _host_name(request.headers.get("Host", ""))
    if host not in LOOPBACK_HOSTS:
        raise ApiError(403, f"Host {host!r} is not a loopback name; the TCP API answers only those")
    origin = request.headers.get("Origin")
    if origin is not None:
        authority = origin.partition("://")[2] if "://" in origin else origin
        if _host_name(authority) not in LOOPBACK_HOSTS:
            raise ApiError(403, f"Origin {origin!r} is not this host; cross-site calls refused")
    if not auth.token:
        raise ApiError(
            403,
            "the TCP API needs api.token_file (every local user can reach a loopback port); "
            "use the Unix socket, or configure a token",
        )
    given = _bearer(request.headers.get("Authorization", ""))
    if not given:
        raise ApiError(401, "missing bearer token (Authorization: Bearer <api.token_file>)")
    # compared first: a correct token passes whatever others sent from the same source
    if hmac.compare_digest(given.encode(), auth.token.encode()):
        return
    peer = request.remote or "?"
    key = throttle_key(request.remote)
    now = time.monotonic()
    if auth.failed.blocked(key, now):
        raise ApiError(
            429, f"too many wrong tokens from {key}; try again in a minute", retry_after=60
        )
    # a guess, unlike a missing header: counted, logged once a minute, then refused
    count = auth.failed.record(key, now)
    if auth.failed.should_log(key, now):
        log.warning(
            "TCP API: wrong token from %s (source %s: %d in this minute; after %d, 429 "
            "for a minute; the right token still passes)",
            peer,
            key,
            count,
            FAILED_TOKEN_BURST,
        )
    raise ApiError(401, "wrong bearer token")


@web.middleware
async def tcp_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    check_tcp_request(request)
    return await handler(request)


def authorise_mutation(request: web.Request) -> None:
    creds = peer_credentials(request)
    if creds is None:
        check_tcp_request(request)  # the middleware did so already; kept for direct callers
        return
    auth = request.app[AUTH]
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
