"""`moptd explain [SUBJECT] [--code CODE] [--since T] [--json] [--offline] [--bundle B]`.

Asks the daemon; when it cannot be reached (or with --offline) it says so, reads what the
daemon last recorded in its findings database and runs one collection pass itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from moptd.cli import EXIT_USAGE

EXIT_BUNDLE = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explain", help="explain active findings: why, evidence, what to do")
    p.add_argument(
        "subject",
        nargs="?",
        metavar="SUBJECT",
        help="GPU index, gpu:N, UUID, PCI bus id, serving name, or node",
    )
    p.add_argument("--code", metavar="CODE", help="only this diagnosis code (e.g. GPU_LOST)")
    p.add_argument(
        "--since",
        metavar="T",
        help="also findings that changed since T (Unix seconds, RFC 3339, or e.g. 1h)",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--offline", action="store_true", help="do not ask the daemon")
    p.add_argument("--bundle", metavar="B", help="explain a bundle (directory or .tar.gz)")
    p.add_argument("--config", metavar="PATH", help="configuration file")
    p.set_defaults(func=cmd_explain)


def cmd_explain(args: argparse.Namespace) -> int:
    from moptd.cli.commands import load
    from moptd.daemon.api import parse_since

    now = time.time()
    since = None
    if args.since:
        try:
            since = parse_since(args.since, now)
        except ValueError as exc:
            print(f"moptd explain: --since: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.code:
        from moptd.diagnose.codes import CODES

        args.code = args.code.upper()
        if args.code not in CODES:
            print(
                f"moptd explain: unknown code {args.code!r} (known: {', '.join(sorted(CODES))})",
                file=sys.stderr,
            )
            return EXIT_USAGE
    if args.bundle:
        view = bundle_view(Path(args.bundle))
        if view is None:
            return EXIT_BUNDLE
    else:
        config = load(args)
        if config is None:
            return EXIT_USAGE
        view = None
        notes: list[str] = []
        if not args.offline:
            view, problem = daemon_view(config.api_socket, since)
            if view is None:
                notes.append(f"The daemon is not reachable ({problem}).")
        else:
            notes.append("Offline (--offline): the daemon was not asked.")
        if view is None:
            view = offline_view(config, since)
            view["notes"] = notes + view["notes"]
    view.setdefault("time", now)
    view["asked"] = args.subject
    view["findings"] = [
        enrich(f)
        for f in view["findings"]
        if matches(f, args.subject, view.get("gpus", []))
        and (args.code is None or f.get("code") == args.code)
        and (since is None or _changed_since(f, since))
    ]
    add_related(view["findings"])
    if args.json:
        json.dump({k: v for k, v in view.items() if k != "gpus"}, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from moptd.cli.render_explain import print_explain

        print_explain(view)
    return 0


def _changed_since(f: dict[str, Any], since: float) -> bool:
    if f.get("state") == "firing":
        return True
    last = f.get("resolved_at") or f.get("updated_at") or f.get("last_seen") or 0
    return float(last) >= since


# --- where findings come from ---


def daemon_view(socket: Path, since: float | None) -> tuple[dict[str, Any] | None, str]:
    from moptd.cli import client

    try:
        status = client.get_json(socket, "/v1/status")
        query = "" if since is None else f"?since={since}"
        code, body = client.request(socket, "GET", f"/v1/findings{query}")
        if code != 200:
            return None, f"HTTP {code}: {body.get('error') if isinstance(body, dict) else body}"
        found: list[dict[str, Any]] = list(body["active"])
        if since is not None:
            live = {(f["rule"], f["subject"]) for f in found}
            found += [
                f
                for f in body["history"]
                if f.get("state") == "resolved" and (f["rule"], f["subject"]) not in live
            ]
        detailed = []
        for f in found:
            if f.get("id") is not None:
                c, full = client.request(socket, "GET", f"/v1/findings/{f['id']}")
                if c == 200:
                    f = {**full, **{k: v for k, v in f.items() if k in ("steps", "evidence")}}
            detailed.append(f)
    except client.DaemonUnreachable as exc:
        return None, str(exc)
    return {
        "source": "daemon",
        "notes": [],
        "findings": detailed,
        "gpus": status.get("gpus", []),
    }, ""


def offline_view(config: Any, since: float | None) -> dict[str, Any]:
    """What the daemon last recorded (its database, read-only) and one collection pass."""
    from moptd.findings import db as fdb

    notes: list[str] = []
    recorded: list[dict[str, Any]] = []
    path = Path(config.state_dir) / fdb.FILE_NAME
    conn = fdb.open_read_only(path)
    if conn is None:
        notes.append(f"No findings database at {path}: no history from the daemon.")
    else:
        with contextlib.closing(conn):
            ids = [int(r["id"]) for r in fdb.active_findings(conn)]
            if since is not None:
                ids += [
                    int(r["id"]) for r in fdb.query_findings(conn, since=since, state="resolved")
                ]
            for fid in ids:
                f = fdb.get_finding(conn, fid)
                if f is None:
                    continue
                start = float(f.get("pending_since") or 0) - 300.0
                f["events"] = [
                    e
                    for e in fdb.query_events(conn, since=start, subject=str(f["subject"]))
                    if f.get("resolved_at") is None or e["t"] <= float(f["resolved_at"])
                ]
                f["source"] = "database"
                recorded.append(f)
        notes.append(
            f"Findings marked #N are as the daemon last recorded them in {path}; "
            "they may have changed since it stopped."
        )
    live, gpus = asyncio.run(_collect_and_diagnose(config))
    notes.append("Ran one collection pass here and evaluated the rules on it.")
    keys = {(f["rule"], f["subject"]) for f in recorded}
    merged = recorded + [f for f in live if (f["rule"], f["subject"]) not in keys]
    return {"source": "offline", "notes": notes, "findings": merged, "gpus": gpus}


async def _collect_and_diagnose(config: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    from moptd.clock import SystemClock
    from moptd.daemon.app import make_runtime
    from moptd.daemon.views import status_view
    from moptd.diagnose.service import RuleService
    from moptd.findings.service import steps_of
    from moptd.store import SignalStore

    logging.getLogger("moptd").setLevel(logging.CRITICAL)
    store = SignalStore()
    runtime = make_runtime(config, store)
    await runtime.collect_once()
    # the rules the daemon would run: shipped, then rules.d overrides from the config
    rules = RuleService(store, SystemClock(), list(config.rule_paths))
    rules.tick()
    out = []
    for f in rules.active():
        d = f.to_json()
        result = next(
            (r for r in rules.last_results if r.rule.id == f.rule and r.subject == f.subject), None
        )
        d["steps"] = steps_of(result)
        d["source"] = "this pass"
        out.append(d)
    gpus = status_view(store, runtime.health.values()).get("gpus", [])
    return out, gpus


def bundle_view(path: Path) -> dict[str, Any] | None:
    """The live engine over a bundle; "now" is the bundle's last time step."""
    from moptd.bundle import BundleError, read_bundle
    from moptd.cli.bundle_guard import check_bundle
    from moptd.diagnose.loader import default_rules_dir, load_rules
    from moptd.diagnose.replay import replay_timeline

    try:
        loaded = load_rules([default_rules_dir()])
        if loaded.errors:
            raise ValueError("; ".join(map(str, loaded.errors)))
        check_bundle(path)  # its BundleRefused is a ValueError
        tl = read_bundle(path)
        report = replay_timeline(tl, loaded.ruleset)
    except (BundleError, ValueError) as exc:
        print(f"moptd explain: {exc}", file=sys.stderr)
        return None
    notes = [f"Bundle {path}: {report.steps} time steps replayed."]
    if report.missing_evidence:
        notes.append(
            "Missing from the bundle (evidence unknown): " + ", ".join(report.missing_evidence)
        )
    findings = []
    for f in report.findings:
        f = dict(f, state="resolved" if f.get("resolved_at") else "firing")
        f["events"] = [
            {
                "t": e.t,
                "stream": e.stream,
                "subject": e.subject,
                "text": e.text,
                "fields": dict(e.fields),
            }
            for e in tl.events
            if e.subject == f["subject"]
            or (f.get("pci_bus_id") and e.fields.get("pci_bus_id") == f.get("pci_bus_id"))
        ][-20:]
        findings.append(f)
    steps = tl.steps()
    return {
        "source": "bundle",
        "notes": notes,
        "findings": findings,
        "time": steps[-1] if steps else time.time(),
    }


# --- matching and NVIDIA's actions ---


def matches(f: dict[str, Any], asked: str | None, gpus: list[dict[str, Any]]) -> bool:
    """SUBJECT may be a GPU index, gpu:N, a UUID, a PCI bus id, a serving name or node."""
    if not asked:
        return True
    from moptd.proc.pci import normalize_pci

    subject = str(f.get("subject", ""))
    a = asked.strip()
    if a in (subject, subject.split(":", 1)[-1]) or f"serving:{a}" == subject:
        return True
    pci = normalize_pci(a)
    if pci is not None and pci in (f.get("pci_bus_id"), normalize_pci(subject.split(":", 1)[-1])):
        return True
    for g in gpus:
        ids = {str(g.get("uuid")), str(g.get("index")), str(g.get("subject"))}
        if g.get("pci_bus_id"):
            ids.add(str(normalize_pci(str(g["pci_bus_id"]))))
        if (a in ids or (pci and pci in ids)) and (
            subject == g.get("subject") or (f.get("pci_bus_id") and f.get("pci_bus_id") in ids)
        ):
            return True
    return False


def add_related(findings: list[dict[str, Any]]) -> None:
    """Findings on the same GPU (by subject or PCI address) belong to the same incident."""
    for f in findings:
        if f.get("related"):
            continue
        f["related"] = [
            {k: g.get(k) for k in ("id", "code", "subject", "severity", "state", "summary")}
            for g in findings
            if g is not f
            and (
                g.get("subject") == f.get("subject")
                or (f.get("pci_bus_id") and g.get("pci_bus_id") == f.get("pci_bus_id"))
            )
        ]


def enrich(f: dict[str, Any]) -> dict[str, Any]:
    """NVIDIA's actions for the Xids in the evidence, from moptd's copy of the Xid catalog."""
    codes: list[int] = []
    for ev in f.get("events") or []:
        if ev.get("stream") in ("kernel.xid", "gpu.xid_event"):
            code = (ev.get("fields") or {}).get("code")
            if isinstance(code, int) and code not in codes:
                codes.append(code)
    if not codes:
        return f
    try:
        from moptd.kernel.xid import xid_info
    except ImportError:
        return f
    actions = []
    for code in codes:
        info = xid_info(code)
        if info.immediate_action:
            actions.append(f"Xid {code} ({info.mnemonic}): {info.immediate_action}")
        if info.investigatory_action:
            actions.append(f"Xid {code}, then investigate: {info.investigatory_action}")
    return {**f, "nvidia_actions": actions}
