"""The local API: versioned JSON under /v1/, on a Unix socket and optionally loopback TCP.

Reads are open to whoever can reach the socket (its mode and group decide). Mutating calls
(rule reload) are allowed on the Unix socket only to peers that are root, the daemon's own
user or members of the configured group, read from the socket's peer credentials; on TCP
only with the bearer token from the token file. Every error is JSON with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import grp
import hmac
import json
import logging
import os
import pwd
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from moptd.daemon.managed import ManagedProcess
from moptd.daemon.runtime import CollectorRuntime
from moptd.daemon.views import rules_view, snapshot_view, status_view
from moptd.diagnose.codes import CODES, SEVERITIES
from moptd.durations import parse_duration
from moptd.findings import db as fdb
from moptd.findings.service import Diagnosis
from moptd.store import SignalStore

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
MAX_LIMIT = 10000
SSE_HEARTBEAT = 15.0
# aiohttp keeps a connection that has not sent a complete request for an hour, and caps
# neither connections nor body reads: a thousand slow or silent clients took the daemon's
# file descriptors (soft limit 1024 under systemd), and with them /metrics, the API and the
# collectors' own file reads. So: a connection without a complete request (a new one, or
# an idle kept-alive one) is closed after IDLE_TIMEOUT; a request body must arrive within
# it; and one listener holds at most MAX_CONNECTIONS (see ConnectionCap).
IDLE_TIMEOUT = 10.0
MAX_CONNECTIONS = 256


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


RUNTIME = web.AppKey("runtime", CollectorRuntime)
STORE = web.AppKey("store", SignalStore)
STARTED = web.AppKey("started", float)
DIAGNOSIS = web.AppKey("diagnosis", Diagnosis)
AUTH = web.AppKey("auth", ApiAuth)
MANAGED = web.AppKey("managed", ManagedProcess)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, reason: str, **extra: Any) -> web.Response:
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
        return _error(exc.status, exc.reason, **exc.extra)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else exc.reason
        resp = _error(exc.status, reason)
        if exc.status == 405:
            resp.headers["Allow"] = exc.headers.get("Allow", "")
        return resp
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("API %s %s failed", request.method, request.path)
        return _error(500, "internal error (logged by the daemon)")


# --- authorisation ---


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


# --- query parameters ---


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


def _query(request: web.Request, allowed: set[str]) -> dict[str, str]:
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


def _limit(q: dict[str, str], default: int) -> int:
    if "limit" not in q:
        return default
    try:
        n = int(q["limit"])
    except ValueError:
        raise ApiError(400, f"limit: not an integer: {q['limit']!r}") from None
    if not 1 <= n <= MAX_LIMIT:
        raise ApiError(400, f"limit: must be 1..{MAX_LIMIT}")
    return n


def _diagnosis(request: web.Request) -> Diagnosis:
    d = request.app.get(DIAGNOSIS)
    if d is None:
        raise ApiError(503, "the diagnosis is not running in this daemon")
    return d


async def _db(request: web.Request, fn: Callable[[Any], Any]) -> Any:
    return await asyncio.wrap_future(_diagnosis(request).db.submit(fn))


def _distinct_subjects(c: Any) -> list[str]:
    return [r[0] for r in c.execute("SELECT DISTINCT subject FROM findings")]


# --- handlers ---


async def health(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    d = request.app.get(DIAGNOSIS)
    collectors = {n: h.as_dict() for n, h in runtime.health.items()}
    store: dict[str, Any] | None = None
    status = "ok"
    if d is not None:
        store = d.db.health.as_dict()
        if store["state"] == "failing":
            status = "degraded"
    body: dict[str, Any] = {
        "status": status,
        "started_at": request.app[STARTED],
        "uptime_seconds": time.time() - request.app[STARTED],
        "collectors": collectors,
        "findings_store": store,
        "diagnosis": None if d is None else {"ticks": d.ticks, "rules": len(d.rules.ruleset.rules)},
    }
    return web.json_response(body)


async def status(request: web.Request) -> web.Response:
    _query(request, set())
    runtime = request.app[RUNTIME]
    view = status_view(request.app[STORE], runtime.health.values(), request.app[STARTED])
    d = request.app.get(DIAGNOSIS)
    view["findings"] = d.active() if d is not None else None
    view["findings_store"] = d.db.health.as_dict() if d is not None else None
    return web.json_response(view, dumps=_dumps)


async def snapshot(request: web.Request) -> web.Response:
    q = _query(request, {"subject"})
    store = request.app[STORE]
    subject = q.get("subject")
    if subject is not None and subject not in store.subjects():
        raise ApiError(404, f"unknown subject {subject!r}", valid=store.subjects())
    return web.json_response(snapshot_view(store, subject), dumps=_dumps)


async def findings(request: web.Request) -> web.Response:
    q = _query(request, {"subject", "code", "severity", "since", "state", "limit"})
    d = _diagnosis(request)
    if "code" in q and q["code"] not in CODES:
        raise ApiError(404, f"unknown code {q['code']!r}", valid=sorted(CODES))
    if "severity" in q and q["severity"] not in SEVERITIES:
        raise ApiError(400, f"severity: one of {', '.join(SEVERITIES)}")
    if "state" in q and q["state"] not in ("pending", "firing", "resolved"):
        raise ApiError(400, "state: one of pending, firing, resolved")
    since = None
    if "since" in q:
        try:
            since = parse_since(q["since"], time.time())
        except ValueError as exc:
            raise ApiError(400, f"since: {exc}") from None
    if "subject" in q:
        known = set(request.app[STORE].subjects()) | set(await _db(request, _distinct_subjects))
        if q["subject"] not in known:
            raise ApiError(404, f"unknown subject {q['subject']!r}", valid=sorted(known))
    filters: dict[str, Any] = {k: q[k] for k in ("subject", "code", "severity", "state") if k in q}
    limit = _limit(q, 500)
    history = await _db(
        request, lambda c: fdb.query_findings(c, since=since, limit=limit, **filters)
    )

    def keep(f: dict[str, Any]) -> bool:
        if any(f.get(k) != v for k, v in filters.items() if k != "state"):
            return False
        if filters.get("state") not in (None, "firing"):
            return False
        return since is None or float(f.get("last_seen") or 0) >= since

    active = [f for f in d.active() if keep(f)]
    ids = {(f["rule"], f["subject"]): f["id"] for f in history if f.get("state") == "firing"}
    for f in active:
        if (f["rule"], f["subject"]) in ids:
            f["id"] = ids[(f["rule"], f["subject"])]
    return web.json_response({"active": active, "history": history}, dumps=_dumps)


async def finding(request: web.Request) -> web.Response:
    _query(request, set())
    raw = request.match_info["id"]
    try:
        fid = int(raw)
    except ValueError:
        raise ApiError(400, f"finding id: not an integer: {raw!r}") from None
    if not 0 < fid < 2**62:
        raise ApiError(404, f"no finding {raw}")
    f = await _db(request, lambda c: fdb.get_finding(c, fid))
    if f is None:
        raise ApiError(404, f"no finding {fid}")
    d = _diagnosis(request)
    live = next(
        (
            a
            for a in d.active()
            if a["rule"] == f["rule"]
            and a["subject"] == f["subject"]
            and f.get("state") == "firing"
        ),
        None,
    )
    if live is not None:
        for key in ("evidence", "path", "steps", "actions", "last_seen", "summary"):
            f[key] = live.get(key, f.get(key))
    start = float(f.get("pending_since") or f.get("first_seen") or 0) - 300.0
    end = f.get("resolved_at")
    subject = str(f["subject"])

    def related_and_events(c: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        events = [
            e
            for e in fdb.query_events(c, since=start, subject=subject, limit=200)
            if end is None or e["t"] <= float(end)
        ]
        rel = [
            r
            for r in fdb.query_findings(c, since=start, limit=200)
            if r["id"] != fid
            and (
                r["subject"] == subject
                or (f.get("pci_bus_id") and r.get("pci_bus_id") == f.get("pci_bus_id"))
            )
        ]
        return rel, events

    related, events = await _db(request, related_and_events)
    f["related"] = [
        {k: r.get(k) for k in ("id", "code", "subject", "severity", "state", "summary")}
        for r in related
    ]
    f["events"] = events
    return web.json_response(f, dumps=_dumps)


async def rules(request: web.Request) -> web.Response:
    _query(request, set())
    d = _diagnosis(request)
    return web.json_response(rules_view(d.rules), dumps=_dumps)


async def reload_rules(request: web.Request) -> web.Response:
    authorise_mutation(request)
    d = _diagnosis(request)
    body = await _read_body(request)
    if body.strip() not in (b"", b"{}"):
        raise ApiError(400, "reload takes no request body")
    errors = await d.reload()
    result = {"reloaded": not errors, "errors": errors, "rules": len(d.rules.ruleset.rules)}
    return web.json_response(result, status=422 if errors else 200)


def _supervisor(request: web.Request, name: str | None = None) -> Any:
    """The managed serving process's supervisor (the daemon owns it)."""
    managed = request.app.get(MANAGED)
    sup = managed.supervisor if managed is not None else None
    if sup is None:
        raise ApiError(404, "no managed serving process is configured (collectors.serving.managed)")
    if name is not None and name != sup.spec.name:
        raise ApiError(404, f"unknown serving process {name!r}", valid=[sup.spec.name])
    return sup


async def serving(request: web.Request) -> web.Response:
    """The managed serving process: its supervisor state and the tail of its log."""
    q = _query(request, {"lines"})
    lines = _limit({"limit": q.get("lines", "50")}, 50)
    sup = _supervisor(request)
    body = {
        "managed": sup.status(),
        "log": [{"t": t, "line": line} for t, line in sup.ring.tail(lines)],
    }
    return web.json_response(body, dumps=_dumps)


async def serving_restart(request: web.Request) -> web.Response:
    authorise_mutation(request)
    sup = _supervisor(request, request.match_info["name"])
    if (await _read_body(request)).strip() not in (b"", b"{}"):
        raise ApiError(400, "restart takes no request body")
    await sup.restart()
    return web.json_response({"restarted": sup.spec.name, "managed": sup.status()}, dumps=_dumps)


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: one `transition` event per finding state change."""
    _query(request, set())
    d = _diagnosis(request)
    q = d.subscribe()
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    try:
        await resp.prepare(request)
        await resp.write(b": moptd finding transitions\n\n")
        while d.subscribed(q):
            try:
                async with asyncio.timeout(SSE_HEARTBEAT):
                    rec = await q.get()
            except TimeoutError:
                await resp.write(b": keep-alive\n\n")
                continue
            if not rec:
                break  # the daemon is shutting down
            data = _dumps(rec)
            await resp.write(f"event: transition\ndata: {data}\n\n".encode())
    except ConnectionResetError:
        pass  # the reader went away
    finally:
        d.unsubscribe(q)
    return resp


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)


async def _read_body(request: web.Request) -> bytes:
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
        conns = self.server.connections
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
                    held, self.evicted, self.refused,
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
        self._accepting.add(handler)
        asyncio.get_running_loop().call_soon(self._accepting.discard, handler)
        return handler

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        proto = request.protocol
        self._busy[proto] = self._busy.get(proto, 0) + 1
        try:
            return await handler(request)
        finally:
            if self._busy[proto] <= 1:
                del self._busy[proto]
            else:
                self._busy[proto] -= 1


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
    ) -> None:
        super().__init__(runner)
        self._cap, self._path, self._host, self._port = cap, path, host, port

    @property
    def name(self) -> str:
        return f"unix:{self._path}:" if self._path else f"http://{self._host}:{self._port}"

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
                self._cap, self._host, self._port, backlog=self._backlog, reuse_address=True
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


HTTP_LOG = logging.getLogger("moptd.daemon.http")
HTTP_LOG.addFilter(_ClientProtocolErrors())


def capped_app(**kwargs: Any) -> web.Application:
    """A web.Application whose ConnectionCap (app[CAP]) tracks its handlers."""
    cap = ConnectionCap()
    middlewares = [*kwargs.pop("middlewares", ()), cap.track]
    app = web.Application(middlewares=middlewares, **kwargs)
    app[CAP] = cap
    return app


def make_runner(app: web.Application) -> web.AppRunner:
    return web.AppRunner(
        app, access_log=None, keepalive_timeout=IDLE_TIMEOUT, logger=HTTP_LOG
    )


def make_api_app(
    store: SignalStore,
    runtime: CollectorRuntime,
    started: float,
    diagnosis: Diagnosis | None = None,
    auth: ApiAuth | None = None,
    managed: ManagedProcess | None = None,
) -> web.Application:
    app = capped_app(client_max_size=MAX_REQUEST_BYTES, middlewares=[json_errors])
    app[STORE] = store
    app[RUNTIME] = runtime
    app[STARTED] = started
    app[AUTH] = auth or ApiAuth()
    if managed is not None:
        app[MANAGED] = managed
    if diagnosis is not None:
        app[DIAGNOSIS] = diagnosis

        async def close_streams(_app: web.Application) -> None:
            diagnosis.close_subscribers()

        app.on_shutdown.append(close_streams)
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/snapshot", snapshot)
    app.router.add_get("/v1/findings", findings)
    app.router.add_get("/v1/findings/{id}", finding)
    app.router.add_get("/v1/rules", rules)
    app.router.add_post("/v1/rules/reload", reload_rules)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/serving", serving)
    app.router.add_post("/v1/serving/{name}/restart", serving_restart)
    return app
