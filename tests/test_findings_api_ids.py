"""GET /v1/findings gives every firing finding its history id (issue 28).

A firing finding's transition is queued for the findings database on the same loop step
that makes it fire, so by the time any later query runs on the database thread it is
stored. The listing must read the live findings before it queues its query (else a tick
that lands while the query waits shows a firing finding whose row the query never saw),
and look their ids up whatever the history's filters keep (else `since` or `limit` drop
the row and with it the id)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from typing import Any

import aiohttp
import pytest

from moptd.findings import db as fdb
from tests.test_diagnosis_service import served, swappiness


async def _get(s: aiohttp.ClientSession, path: str) -> dict[str, Any]:
    async with s.get(f"http://x{path}") as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


def _ids_hold(body: dict[str, Any], stored: dict[int, str]) -> None:
    """Every active finding has the id of its stored, firing row."""
    for f in body["active"]:
        assert "id" in f, f"a firing finding without its id: {f}"
        assert stored.get(f["id"]) == "firing", (f, stored)


def _stored(d: Any) -> dict[int, str]:
    return {f["id"]: f["state"] for f in d.db.history()}


async def test_a_finding_that_fires_while_the_listing_queries_has_its_id(tmp_path, monkeypatch):
    entered, gate = threading.Event(), threading.Event()
    query = fdb.query_findings

    def held_query(c: sqlite3.Connection, **kw: Any) -> list[dict[str, Any]]:
        # on the database thread: the listing's query waits here until the tick is done
        entered.set()
        assert gate.wait(10), "the test never let the query go"
        return query(c, **kw)

    async with served(tmp_path) as (clock, store, d, s):
        try:
            swappiness(store, 60, 1000.0)
            assert [r["new"] for r in d.tick(1000.0)] == ["pending"]
            monkeypatch.setattr(fdb, "query_findings", held_query)
            listing = asyncio.create_task(_get(s, "/v1/findings"))
            assert await asyncio.to_thread(entered.wait, 10), "the listing never queried"
            clock.set(1011.0)
            # fires on the loop while the listing's query waits on the database thread
            assert [r["new"] for r in d.tick(1011.0)] == ["firing"]
            gate.set()
            body = await asyncio.wait_for(listing, 10)
            monkeypatch.setattr(fdb, "query_findings", query)
            await asyncio.wrap_future(d.db.submit(lambda _c: None))
            _ids_hold(body, _stored(d))
            # the next listing shows it firing, with its id
            after = await _get(s, "/v1/findings")
            [firing] = after["active"]
            assert firing["code"] == "SWAP_ACTIVE"
            _ids_hold(after, _stored(d))
        finally:
            gate.set()  # a held query lets the database thread, and so d.stop(), go on


@pytest.mark.parametrize("query", ["?since=1015", "?since=1015&code=SWAP_ACTIVE"])
async def test_a_firing_finding_has_its_id_whatever_the_history_keeps(tmp_path, query):
    async with served(tmp_path) as (clock, store, d, s):
        swappiness(store, 60, 1000.0)
        d.tick(1000.0)
        clock.set(1011.0)
        assert [r["new"] for r in d.tick(1011.0)] == ["firing"]
        # still firing at 1020 (last_seen), its last transition (updated_at) at 1011:
        # `since` keeps it live and leaves its row out of the history
        for t in (1015.0, 1020.0):
            swappiness(store, 60, t)
            clock.set(t)
            assert d.tick(t) == []
        await asyncio.wrap_future(d.db.submit(lambda _c: None))
        body = await _get(s, f"/v1/findings{query}")
        [firing] = body["active"]
        assert firing["last_seen"] == 1020.0
        _ids_hold(body, _stored(d))
