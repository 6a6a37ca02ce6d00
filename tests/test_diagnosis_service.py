"""The diagnosis loop in-process: rules over a real store, transitions into a real SQLite
file, served by the real API app on a real Unix socket; rule reload, restart and SSE."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NamedTuple

import aiohttp
from aiohttp import web

from moptd.clock import VirtualClock
from moptd.daemon.api import make_api_app
from moptd.daemon.runtime import CollectorRuntime
from moptd.findings.db import FindingsDB
from moptd.findings.service import Diagnosis, build_diagnosis
from moptd.observations import Batch
from moptd.store import SignalStore

RULE = """
schema: moptd.rules/v1
rules:
  - id: test-swappiness
    title: Swappiness high (test rule)
    layer: host
    scope: node
    status: stable
    for: 10s
    keep_firing_for: 0s
    evidence:
      swappiness: node.swappiness
    decide:
      - id: high
        if: node.swappiness > 10
        verdict:
          code: SWAP_ACTIVE
          summary: "swappiness is {{swappiness}}"
          actions:
            - {kind: change_config, command: "sysctl -w vm.swappiness=1"}
          runbook: https://docs.kernel.org/admin-guide/sysctl/vm.html
"""


def make(tmp: Path, clock: VirtualClock, store: SignalStore) -> Diagnosis:
    rules = tmp / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "test.rules.yaml").write_text(RULE)
    return build_diagnosis(store, tmp / "state", [rules], clock=clock)


def swappiness(store: SignalStore, value: float, t: float) -> None:
    b = Batch()
    b.add("node.swappiness", "node", value)
    store.ingest("host", b, t)


async def serve(d: Diagnosis, store: SignalStore, sock: Path) -> web.AppRunner:
    runner = web.AppRunner(make_api_app(store, CollectorRuntime(store, {}), 0.0, d))
    await runner.setup()
    await web.UnixSite(runner, str(sock)).start()
    return runner


class Served(NamedTuple):
    clock: VirtualClock
    store: SignalStore
    d: Diagnosis
    session: aiohttp.ClientSession


@asynccontextmanager
async def served(tmp: Path) -> AsyncIterator[Served]:
    """The test rule's diagnosis at t=1000, started, behind the real API app on a Unix
    socket in tmp, and a client session to it; stopped on the way out."""
    clock = VirtualClock(1000.0)
    store = SignalStore(clock=clock)
    d = make(tmp, clock, store)
    await d.start()
    sock = tmp / "api.sock"
    runner = await serve(d, store, sock)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(sock))) as s:
            yield Served(clock, store, d, s)
    finally:
        await runner.cleanup()
        await d.stop()


async def test_pending_firing_resolved_are_stored_and_survive_a_restart(tmp_path):
    clock = VirtualClock(1000.0)
    store = SignalStore(clock=clock)
    d = make(tmp_path, clock, store)
    await d.start()
    try:
        swappiness(store, 60, 1000.0)
        assert [r["new"] for r in d.tick(1000.0)] == ["pending"]
        clock.set(1011.0)
        firing = d.tick(1011.0)
        assert [r["new"] for r in firing] == ["firing"]
        assert firing[0]["finding"]["steps"][0]["seen"][0]["value"] == 60
        assert store.latest("findings.store_ok", "node") == 1.0
    finally:
        await d.stop()
    # a new daemon on the same state dir resumes the firing finding, without a new pending
    store2 = SignalStore(clock=clock)
    d2 = make(tmp_path, clock, store2)
    await d2.start()
    try:
        assert [f.code for f in d2.rules.active()] == ["SWAP_ACTIVE"]
        swappiness(store2, 1, 1020.0)
        clock.set(1020.0)
        assert [r["new"] for r in d2.tick(1020.0)] == ["resolved"]
        await asyncio.wrap_future(d2.db.submit(lambda _c: None))
        (f,) = d2.db.history()
        full = d2.db.get(f["id"])
        assert full is not None
        assert [t["to"] for t in full["transitions"]] == ["pending", "firing", "resolved"]
        assert full["first_seen"] == 1011.0
    finally:
        await d2.stop()


async def test_reload_refuses_a_broken_set_and_records_dropped_findings(tmp_path):
    async with served(tmp_path) as (clock, store, d, s):
        events: list[dict] = []

        async def read_stream(session: aiohttp.ClientSession) -> None:
            async with session.get("http://x/v1/events") as resp:
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        events.append(json.loads(line[6:]))
                        if len(events) == 3:
                            return

        reader = asyncio.create_task(read_stream(s))
        await asyncio.sleep(0.1)
        swappiness(store, 60, 1000.0)
        d.tick(1000.0)
        clock.set(1011.0)
        d.tick(1011.0)
        rules_file = tmp_path / "rules" / "test.rules.yaml"
        rules_file.write_text(RULE.replace("if: node.swappiness > 10", "if: node.swappiness >"))
        async with s.post("http://x/v1/rules/reload") as resp:
            body = await resp.json()
            assert resp.status == 422
            assert body["reloaded"] is False
            assert "test.rules.yaml" in body["errors"][0]
        assert [f.code for f in d.rules.active()] == ["SWAP_ACTIVE"]  # old rules stay
        rules_file.write_text("schema: moptd.rules/v1\nrules: []\n")
        async with s.post("http://x/v1/rules/reload") as resp:
            assert resp.status == 200
            assert (await resp.json())["rules"] == 0
        await asyncio.wait_for(reader, 5)
        assert [e["new"] for e in events] == ["pending", "firing", "resolved"]
        async with s.get("http://x/v1/findings?state=resolved") as resp:
            body = await resp.json()
        assert [f["code"] for f in body["history"]] == ["SWAP_ACTIVE"]


async def test_a_failing_store_is_reported_and_the_loop_goes_on(tmp_path):
    clock = VirtualClock(1000.0)
    store = SignalStore(clock=clock)
    d = make(tmp_path, clock, store)
    d.db = FindingsDB(tmp_path / "no-such-dir" / "x" / "findings.db")
    (tmp_path / "no-such-dir").write_text("a file where a directory should be")
    await d.start()
    try:
        assert d.db.health.state == "failing"
        assert store.latest("findings.store_ok", "node") == 0.0
        swappiness(store, 60, 1000.0)
        assert [r["new"] for r in d.tick(1000.0)] == ["pending"]
        await asyncio.wrap_future(d.db.submit(lambda _c: None))
        assert [f["state"] for f in d.db.history()] == ["pending"]  # kept in memory
    finally:
        await d.stop()


async def _assembled(s: aiohttp.ClientSession, since: float | None) -> dict:
    """What `moptd explain` put together before /v1/explain, from 2 + N requests: the GPUs
    from /v1/status, the findings from /v1/findings, each one's detail from /v1/findings/ID."""
    async with s.get("http://x/v1/status") as resp:
        status = await resp.json()
    query = "" if since is None else f"?since={since!r}"
    async with s.get(f"http://x/v1/findings{query}") as resp:
        body = await resp.json()
    found = list(body["active"])
    if since is not None:
        live = {(f["rule"], f["subject"]) for f in found}
        found += [
            f
            for f in body["history"]
            if f.get("state") == "resolved" and (f["rule"], f["subject"]) not in live
        ]
    detailed = []
    for f in found:
        async with s.get(f"http://x/v1/findings/{f['id']}") as resp:
            full = await resp.json()
        detailed.append({**full, **{k: v for k, v in f.items() if k in ("steps", "evidence")}})
    return {"gpus": status["gpus"], "findings": detailed, "blind": status["blind"]}


async def test_explain_answers_in_one_request_what_took_two_plus_n(tmp_path):
    async with served(tmp_path) as (clock, store, d, s):

        async def explain(s: aiohttp.ClientSession, since: float | None) -> dict:
            await asyncio.wrap_future(d.db.submit(lambda _c: None))
            query = "" if since is None else f"?since={since!r}"
            async with s.get(f"http://x/v1/explain{query}") as resp:
                assert resp.status == 200
                one = await resp.json()
            assert one == await _assembled(s, since)
            return one

        # a finding that fires and resolves: shown with --since only
        swappiness(store, 60, 1000.0)
        d.tick(1000.0)
        clock.set(1011.0)
        d.tick(1011.0)
        swappiness(store, 1, 1020.0)
        clock.set(1020.0)
        assert [r["new"] for r in d.tick(1020.0)] == ["resolved"]
        assert (await explain(s, None))["findings"] == []
        (resolved,) = (await explain(s, 900.0))["findings"]
        assert [t["to"] for t in resolved["transitions"]] == ["pending", "firing", "resolved"]
        assert (await explain(s, 1500.0))["findings"] == []
        # it fires again: the firing one, live, with the first as related
        swappiness(store, 70, 1030.0)
        clock.set(1030.0)
        d.tick(1030.0)
        clock.set(1041.0)
        assert [r["new"] for r in d.tick(1041.0)] == ["firing"]
        for since in (None, 900.0):
            (firing,) = (await explain(s, since))["findings"]
            assert firing["state"] == "firing"
            assert firing["steps"][0]["seen"][0]["value"] == 70
            assert [r["id"] for r in firing["related"]] == [resolved["id"]]
        async with s.get("http://x/v1/explain?subject=node&code=SWAP_ACTIVE") as resp:
            assert len((await resp.json())["findings"]) == 1
        async with s.get("http://x/v1/explain?subject=gpu:7") as resp:
            assert (await resp.json())["findings"] == []
        async with s.get("http://x/v1/explain?code=NOPE") as resp:
            assert resp.status == 404
            assert "SWAP_ACTIVE" in (await resp.json())["valid"]
        async with s.get("http://x/v1/explain?since=soon") as resp:
            assert resp.status == 400
