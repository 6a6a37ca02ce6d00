"""The local API: versioned JSON under /v1/, on a Unix socket and optionally loopback TCP.

The routes are here; the handlers in moptd.daemon.handlers, who may change the daemon in
moptd.daemon.auth, the HTTP plumbing (JSON errors, limits) in moptd.daemon.http. Every
error is JSON with a reason.
"""

from __future__ import annotations

from aiohttp import web

from moptd.daemon.auth import AUTH, ApiAuth, tcp_guard
from moptd.daemon.handlers import (
    DIAGNOSIS,
    MANAGED,
    REMEDIATOR,
    RUNTIME,
    STARTED,
    STORE,
    events,
    explain,
    finding,
    findings,
    health,
    reload_rules,
    remediations,
    rules,
    serving,
    serving_drain,
    serving_ready,
    serving_restart,
    snapshot,
    status,
)
from moptd.daemon.http import MAX_REQUEST_BYTES, capped_app, json_errors
from moptd.daemon.managed import ManagedProcess
from moptd.daemon.remediation import Remediator
from moptd.daemon.runtime import CollectorRuntime
from moptd.findings.service import Diagnosis
from moptd.store import SignalStore


def make_api_app(
    store: SignalStore,
    runtime: CollectorRuntime,
    started: float,
    diagnosis: Diagnosis | None = None,
    auth: ApiAuth | None = None,
    managed: ManagedProcess | None = None,
    remediator: Remediator | None = None,
) -> web.Application:
    app = capped_app(client_max_size=MAX_REQUEST_BYTES, middlewares=[json_errors, tcp_guard])
    app[STORE] = store
    app[RUNTIME] = runtime
    app[STARTED] = started
    app[AUTH] = auth or ApiAuth()
    if managed is not None:
        app[MANAGED] = managed
    if remediator is not None:
        app[REMEDIATOR] = remediator
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
    app.router.add_get("/v1/explain", explain)
    app.router.add_get("/v1/rules", rules)
    app.router.add_post("/v1/rules/reload", reload_rules)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/v1/serving", serving)
    app.router.add_post("/v1/serving/{name}/restart", serving_restart)
    app.router.add_get("/v1/serving/{name}/ready", serving_ready)
    app.router.add_post("/v1/serving/{name}/drain", serving_drain)
    app.router.add_delete("/v1/serving/{name}/drain", serving_drain)
    app.router.add_get("/v1/remediations", remediations)
    return app
