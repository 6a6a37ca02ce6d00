"""The local API on a Unix socket: versioned JSON under /v1/."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from moptd.daemon.runtime import CollectorRuntime
from moptd.daemon.views import status_view
from moptd.store import SignalStore

RUNTIME = web.AppKey("runtime", CollectorRuntime)
STORE = web.AppKey("store", SignalStore)
STARTED = web.AppKey("started", float)


async def health(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    body: dict[str, Any] = {
        "status": "ok",
        "started_at": request.app[STARTED],
        "uptime_seconds": time.time() - request.app[STARTED],
        "collectors": {n: h.as_dict() for n, h in runtime.health.items()},
    }
    return web.json_response(body)


async def status(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    view = status_view(request.app[STORE], runtime.health.values(), request.app[STARTED])
    return web.json_response(view)


def make_api_app(store: SignalStore, runtime: CollectorRuntime, started: float) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[STORE] = store
    app[RUNTIME] = runtime
    app[STARTED] = started
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/status", status)
    return app
