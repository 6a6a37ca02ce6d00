"""HTTP plumbing shared by the API and the /metrics exporter: JSON errors, query and body
helpers, and the limits every listener holds (idle timeout, connection cap).

aiohttp keeps a connection that has not sent a complete request for an hour, and caps
neither connections nor body reads: a thousand slow or silent clients took the daemon's
file descriptors (soft limit 1024 under systemd), and with them /metrics, the API and the
collectors' own file reads. So: a connection without a complete request (a new one, or
an idle kept-alive one) is closed after IDLE_TIMEOUT; a request body must arrive within
it; each listener holds at most MAX_CONNECTIONS of its own (see ConnectionCap), so a crowd
on the TCP port never takes the Unix socket's room; and one peer (a uid on the socket, an
address on TCP) has at most MAX_PEER_BUSY requests in handlers at once (event streams),
root excepted, so one user cannot hold every slot that eviction cannot free.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from ssl import SSLContext
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from moptd.durations import parse_duration

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
MAX_LIMIT = 10000
IDLE_TIMEOUT = 10.0
MAX_CONNECTIONS = 256
MAX_PEER_BUSY = MAX_CONNECTIONS // 4

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, reason: str, **extra: Any) -> web.Response:
    return web.json_response({"error": reason, "status": status, **extra}, status=status)


class ApiError(Exception):
    def __init__(self, status: int, reason: str, **extra: Any) -> None:
        super().__init__(reason)
        self.status, self.reason, self.extra = status, reason, extra


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.reason, **exc.extra)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else exc.reason
        resp = error_response(exc.status, reason)
        if exc.status == 405:
            resp.headers["Allow"] = exc.headers.get("Allow", "")
        return resp
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("API %s %s failed", request.method, request.path)
        return error_response(500, "internal error (logged by the daemon)")


# --- query parameters and bodies ---


def parse_since(text: str, now: float) -> float:
    """Unix seconds, an RFC 3339 time, or a duration back from now (10m, 1h)."""
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"not a time: {text!r}")
        return value
    with contextlib.suppress(ValueError):
        return now - parse_duration(text)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (Unix seconds, RFC 3339, or a duration like 1h)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def query_params(request: web.Request, allowed: set[str]) -> dict[str, str]:
    q = request.rel_url.query
    for key in q:
        if key not in allowed:
            raise ApiError(400, f"unknown parameter {key!r} (known: {', '.join(sorted(allowed))})")
    out = {}
    for key in q:
        values = q.getall(key)
        if len(values) > 1:
            raise ApiError(400, f"parameter {key!r} given more than once")
        out[key] = values[0]
    return out


def limit_param(q: dict[str, str], default: int) -> int:
    if "limit" not in q:
        return default
    try:
        n = int(q["limit"])
    except ValueError:
        raise ApiError(400, f"limit: not an integer: {q['limit']!r}") from None
    if not 1 <= n <= MAX_LIMIT:
        raise ApiError(400, f"limit: must be 1..{MAX_LIMIT}")
    return n


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)


async def read_body(request: web.Request) -> bytes:
    """The request body, within IDLE_TIMEOUT: a client trickling it must not hold a
    handler forever, and one that hangs up halfway is its own business, not a daemon
    error with a traceback."""
    try:
        async with asyncio.timeout(IDLE_TIMEOUT):
            return await request.read()
    except TimeoutError:
        raise ApiError(408, f"request body not received within {IDLE_TIMEOUT:g} s") from None
    except ConnectionResetError:
        raise ApiError(400, "the client hung up before sending the whole body") from None


# --- connection limits ---

_REFUSAL_BODY = b'{"error": "too many connections to moptd", "status": 503}\n'
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSAL_BODY), _REFUSAL_BODY)
)


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_REFUSAL)
        transport.close()


class ConnectionCap:
    """The protocol factory of one aiohttp server's listeners, holding it to `limit`
    connections. A connection past the cap closes the oldest one that is not inside a
    request handler (idle, slowly sending its request, or not reading its response), so
    slow clients cannot starve a well-behaved one; only when every connection is inside a
    handler (event streams) is the new one answered 503. `track` is the middleware that
    tells the cap which connections are inside a handler."""

    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        self.limit = limit
        self.server: web.Server | None = None  # set once the runner is set up
        self.evicted = 0
        self.refused = 0
        self._busy: dict[object, int] = {}
        self._peer_busy: dict[object, int] = {}
        self._mine: set[object] = set()  # the connections this listener made
        self._closing: set[object] = set()
        # Made here but not yet among the server's connections: asyncio calls this factory
        # for a whole burst of accepted connections before any of them is connected, so
        # these count too. Each leaves the set in the loop's next pass, just before its
        # connection_made (scheduled after it): a connection that came and went stays
        # counted no longer than that, however many a second a client opens.
        self._accepting: set[object] = set()
        self._warned = float("-inf")

    def __call__(self) -> asyncio.BaseProtocol:
        assert self.server is not None, "ConnectionCap.server is set after runner.setup()"
        # One server serves every listener of the runner; this cap counts its own.
        self._mine &= set(self.server.connections) | self._accepting
        conns = [h for h in self.server.connections if h in self._mine]
        live = set(conns)
        now = time.monotonic()
        self._closing &= live
        held = len(conns) - len(self._closing) + len(self._accepting)
        if held >= self.limit:
            if now - self._warned >= 60.0:
                self._warned = now
                log.warning(
                    "%d connections to one listener (the cap): closing the oldest idle ones "
                    "(%d so far), refusing new ones when none is idle (%d so far)",
                    held,
                    self.evicted,
                    self.refused,
                )
            idle = (h for h in conns if h not in self._busy and h not in self._closing)
            victim = next(idle, None)
            if victim is None:
                self.refused += 1
                return _Refuse()
            self._closing.add(victim)
            self.evicted += 1
            victim.force_close()
        handler = self.server()
        self._mine.add(handler)
        self._accepting.add(handler)
        asyncio.get_running_loop().call_soon(self._accepting.discard, handler)
        return handler

    def for_listener(self) -> ConnectionCap:
        """A cap of its own for another listener of the same app, sharing what `track`
        knows about which connections are inside a handler."""
        other = ConnectionCap(self.limit)
        other._busy = self._busy
        other._peer_busy = self._peer_busy
        return other

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        proto = request.protocol
        peer = peer_key(request)
        if peer != ("uid", 0) and self._peer_busy.get(peer, 0) >= MAX_PEER_BUSY:
            return error_response(
                503, f"{MAX_PEER_BUSY} requests from this peer are already in progress"
            )
        self._busy[proto] = self._busy.get(proto, 0) + 1
        self._peer_busy[peer] = self._peer_busy.get(peer, 0) + 1
        try:
            return await handler(request)
        finally:
            _decrement(self._busy, proto)
            _decrement(self._peer_busy, peer)


def _decrement(counts: dict[object, int], key: object) -> None:
    if counts[key] <= 1:
        del counts[key]
    else:
        counts[key] -= 1


def peer_key(request: web.Request) -> tuple[str, object]:
    """("uid", n) for a Unix-socket peer (SO_PEERCRED), ("ip", address) on TCP."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None and sock.family == socket.AF_UNIX:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return ("uid", struct.unpack("3i", raw)[1])
    return ("ip", request.remote)


class CappedSite(web.BaseSite):
    """A listener (TCP or Unix socket) whose connections go through the runner's
    ConnectionCap instead of straight to its server."""

    def __init__(
        self,
        runner: web.BaseRunner,
        cap: ConnectionCap,
        *,
        path: str | None = None,
        host: str | None = None,
        port: int | None = None,
        ssl: SSLContext | None = None,
    ) -> None:
        super().__init__(runner)
        self._cap, self._path, self._host, self._port = cap, path, host, port
        self._tls = ssl

    @property
    def name(self) -> str:
        scheme = "https" if self._tls else "http"
        return f"unix:{self._path}:" if self._path else f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        self._cap.server = self._runner.server
        loop = asyncio.get_running_loop()
        if self._path is not None:
            self._server = await loop.create_unix_server(
                self._cap, self._path, backlog=self._backlog
            )
        else:
            assert self._port is not None, "a TCP site needs a port"
            self._server = await loop.create_server(
                self._cap,
                self._host,
                self._port,
                backlog=self._backlog,
                reuse_address=True,
                ssl=self._tls,
            )


CAP = web.AppKey("connection_cap", ConnectionCap)


class _ClientProtocolErrors(logging.Filter):
    """aiohttp logs a traceback at ERROR for every malformed request (oversized line or
    headers, bad chunking, garbage bytes), so any client could fill the journal. The client
    got its 400 and the daemon is fine: one line at debug level is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            log.debug("malformed HTTP request refused: %s", str(exc).splitlines()[0])
            return False
        return True


# aiohttp's own server log: this module's logger, with malformed requests filtered out
HTTP_LOG = log
HTTP_LOG.addFilter(_ClientProtocolErrors())


def capped_app(**kwargs: Any) -> web.Application:
    """A web.Application whose ConnectionCap (app[CAP]) tracks its handlers."""
    cap = ConnectionCap()
    middlewares = [*kwargs.pop("middlewares", ()), cap.track]
    app = web.Application(middlewares=middlewares, **kwargs)
    app[CAP] = cap
    return app


def make_runner(app: web.Application) -> web.AppRunner:
    return web.AppRunner(app, access_log=None, keepalive_timeout=IDLE_TIMEOUT, logger=HTTP_LOG)
