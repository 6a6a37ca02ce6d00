"""The API's handlers: each checks its parameters and asks the daemon's parts for the
answer (findings through moptd.findings.queries, which owns every query)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from aiohttp import web

from moptd.daemon.auth import authorise_mutation
from moptd.daemon.health import blind_sources
from moptd.daemon.http import (
    ApiError,
    limit_param,
    parse_since,
    query_params,
    read_body,
)
from moptd.daemon.managed import ManagedProcess
from moptd.daemon.remediation import Remediator
from moptd.daemon.runtime import CollectorRuntime
from moptd.daemon.views import (
    gpus_view,
    rules_view,
    snapshot_value,
    snapshot_view,
    status_view,
)
from moptd.diagnose.codes import CODES, SEVERITIES
from moptd.findings import queries
from moptd.findings.service import Diagnosis
from moptd.store import SignalStore

SSE_HEARTBEAT = 15.0


def dumps(obj: Any) -> str:
    """Strict JSON (RFC 8259): Python's json writes NaN and Infinity bare, which no strict
    parser reads. A non-finite number left in an answer (an evidence value, say) becomes
    the string snapshot_value gives it; the views already turn the ones they know."""
    try:
        return json.dumps(obj, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), default=str, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else snapshot_value(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


RUNTIME = web.AppKey("runtime", CollectorRuntime)
STORE = web.AppKey("store", SignalStore)
STARTED = web.AppKey("started", float)
DIAGNOSIS = web.AppKey("diagnosis", Diagnosis)
MANAGED = web.AppKey("managed", ManagedProcess)
REMEDIATOR = web.AppKey("remediator", Remediator)


def _diagnosis(request: web.Request) -> Diagnosis:
    d = request.app.get(DIAGNOSIS)
    if d is None:
        raise ApiError(503, "the diagnosis is not running in this daemon")
    return d


def _code(q: dict[str, str]) -> str | None:
    if "code" in q and q["code"] not in CODES:
        raise ApiError(404, f"unknown code {q['code']!r}", valid=sorted(CODES))
    return q.get("code")


SINCE_FORMS = "Unix seconds, an RFC 3339 time, or a duration back from now such as 1h"


def _since(q: dict[str, str]) -> float | None:
    """The one parser of `since` for every endpoint that takes it (findings, explain,
    remediations): given, it must say a time; an empty `since=` is a mistake (a script's
    unset variable), not "no bound"."""
    if "since" not in q:
        return None
    if not q["since"].strip():
        raise ApiError(400, f"since: empty; give {SINCE_FORMS}, or leave it out")
    try:
        return parse_since(q["since"], time.time())
    except ValueError as exc:
        raise ApiError(400, f"since: {exc}") from None


async def health(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    d = request.app.get(DIAGNOSIS)
    collectors = {n: h.as_dict() for n, h in runtime.health.items()}
    store: dict[str, Any] | None = None
    diagnosis: dict[str, Any] | None = None
    # a source that cannot be read hides its evidence: no finding then is no all-clear
    blind = blind_sources(collectors.values())
    status = "degraded" if blind else "ok"
    if d is not None:
        store = d.db.health.as_dict()
        failing = d.rules.failing()
        # A rule that raises diagnoses nothing: moptd is not whole (RULE_EVALUATION_FAILED).
        if store["state"] == "failing" or failing:
            status = "degraded"
        rules = len(d.rules.ruleset.rules)
        diagnosis = {
            "ticks": d.ticks,
            "rules": rules,
            "rules_failing": failing,
            # rules.tick_budget: the last evaluation ran out of time and left this many
            # (rule, subject) pairs for the next (they keep their last result meanwhile);
            # not "degraded": every rule still runs, in turn
            "tick_budget_seconds": d.rules.tick_budget,
            "last_tick_deferred": d.rules.last_deferred,
            "ticks_over_budget": d.rules.ticks_over_budget,
        }
    body: dict[str, Any] = {
        "status": status,
        "blind": blind,
        "started_at": request.app[STARTED],
        "uptime_seconds": time.time() - request.app[STARTED],
        "collectors": collectors,
        "findings_store": store,
        "diagnosis": diagnosis,
    }
    return web.json_response(body, dumps=dumps)


async def status(request: web.Request) -> web.Response:
    query_params(request, set())
    runtime = request.app[RUNTIME]
    view = status_view(request.app[STORE], runtime.health.values(), request.app[STARTED])
    d = request.app.get(DIAGNOSIS)
    view["findings"] = d.active() if d is not None else None
    view["findings_store"] = d.db.health.as_dict() if d is not None else None
    view["blind"] = blind_sources(h.as_dict() for h in runtime.health.values())
    return web.json_response(view, dumps=dumps)


async def snapshot(request: web.Request) -> web.Response:
    q = query_params(request, {"subject"})
    store = request.app[STORE]
    subject = q.get("subject")
    if subject is not None and subject not in store.subjects():
        raise ApiError(404, f"unknown subject {subject!r}", valid=store.subjects())
    return web.json_response(snapshot_view(store, subject), dumps=dumps)


async def findings(request: web.Request) -> web.Response:
    q = query_params(request, {"subject", "code", "severity", "since", "state", "limit"})
    d = _diagnosis(request)
    code = _code(q)
    if "severity" in q and q["severity"] not in SEVERITIES:
        raise ApiError(400, f"severity: one of {', '.join(SEVERITIES)}")
    if "state" in q and q["state"] not in ("pending", "firing", "resolved"):
        raise ApiError(400, "state: one of pending, firing, resolved")
    since = _since(q)
    if "subject" in q:
        known = set(request.app[STORE].subjects()) | set(await queries.recorded_subjects(d))
        if q["subject"] not in known:
            raise ApiError(404, f"unknown subject {q['subject']!r}", valid=sorted(known))
    body = await queries.findings(
        d,
        since=since,
        limit=limit_param(q, 500),
        subject=q.get("subject"),
        code=code,
        severity=q.get("severity"),
        state=q.get("state"),
    )
    return web.json_response(body, dumps=dumps)


async def finding(request: web.Request) -> web.Response:
    query_params(request, set())
    raw = request.match_info["id"]
    try:
        fid = int(raw)
    except ValueError:
        raise ApiError(400, f"finding id: not an integer: {raw!r}") from None
    if not 0 < fid < 2**62:
        raise ApiError(404, f"no finding {raw}")
    d = _diagnosis(request)
    f = await queries.finding(d, fid)
    if f is None:
        raise ApiError(404, f"no finding {fid}")
    return web.json_response(f, dumps=dumps)


async def explain(request: web.Request) -> web.Response:
    """Everything `moptd explain` shows, in one answer: the GPUs (to resolve the subject
    asked for) and each chosen finding in full."""
    q = query_params(request, {"subject", "code", "since"})
    d = _diagnosis(request)
    code = _code(q)
    since = _since(q)
    gpus = gpus_view(request.app[STORE])
    found = await queries.explain(d, gpus=gpus, subject=q.get("subject"), code=code, since=since)
    blind = blind_sources(h.as_dict() for h in request.app[RUNTIME].health.values())
    return web.json_response({"gpus": gpus, "findings": found, "blind": blind}, dumps=dumps)


async def rules(request: web.Request) -> web.Response:
    query_params(request, set())
    d = _diagnosis(request)
    return web.json_response(rules_view(d.rules), dumps=dumps)


async def reload_rules(request: web.Request) -> web.Response:
    authorise_mutation(request)
    d = _diagnosis(request)
    body = await read_body(request)
    if body.strip() not in (b"", b"{}"):
        raise ApiError(400, "reload takes no request body")
    errors = await d.reload()
    result = {"reloaded": not errors, "errors": errors, "rules": len(d.rules.ruleset.rules)}
    return web.json_response(result, status=422 if errors else 200, dumps=dumps)


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
    q = query_params(request, {"lines"})
    lines = limit_param({"limit": q.get("lines", "50")}, 50)
    sup = _supervisor(request)
    body = {
        "managed": sup.status(),
        "log": [{"t": t, "line": line} for t, line in sup.ring.tail(lines)],
    }
    return web.json_response(body, dumps=dumps)


async def serving_restart(request: web.Request) -> web.Response:
    authorise_mutation(request)
    sup = _supervisor(request, request.match_info["name"])
    if (await read_body(request)).strip() not in (b"", b"{}"):
        raise ApiError(400, "restart takes no request body")
    await sup.restart()
    remediator = request.app.get(REMEDIATOR)
    if remediator is not None:  # like the crash loop, an operator restart closes the breaker
        remediator.reset("an operator restarted the engine (POST /v1/serving/<name>/restart)")
    return web.json_response({"restarted": sup.spec.name, "managed": sup.status()}, dumps=dumps)


async def serving_drain(request: web.Request) -> web.Response:
    """An operator's drain of the managed engine: POST holds its readiness off (the
    balancer stops sending; requests in flight finish), DELETE lets it go. A remedy's own
    readiness hold is apart and never lifts this one."""
    authorise_mutation(request)
    _supervisor(request, request.match_info["name"])
    if (await read_body(request)).strip() not in (b"", b"{}"):
        raise ApiError(400, "drain takes no request body")
    managed = request.app[MANAGED]
    managed.drain(request.method == "POST")
    ready, reason = managed.ready()
    body = {"name": managed.spec.name, "drained": managed.drained, "ready": ready, "reason": reason}
    return web.json_response(body, dumps=dumps)


async def serving_ready(request: web.Request) -> web.Response:
    """The engine's readiness for a balancer: 200 while it runs and no remedy holds it
    off (remediation readiness_off), 503 otherwise; the body says why."""
    query_params(request, set())
    _supervisor(request, request.match_info["name"])
    managed = request.app[MANAGED]
    ready, reason = managed.ready()
    body = {"name": managed.spec.name, "ready": ready, "reason": reason}
    return web.json_response(body, status=200 if ready else 503, dumps=dumps)


async def remediations(request: web.Request) -> web.Response:
    """The remediation policy in force, the breaker, and the audit trail (newest first)."""
    q = query_params(request, {"since", "subject", "limit"})
    d = _diagnosis(request)
    since = _since(q)
    limit = limit_param(q, 500)
    rows = await queries.remediations(d, since, q.get("subject"), limit)
    remediator = request.app.get(REMEDIATOR)
    body: dict[str, Any] = remediator.view() if remediator is not None else {"policy": None}
    body["remediations"] = rows
    return web.json_response(body, dumps=dumps)


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: one `transition` event per finding state change."""
    query_params(request, set())
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
            data = dumps(rec)
            await resp.write(f"event: transition\ndata: {data}\n\n".encode())
    except ConnectionResetError:
        pass  # the reader went away
    finally:
        d.unsubscribe(q)
    return resp
