"""The findings as the API and `moptd explain` show them: the live ones from the rule
service joined with the history in the database. Every statement is in moptd.findings.db;
the daemon's queries run them on the database's thread and only await the result on the
loop."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from moptd.findings import boards
from moptd.findings import db as fdb
from moptd.findings.matching import chosen
from moptd.findings.service import Diagnosis

T = TypeVar("T")

RELATED_FIELDS = ("id", "code", "subject", "severity", "state", "summary")
# a firing finding's live values win over what was last stored
LIVE_FIELDS = (
    "evidence",
    "path",
    "steps",
    "actions",
    "last_seen",
    "summary",
    "caused_by",
    "consequences",
)
# present only when there is a link (docs/api/openapi.yaml: never null)
LINK_FIELDS = ("caused_by", "consequences")
EXPLAIN_HISTORY = 500  # as many as /v1/findings returns by default


async def _on_db(d: Diagnosis, fn: Callable[[sqlite3.Connection], T]) -> T:
    return await asyncio.wrap_future(d.db.submit(fn))


async def recorded_subjects(d: Diagnosis) -> list[str]:
    return await _on_db(d, fdb.recorded_subjects)


async def remediations(
    d: Diagnosis, since: float | None, subject: str | None, limit: int
) -> list[dict[str, Any]]:
    """The remediation audit trail, newest first."""
    return await _on_db(d, lambda c: fdb.query_remediations(c, since, subject, limit))


async def findings(
    d: Diagnosis,
    *,
    since: float | None = None,
    limit: int = 500,
    subject: str | None = None,
    code: str | None = None,
    severity: str | None = None,
    state: str | None = None,
    live: list[dict[str, Any]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """{"active": the firing findings that pass the filters, with their history id once
    stored; "history": the stored findings, newest first}. `live` is d.active() when the
    caller has it already, taken on this loop step.

    The live findings are read before the query is queued: a transition is queued for the
    database on the loop step that applies it, so the query, run after it on the database
    thread, finds the row of every finding read here (read after the query, a finding that
    fired meanwhile had none yet, and no id). Their ids come from all the firing rows, not
    from the history, which `since` and `limit` may cut."""
    given = {"subject": subject, "code": code, "severity": severity, "state": state}
    filters = {k: v for k, v in given.items() if v is not None}

    def keep(f: dict[str, Any]) -> bool:
        if any(f.get(k) != v for k, v in filters.items() if k != "state"):
            return False
        if filters.get("state") not in (None, "firing"):
            return False
        return since is None or float(f.get("last_seen") or 0) >= since

    active = [f for f in (d.active() if live is None else live) if keep(f)]

    def read(
        c: sqlite3.Connection,
    ) -> tuple[list[dict[str, Any]], dict[tuple[object, object], object]]:
        history = fdb.query_findings(c, since=since, limit=limit, **filters)
        firing = fdb.active_findings(c) if active else []
        return history, {(f["rule"], f["subject"]): f["id"] for f in firing}

    history, ids = await _on_db(d, read)
    for f in active:
        if (f["rule"], f["subject"]) in ids:
            f["id"] = ids[(f["rule"], f["subject"])]
    link_ids(active + history, history)
    return {"active": active, "history": history}


def link_ids(findings: list[dict[str, Any]], history: list[dict[str, Any]]) -> None:
    """Give each caused_by and consequence the id of the finding it names: the open one
    of that rule and subject, else the newest stored (history is newest first)."""
    by_key: dict[tuple[object, object], object] = {}
    for h in history:
        key = (h.get("rule"), h.get("subject"))
        if key not in by_key or h.get("state") in ("firing", "pending"):
            by_key[key] = h.get("id")
    for f in findings:
        by = f.get("caused_by")
        links = [by] if isinstance(by, dict) else []
        links += [c for c in f.get("consequences") or [] if isinstance(c, dict)]
        for link in links:
            fid = by_key.get((link.get("rule"), link.get("subject")))
            if fid is not None:
                link["id"] = fid


def _stored_detail(
    c: sqlite3.Connection, fid: int
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]] | None:
    """On the database thread: the finding with its transitions, the findings related to it
    (the same subject or PCI address, from 5 minutes before it started) and the events on
    its subject over the same time."""
    f = fdb.get_finding(c, fid)
    if f is None:
        return None
    start = float(f.get("pending_since") or f.get("first_seen") or 0) - 300.0
    end = f.get("resolved_at")
    subject = str(f["subject"])
    events = [
        e
        for e in fdb.query_events(c, since=start, subject=subject, limit=200)
        if end is None or e["t"] <= float(end)
    ]
    related = [
        r
        for r in fdb.query_findings(c, since=start, limit=200)
        if r["id"] != fid
        and (
            r["subject"] == subject
            or (f.get("pci_bus_id") and r.get("pci_bus_id") == f.get("pci_bus_id"))
        )
    ]
    return f, related, events


async def finding(
    d: Diagnosis, fid: int, live: list[dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """One stored finding in full: decision steps, evidence, actions, transitions, events
    and related findings; live values while it fires."""
    stored = await _on_db(d, lambda c: _stored_detail(c, fid))
    if stored is None:
        return None
    f, related, events = stored
    current = next(
        (
            a
            for a in (d.active() if live is None else live)
            if a["rule"] == f["rule"]
            and a["subject"] == f["subject"]
            and f.get("state") == "firing"
        ),
        None,
    )
    if current is not None:
        for key in LIVE_FIELDS:
            if key in current:
                f[key] = current[key]
            elif key in LINK_FIELDS:
                f.pop(key, None)  # the link ended since it was stored: live has none
    f["related"] = [{k: r.get(k) for k in RELATED_FIELDS} for r in related]
    f["events"] = events
    return f


async def explain(
    d: Diagnosis,
    *,
    gpus: list[dict[str, Any]],
    subject: str | None = None,
    code: str | None = None,
    since: float | None = None,
) -> list[dict[str, Any]]:
    """What `moptd explain` shows, each finding in full: the firing ones and, with `since`,
    those resolved since then; of `subject` (any of its spellings, `gpus` resolving GPU
    indexes, UUIDs and PCI addresses) and `code` when given."""
    live = d.active()
    listing = await findings(d, since=since, limit=EXPLAIN_HISTORY, live=live)
    found = list(listing["active"])
    if since is not None:
        firing = {(f["rule"], f["subject"]) for f in found}
        found += [
            f
            for f in listing["history"]
            if f.get("state") == "resolved" and (f["rule"], f["subject"]) not in firing
        ]
    out = []
    for f in found:
        if f.get("id") is not None:
            full = await finding(d, int(f["id"]), live)
            if full is not None:
                # the listing's steps and evidence over the stored ones, as explain took
                # them when it asked for each finding itself
                f = {**full, **{k: v for k, v in f.items() if k in ("steps", "evidence")}}
        if chosen(f, subject, code, since, gpus):
            out.append(f)
    return out


def recorded_for_explain(c: sqlite3.Connection, since: float | None) -> list[dict[str, Any]]:
    """What `moptd explain` shows from the database alone (the daemon is down): the findings
    it last recorded firing and, with `since`, those resolved since then, each with the
    events on its subject from 5 minutes before it started."""
    ids = [int(r["id"]) for r in fdb.active_findings(c)]
    if since is not None:
        ids += [int(r["id"]) for r in fdb.query_findings(c, since=since, state="resolved")]
    out = []
    for fid in ids:
        f = fdb.get_finding(c, fid)
        if f is None:
            continue
        start = float(f.get("pending_since") or 0) - 300.0
        f["events"] = [
            e
            for e in fdb.query_events(c, since=start, subject=str(f["subject"]))
            if f.get("resolved_at") is None or e["t"] <= float(f["resolved_at"])
        ]
        f["source"] = "database"
        out.append(f)
    return out


def read_board_history(
    state_dir: Path, subject: str | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Each board's fault history (`moptd history`, `moptd explain`) from the daemon's
    database opened read-only: nothing is written, the daemon may be running. (rows, "") or
    ([], why there is none)."""
    path = Path(state_dir) / fdb.FILE_NAME
    conn = fdb.open_read_only(path)
    if conn is None:
        return [], f"no readable findings database at {path}"
    with contextlib.closing(conn):
        try:
            return boards.history_for(conn, subject), ""
        except sqlite3.Error as exc:
            return [], f"{path}: {exc}"
