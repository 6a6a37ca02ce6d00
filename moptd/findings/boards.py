"""Each GPU board's fault history, kept by board and not by address.

A GPU's subject (gpu:0, gpu:<bus>) and PCI address change with re-enumeration, a moved
card or a new kernel; its serial does not. When a hardware-class finding
(rules/hardware/board-history.yaml ``hardware_codes``) fires on a GPU, a ``board_faults``
row is written in the same transaction as the transition (``FindingsDB``), naming the board
by serial, else UUID, else PCI address. From those rows and the stored Xid events,
``board_facts`` computes what the rules cannot see in a store that forgets at each restart:
how many hardware faults this board had in the window and whether that makes it a repeat
offender (GPU_FAULT_RECURRING), and how many different programs faulted at one place of the
GPU (GPU_FAULT_SAME_LOCATION). The diagnosis loop puts them in the store as
``findings.*`` samples; rules/hardware/board-history.rules.yaml decides on them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moptd import yamlsafe
from moptd.diagnose.codes import CODES
from moptd.diagnose.loader import default_rules_dir
from moptd.durations import parse_duration
from moptd.located import LocatedError
from moptd.observations import Batch

THRESHOLDS_FILE = Path("hardware") / "board-history.yaml"  # under the shipped rules
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
INCIDENTS_SIGNAL = "findings.board_fault_incidents"
RECURRING_SIGNAL = "findings.board_fault_recurring"
LOCATION_SIGNAL = "findings.fault_location_processes"
MAX_ROWS = 10000  # board_faults rows kept (oldest go first); a fleet's worth of RMAs
HISTORY_SHOWN = 20  # rows a finding's attributes quote


@dataclass(frozen=True, slots=True)
class Threshold:
    name: str
    codes: frozenset[str]  # empty: any hardware code
    incidents: int
    source: str


@dataclass(frozen=True, slots=True)
class BoardPolicy:
    hardware_codes: Mapping[str, str]  # code -> least severity that counts
    window: float
    thresholds: tuple[Threshold, ...]
    location_xids: frozenset[int] = frozenset({13, 31})
    location_window: float = 7 * 86400.0
    location_processes: int = 2

    def counts(self, code: str, severity: str) -> bool:
        least = self.hardware_codes.get(code)
        return least is not None and SEVERITY_RANK.get(severity, -1) >= SEVERITY_RANK[least]


def _lines(root: yaml.Node | None) -> dict[str, int]:
    """'key' and 'thresholds[i].key' -> line, for error messages."""
    out: dict[str, int] = {}
    if not isinstance(root, yaml.MappingNode):
        return out
    for k, v in root.value:
        out[str(k.value)] = k.start_mark.line + 1
        if isinstance(v, yaml.SequenceNode):
            for i, item in enumerate(v.value):
                out[f"{k.value}[{i}]"] = item.start_mark.line + 1
                if isinstance(item, yaml.MappingNode):
                    for ik, _ in item.value:
                        out[f"{k.value}[{i}].{ik.value}"] = ik.start_mark.line + 1
        elif isinstance(v, yaml.MappingNode):
            for ik, _ in v.value:
                out[f"{k.value}.{ik.value}"] = ik.start_mark.line + 1
    return out


def parse_policy(text: str, source: str, known_codes: Iterable[str]) -> BoardPolicy:
    """The thresholds file; a mistake raises LocatedError naming the file, line and key."""
    try:
        root = yamlsafe.compose(text)
        data = yamlsafe.load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LocatedError(source, mark.line + 1 if mark else 0, f"not valid YAML: {exc}") from None
    lines = _lines(root)

    def fail(key: str, problem: str) -> LocatedError:
        line = lines.get(key, lines.get(key.split(".")[0], 0))
        return LocatedError(source, line, f"{key}: {problem}")

    if not isinstance(data, Mapping):
        raise LocatedError(source, 1, "expected a mapping")
    for key in data:
        if key not in ("hardware_codes", "window", "thresholds", "same_location"):
            raise fail(str(key), "unknown key (hardware_codes, window, thresholds, same_location)")
    known = set(known_codes)
    codes = data.get("hardware_codes")
    if not isinstance(codes, Mapping) or not codes:
        raise fail("hardware_codes", "expected a mapping of diagnosis code -> least severity")
    for code, sev in codes.items():
        if code not in known:
            raise fail(f"hardware_codes.{code}", "not a diagnosis code")
        if sev not in SEVERITY_RANK:
            raise fail(f"hardware_codes.{code}", f"{sev!r} is not one of info, warning, critical")

    def duration(value: object, key: str) -> float:
        try:
            seconds = parse_duration(value)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            raise fail(key, str(exc)) from None
        if seconds <= 0:
            raise fail(key, "must be longer than 0s")
        return seconds

    window = duration(data.get("window"), "window")
    raw = data.get("thresholds")
    if not isinstance(raw, list) or not raw:
        raise fail("thresholds", "expected a list of {name, codes, incidents, source}")
    thresholds = []
    for i, t in enumerate(raw):
        at = f"thresholds[{i}]"
        if not isinstance(t, Mapping) or set(t) != {"name", "codes", "incidents", "source"}:
            raise fail(at, "expected exactly name, codes, incidents and source")
        if not isinstance(t["codes"], list) or any(c not in codes for c in t["codes"]):
            raise fail(f"{at}.codes", "expected a list of the hardware_codes above")
        n = t["incidents"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 2:
            raise fail(f"{at}.incidents", "expected a whole number, at least 2")
        if not isinstance(t["source"], str) or not t["source"].strip():
            raise fail(f"{at}.source", "expected where the number comes from")
        thresholds.append(Threshold(str(t["name"]), frozenset(t["codes"]), n, t["source"].strip()))
    loc = data.get("same_location", {})
    if not isinstance(loc, Mapping) or not set(loc) <= {"xids", "window", "processes", "source"}:
        raise fail("same_location", "expected xids, window, processes and source")
    xids = loc.get("xids", [13, 31])
    if not isinstance(xids, list) or not all(isinstance(x, int) and x in (13, 31) for x in xids):
        raise fail("same_location.xids", "expected a list of 13 and/or 31 (Xids that name a place)")
    procs = loc.get("processes", 2)
    if not isinstance(procs, int) or isinstance(procs, bool) or procs < 2:
        raise fail("same_location.processes", "expected a whole number, at least 2")
    return BoardPolicy(
        dict(codes),
        window,
        tuple(thresholds),
        frozenset(xids),
        duration(loc.get("window", "7d"), "same_location.window"),
        procs,
    )


def load_policy(path: Path | None = None) -> BoardPolicy:
    p = path or default_rules_dir() / THRESHOLDS_FILE
    return parse_policy(p.read_text(encoding="utf-8"), str(p), CODES)


# --- which board a GPU subject is ---


@dataclass(frozen=True, slots=True)
class Board:
    key: str  # serial:..., uuid:GPU-..., pci:dddd:bb:dd.f
    serial: str = ""
    uuid: str = ""
    pci_bus_id: str = ""


def board_of(subject: str, attrs_of: Mapping[str, Mapping[str, str]]) -> Board | None:
    """The board behind a GPU subject, from what the store knows of it: its own attributes,
    or, for a gpu:<bus> subject the kernel named, those of the NVML subject at that address."""
    if not subject.startswith("gpu:"):
        return None
    own = attrs_of.get(subject, {})
    bus = own.get("pci_bus_id", "") or (subject[4:] if subject.count(":") > 1 else "")
    serial, uuid = own.get("serial", ""), own.get("uuid", "")
    if bus and not serial:
        for other, a in attrs_of.items():
            if other != subject and a.get("pci_bus_id", "").lower() == bus.lower():
                serial = serial or a.get("serial", "")
                uuid = uuid or a.get("uuid", "")
    serial = "" if serial.strip().upper() in ("", "N/A", "[N/A]", "0") else serial.strip()
    if serial:
        return Board(f"serial:{serial}", serial, uuid, bus)
    if uuid:
        return Board(f"uuid:{uuid}", serial, uuid, bus)
    if bus:
        return Board(f"pci:{bus.lower()}", serial, uuid, bus)
    return None


def board_row(board: Board, finding: Mapping[str, Any]) -> dict[str, Any]:
    """What a transition record carries under "board" for FindingsDB to write."""
    return {
        "key": board.key,
        "serial": board.serial,
        "uuid": board.uuid,
        "pci_bus_id": board.pci_bus_id,
        "actions": list(finding.get("actions") or []),
    }


# --- SQL (run on the database's own thread) ---

SCHEMA = """
    CREATE TABLE board_faults (
        id INTEGER PRIMARY KEY,
        t REAL NOT NULL,
        board TEXT NOT NULL,
        serial TEXT NOT NULL DEFAULT '',
        uuid TEXT NOT NULL DEFAULT '',
        pci_bus_id TEXT NOT NULL DEFAULT '',
        subject TEXT NOT NULL,
        finding_id INTEGER,
        rule TEXT NOT NULL,
        code TEXT NOT NULL,
        severity TEXT NOT NULL,
        summary TEXT NOT NULL DEFAULT '',
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX board_faults_board ON board_faults(board, t);
    CREATE INDEX board_faults_serial ON board_faults(serial);
    CREATE INDEX board_faults_uuid ON board_faults(uuid);
"""


def insert_fault(c: sqlite3.Connection, tr: Mapping[str, Any], finding_id: int) -> None:
    b: Mapping[str, Any] = tr["board"]
    c.execute(
        "INSERT INTO board_faults (t, board, serial, uuid, pci_bus_id, subject, finding_id, "
        "rule, code, severity, summary, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            float(tr["t"]),
            str(b["key"]),
            str(b.get("serial", "")),
            str(b.get("uuid", "")),
            str(b.get("pci_bus_id", "")),
            str(tr["subject"]),
            finding_id,
            str(tr["rule"]),
            str(tr["code"]),
            str(tr["severity"]),
            str(tr.get("summary", "")),
            json.dumps({"actions": b.get("actions", [])}, default=str),
        ),
    )
    c.execute(
        "DELETE FROM board_faults WHERE id IN (SELECT id FROM board_faults ORDER BY id DESC "
        "LIMIT -1 OFFSET ?)",
        (MAX_ROWS,),
    )


def _matches(board: Board) -> tuple[str, list[object]]:
    """A board's rows: its key, or any row with its serial or UUID (a row written while only
    the UUID or the address was known is the same board once the serial is)."""
    parts: list[str] = ["b.board = ?"]
    args: list[object] = [board.key]
    if board.serial:
        parts.append("b.serial = ?")
        args.append(board.serial)
    if board.uuid:
        parts.append("b.uuid = ?")
        args.append(board.uuid)
    if not board.serial and not board.uuid and board.pci_bus_id:
        # known by its address alone (NVML down, a kernel line): the faults at that address
        parts.append("lower(b.pci_bus_id) = lower(?)")
        args.append(board.pci_bus_id)
    return "(" + " OR ".join(parts) + ")", args


def history(
    c: sqlite3.Connection, board: Board | None = None, since: float | None = None, limit: int = 500
) -> list[dict[str, Any]]:
    """The board's faults, newest first (all boards' without one), each with what was done:
    the actions the finding gave, when it resolved and the remedies moptd ran."""
    where, args = ("1 = 1", []) if board is None else _matches(board)
    if since is not None:
        where += " AND b.t >= ?"
        args.append(since)
    # `where` is built of fixed clauses; the values are bound
    rows = c.execute(
        "SELECT b.*, f.resolved_at AS resolved_at, f.state AS state FROM board_faults b "  # noqa: S608
        f"LEFT JOIN findings f ON f.id = b.finding_id WHERE {where} "
        "ORDER BY b.t DESC, b.id DESC LIMIT ?",
        (*args, limit),
    ).fetchall()
    out = []
    for r in rows:
        d = {k: r[k] for k in r.keys() if k != "detail"}
        d["actions"] = json.loads(r["detail"] or "{}").get("actions", [])
        d["remedies"] = (
            [
                {"t": m["t"], "remedy": m["remedy"], "outcome": m["outcome"], "reason": m["reason"]}
                for m in c.execute(
                    "SELECT t, remedy, outcome, reason FROM remediations WHERE finding_id = ? "
                    "ORDER BY t",
                    (r["finding_id"],),
                )
            ]
            if r["finding_id"] is not None
            else []
        )
        out.append({k: v for k, v in d.items() if v is not None})
    return out


@dataclass(slots=True)
class Facts:
    """What one GPU subject's board history says now."""

    board: Board
    incidents: int = 0
    recurring: str = ""  # the name of the threshold met, "" if none
    history: list[dict[str, Any]] = field(default_factory=list)
    location: str = ""  # the place most programs faulted at
    location_processes: list[str] = field(default_factory=list)


def board_facts(
    c: sqlite3.Connection,
    now: float,
    policy: BoardPolicy,
    boards: Mapping[str, Board],
) -> dict[str, Facts]:
    """Per GPU subject: its board's faults in the window and the threshold they meet; the
    place of the GPU where the most different programs faulted (Xid 13/31)."""
    out: dict[str, Facts] = {}
    for subject, board in boards.items():
        facts = Facts(board)
        rows = [
            r
            for r in history(c, board, since=now - policy.window, limit=1000)
            if policy.counts(str(r["code"]), str(r["severity"]))
        ]
        facts.incidents = len(rows)
        facts.history = rows[:HISTORY_SHOWN]
        for t in policy.thresholds:
            n = sum(1 for r in rows if not t.codes or r["code"] in t.codes)
            if n >= t.incidents:
                facts.recurring = t.name
                break
        out[subject] = facts
    _locations(c, now, policy, out)
    return out


def _locations(
    c: sqlite3.Connection, now: float, policy: BoardPolicy, out: dict[str, Facts]
) -> None:
    if not out:
        return
    xids = sorted(policy.location_xids)
    programs: dict[tuple[str, str], set[str]] = {}
    # grouped in SQLite: a burst of thousands of lines costs one row per place and program.
    # A program restarted gets a new pid and is the same program: the name counts.
    # a kernel line names the GPU by address (gpu:<bus>) where the driver's /proc does not
    # map it to an index: that is the subject whose board sits at the address
    by_bus = {f.board.pci_bus_id.lower(): s for s, f in out.items() if f.board.pci_bus_id}
    for r in c.execute(
        "SELECT subject, json_extract(fields, '$.location') AS place, "  # noqa: S608
        "json_extract(fields, '$.process') AS name FROM events "
        "WHERE stream = 'kernel.xid' AND t >= ? "
        f"AND json_extract(fields, '$.code') IN ({', '.join('?' * len(xids))}) "
        "AND coalesce(json_extract(fields, '$.location'), '') != '' "
        "AND coalesce(json_extract(fields, '$.process'), '') != '' "
        "GROUP BY subject, place, name",
        (now - policy.location_window, *xids),
    ):
        subject = str(r["subject"])
        if subject not in out:
            subject = by_bus.get(subject[4:].lower(), "")
        if subject:
            programs.setdefault((subject, str(r["place"])), set()).add(str(r["name"]))
    for (subject, place), names in sorted(programs.items()):
        facts = out[subject]
        if len(names) > len(facts.location_processes):
            facts.location, facts.location_processes = place, sorted(names)


def facts_batch(facts: Mapping[str, Facts]) -> Batch:
    """The samples and attributes the rules read (findings.* signals on each GPU subject)."""
    batch = Batch()
    for subject, f in facts.items():
        batch.add(INCIDENTS_SIGNAL, subject, float(f.incidents))
        batch.add(RECURRING_SIGNAL, subject, 1.0 if f.recurring else 0.0)
        batch.add(LOCATION_SIGNAL, subject, float(len(f.location_processes)))
        batch.describe(
            subject,
            board=f.board.key,
            board_threshold=f.recurring,
            board_history=history_text(f.history),
            fault_location=f.location,
            fault_location_processes=", ".join(f.location_processes),
        )
    return batch


def history_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """One line per fault, oldest first: "2026-12-01 10:00 UTC ECC_UNCORRECTABLE on gpu:0
    (0000:3b:00.0), resolved 10:20 UTC"."""

    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))

    parts = []
    for r in sorted(rows, key=lambda r: float(r["t"])):
        text = f"{stamp(float(r['t']))} {r['code']} on {r['subject']}"
        if r.get("pci_bus_id"):
            text += f" ({r['pci_bus_id']})"
        if r.get("resolved_at"):
            text += f", resolved {stamp(float(r['resolved_at']))}"
        for m in r.get("remedies") or []:
            text += f", {m['remedy']} {m['outcome']}"
        parts.append(text)
    return "; ".join(parts)


def history_for(c: sqlite3.Connection, subject: str | None = None) -> list[dict[str, Any]]:
    """What `moptd history [SUBJECT]` lists, from the database alone: SUBJECT is a GPU
    subject (gpu:0, gpu:<bus>), a serial, a UUID, a PCI address or a board key; every fault
    of each board it names (also those recorded under another subject or address), newest
    first. A database older than the board history has none."""
    try:
        if subject is None:
            return history(c)
        key = subject.strip()
        named = c.execute(
            "SELECT DISTINCT board, serial, uuid FROM board_faults WHERE subject = ? "
            "OR serial = ? OR uuid = ? OR lower(pci_bus_id) = lower(?) OR board = ?",
            (key, key, key, key, key),
        ).fetchall()
        seen: dict[int, dict[str, Any]] = {}
        for r in named:
            for row in history(c, Board(str(r["board"]), str(r["serial"]), str(r["uuid"]))):
                seen[int(row["id"])] = row
        return sorted(seen.values(), key=lambda r: (-float(r["t"]), -int(r["id"])))
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
