"""`moptd explain [SUBJECT] [--code CODE [--runbook]] [--since T] [--verbose] [--json]
[--offline] [--bundle B]`.

Asks the daemon; when it cannot be reached (or with --offline) it says so, reads what the
daemon last recorded in its findings database and runs one collection pass itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moptd.cli import EXIT_USAGE

if TYPE_CHECKING:
    from moptd.cli.drain_fit import Host

EXIT_BUNDLE = 2  # no runbook for the code
EXIT_BAD_INPUT = 3  # a bundle or pasted file that could not be used, as `moptd replay`
EXIT_BLIND = 4  # a source could not be read (the kernel log): no finding is no all-clear


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
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="each finding in full: decision path, all evidence, every action, related findings",
    )
    p.add_argument(
        "--runbook", action="store_true", help="print the runbook of --code CODE and stop"
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--offline", action="store_true", help="do not ask the daemon")
    p.add_argument(
        "--bundle",
        metavar="B",
        action="append",
        help="explain a bundle (directory or .tar.gz) or pasted files (any kind moptd replay "
        "reads, - for standard input); repeatable",
    )
    p.add_argument("--config", metavar="PATH", help="configuration file")
    p.set_defaults(func=cmd_explain)


def cmd_explain(args: argparse.Namespace) -> int:
    # imports where they are used: each costs every call (BENCHMARKS.md, "moptd explain and
    # status: how long they take")
    from moptd.findings.matching import chosen, unknown_gpu

    now = time.time()
    since = None
    if args.since:
        from moptd.daemon.http import parse_since

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
    if args.runbook:
        return print_runbook(args.code)
    state_dir: Path | None = None  # the daemon's database: the boards' history
    if args.bundle:
        from moptd.cli.drain_fit import UNKNOWN
        from moptd.cli.explain_facts import load_ruleset
        from moptd.cli.rules_cache import validated_rules
        from moptd.diagnose.rulefiles import default_rules_dir

        with validated_rules():  # checked against the schema once, not each call
            view = bundle_view(list(args.bundle))
        if view is None:
            return EXIT_BAD_INPUT
        rules: Any = load_ruleset([default_rules_dir()])  # loaded for the replay: reused
        drain_host = UNKNOWN  # the host a bundle came from cannot be looked at
    else:
        from moptd.cli.commands import load

        config = load(args)
        if config is None:
            return EXIT_USAGE
        view = None
        notes: list[str] = []
        if not args.offline:
            view, problem = daemon_view(config.api_socket, since, args.subject, args.code)
            if view is None:
                notes.append(f"The daemon is not reachable ({problem}).")
        else:
            notes.append("Offline (--offline): the daemon was not asked.")
        if view is None:
            from moptd.cli.rules_cache import validated_rules

            with validated_rules():  # the rules of the pass: checked once, not each call
                view = offline_view(config, since)
            view["notes"] = notes + view["notes"]
        from moptd.cli.rules_cache import load_facts

        # what explain reads of the rules, from a cache while the files are unchanged
        rules = load_facts(list(config.rule_paths))
        drain_host = this_host(config)
        state_dir = config.state_dir
    view.setdefault("time", now)
    view["asked"] = args.subject
    view["findings"] = [
        f
        for f in view["findings"]
        if chosen(f, args.subject, args.code, since, view.get("gpus", []))
    ]
    explained(view, rules, drain_host)
    # this host's answer (not a bundle's): "No active findings for gpu:7" if there is none
    host = not args.bundle and not view["findings"]
    missing = unknown_gpu(args.subject, view.get("gpus", [])) if host else None
    if missing:
        print(f"moptd explain: {missing}", file=sys.stderr)
        return EXIT_USAGE
    if state_dir is not None:
        history = board_history(state_dir, args.subject, view["findings"])
        if history:  # the key is there when a board has faults on record
            view["history"] = history
    if args.json:
        shown = {k: v for k, v in view.items() if k not in ("gpus", "unusable")}
        json.dump(shown, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from moptd.cli.render_explain import print_explain
        from moptd.cli.sanitize import for_terminal

        view = for_terminal(view)  # evidence never reaches a terminal raw; --json keeps it exact
        print_explain(view, verbose=args.verbose)
        from moptd.cli.explain_remedies import print_remedies  # "What moptd did"

        print_remedies(view)
        if view.get("history"):
            from moptd.cli.cmd_history import history_lines

            print()
            print("Hardware history (moptd history)")
            for line in history_lines(view["history"]):
                print(f"  {line}")
    return EXIT_BAD_INPUT if view.get("unusable") else EXIT_BLIND if view.get("blind") else 0


def explained(view: dict[str, Any], ruleset: Any, drain_host: Host) -> None:
    """Add to each finding of the view what explain shows: NVIDIA's actions, the rule's
    steps (the drain fitted to the host), the deciding evidence, the related findings."""
    from moptd.cli.drain_fit import fit
    from moptd.cli.explain_facts import annotate

    view["findings"] = [fit(annotate(enrich(f), ruleset), drain_host) for f in view["findings"]]
    add_related(view["findings"])


def this_host(config: Any) -> Host:
    """What schedules work onto this host, for the drain step (moptd/cli/drain_fit.py)."""
    from moptd.cli.drain_fit import live_host

    serving = config.collectors.get("serving")
    managed = (serving.options.get("managed") or {}) if serving is not None else {}
    name = managed.get("name", "") if isinstance(managed, dict) else ""
    return live_host(Path(config.host_root), str(name or ""))


def board_history(
    state_dir: Path, subject: str | None, findings: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The hardware history of the GPU asked about, or of the GPUs a board-history finding
    is shown for, from the daemon's database read-only; [] when there is none."""
    wanted = (
        [subject]
        if subject
        else sorted(
            {
                str(f["subject"])
                for f in findings
                if f.get("code") in ("GPU_FAULT_RECURRING", "GPU_FAULT_SAME_LOCATION")
            }
        )
    )
    rows: dict[int, dict[str, Any]] = {}
    for s in wanted:
        from moptd.findings.queries import read_board_history  # only when there is one

        for r in read_board_history(state_dir, s)[0]:
            rows[int(r["id"])] = r
    return sorted(rows.values(), key=lambda r: -float(r["t"]))


def print_runbook(code: str | None) -> int:
    """The runbook shipped with moptd, as Markdown on stdout."""
    from moptd.cli.runbooks import runbook_path, runbooks_dir

    if not code:
        print("moptd explain: --runbook needs --code CODE", file=sys.stderr)
        return EXIT_USAGE
    path = runbook_path(code)
    if path is None:
        print(f"moptd explain: no runbook {runbooks_dir() / (code + '.md')}", file=sys.stderr)
        return EXIT_BUNDLE
    sys.stdout.write(path.read_text(encoding="utf-8"))
    return 0


# --- where findings come from ---


def daemon_view(
    socket: Path, since: float | None, subject: str | None = None, code: str | None = None
) -> tuple[dict[str, Any] | None, str]:
    """One request: /v1/explain answers with the GPUs and every chosen finding in full."""
    from urllib.parse import urlencode

    from moptd.cli import client

    params = {"subject": subject, "code": code, "since": None if since is None else repr(since)}
    query = urlencode({k: v for k, v in params.items() if v is not None})
    try:
        status, body = client.request(socket, "GET", "/v1/explain" + (f"?{query}" if query else ""))
    except client.DaemonUnreachable as exc:
        return None, str(exc)
    if status != 200:
        return None, f"HTTP {status}: {body.get('error') if isinstance(body, dict) else body}"
    return {
        "source": "daemon",
        "notes": [],
        "findings": list(body["findings"]),
        "gpus": body.get("gpus", []),
        "blind": list(body.get("blind") or []),
    }, ""


def offline_view(config: Any, since: float | None) -> dict[str, Any]:
    """What the daemon last recorded (its database, read-only) and one collection pass."""
    import asyncio
    import contextlib

    from moptd.findings import db as fdb
    from moptd.findings.queries import recorded_for_explain

    notes: list[str] = []
    recorded: list[dict[str, Any]] = []
    path = Path(config.state_dir) / fdb.FILE_NAME
    conn = fdb.open_read_only(path)
    if conn is None:
        notes.append(f"No findings database at {path}: no history from the daemon.")
    else:
        with contextlib.closing(conn):
            recorded = recorded_for_explain(conn, since)
        notes.append(
            f"Findings marked #N are as the daemon last recorded them in {path}; "
            "they may have changed since it stopped."
        )
    live, gpus, blind = asyncio.run(_collect_and_diagnose(config))
    notes.append("Ran one collection pass here and evaluated the rules on it.")
    keys = {(f["rule"], f["subject"]) for f in recorded}
    merged = recorded + [f for f in live if (f["rule"], f["subject"]) not in keys]
    return {"source": "offline", "notes": notes, "findings": merged, "gpus": gpus, "blind": blind}


async def _collect_and_diagnose(
    config: Any,
) -> tuple[list[dict[str, Any]], list[Any], list[str]]:
    import asyncio
    import logging

    from moptd.clock import SystemClock
    from moptd.daemon.assemble import make_runtime
    from moptd.daemon.health import blind_sources
    from moptd.daemon.views import status_view
    from moptd.diagnose.service import RuleService
    from moptd.findings.service import steps_of
    from moptd.store import SignalStore

    logging.getLogger("moptd").setLevel(logging.CRITICAL)
    store = SignalStore()
    runtime = make_runtime(config, store)
    # the rules the daemon would run: shipped, then rules.d overrides from the config. They
    # are read and compiled on a thread while the collectors run: that reads no store, and
    # it fills the pass's waits (journalctl, the NVML library's load, the threads' hand-offs)
    rules_loaded = asyncio.to_thread(RuleService, store, SystemClock(), list(config.rule_paths))
    _, rules = await asyncio.gather(runtime.collect_once(), rules_loaded)
    rules.tick()
    out = []
    for f in rules.active():
        d = f.to_json()
        d["steps"] = steps_of(rules.result(f.rule, f.subject))
        d["source"] = "this pass"
        out.append(d)
    gpus = status_view(store, runtime.health.values()).get("gpus", [])
    return out, gpus, blind_sources(h.as_dict() for h in runtime.health.values())


def bundle_view(inputs: list[str]) -> dict[str, Any] | None:
    """The live engine over a bundle or pasted files; "now" is the last time step."""
    from moptd.bundle import BundleError
    from moptd.bundle.intake import read_inputs
    from moptd.cli.bundle_guard import check_bundle
    from moptd.cli.cmd_replay import report_unusable
    from moptd.cli.explain_facts import load_rules_once
    from moptd.diagnose.replay import replay_timeline
    from moptd.diagnose.rulefiles import default_rules_dir

    try:
        loaded = load_rules_once([default_rules_dir()])
        if loaded.errors:
            raise ValueError("; ".join(map(str, loaded.errors)))
        tl = read_inputs(inputs, sys.stdin.buffer, check_bundle)  # BundleRefused: ValueError
        report = replay_timeline(tl, loaded.ruleset)
    except (BundleError, ValueError) as exc:
        print(f"moptd explain: {exc}", file=sys.stderr)
        return None
    bad = report_unusable(report.read, "moptd explain")
    return replay_view(inputs, tl, report, bad)


def replay_view(inputs: list[str], tl: Any, report: Any, bad: bool) -> dict[str, Any]:
    """What explain shows of a replay: `moptd replay` and `explain --bundle` alike."""
    from moptd.cli.render_findings import read_lines

    shown = " + ".join("stdin" if i == "-" else i for i in inputs)  # "Bundle -" read as a typo
    used, unused = read_lines(report.read)
    host = report.meta.get("host")
    of = f" (host {host})" if host else ""
    steps = f"{report.steps} time step{'' if report.steps == 1 else 's'}"
    what = "Paste on" if inputs == ["-"] else "Bundle"
    notes = [f"{what} {shown}{of}: {steps} replayed."]
    notes += [f"Read {line}" for line in used]
    notes += [f"Not used: {line}" for line in unused]
    if not used:
        notes.append("Nothing could be read: no findings below says nothing about health.")
    if report.untimed:
        notes.append(report.time_note())
    notes += report.notes
    if report.missing_evidence:
        notes.append(
            "Missing from the bundle (evidence unknown): " + ", ".join(report.missing_evidence)
        )
    findings = []
    for f in report.findings:
        f = dict(f, state=f.get("state") or ("resolved" if f.get("resolved_at") else "firing"))
        f["events"] = [
            {
                "t": None if tl.untimed else e.t,  # an untimed bundle's are no dates
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
    span = tl.span()  # its last time is the last step (steps() would read a stream again)
    return {
        "source": "bundle",
        "notes": notes,
        "read": report.read,
        "unusable": bad,
        "findings": findings,
        "time": span[1] if span else time.time(),
        "gpus": bundle_gpus(tl),
    }


def bundle_gpus(tl: Any) -> list[dict[str, Any]]:
    """The GPUs a bundle describes (index, UUID, bus id), as the daemon's view lists them:
    explain names a GPU by all three, and a SUBJECT may be any of them."""
    attrs: dict[str, dict[str, str]] = {}
    for _, _, batch in tl.observations:
        for subject, described in batch.attrs.items():
            if subject.startswith("gpu:"):
                attrs.setdefault(subject, {}).update(described)
    return [
        {"subject": subject, **{k: a[k] for k in ("index", "uuid", "pci_bus_id") if a.get(k)}}
        for subject, a in sorted(attrs.items())
    ]


# --- related findings and NVIDIA's actions ---


_RELATED_KEYS = ("id", "code", "subject", "severity", "state", "summary")


def add_related(findings: list[dict[str, Any]]) -> None:
    """Findings on the same GPU (by subject or PCI address) belong to the same incident, and
    so do a cause and its consequences on other subjects (caused_by: an engine's stall
    after a fault of its GPU). A linked one says how: `"link": "cause"` or
    `"consequence"`, with the link's id."""
    from moptd.cli.explain_order import linked

    for f in findings:
        given = list(f.get("related") or [])  # the daemon's: the same subject, from its history
        related = []
        for g in findings:
            if g is f:
                continue
            entry = {k: g.get(k) for k in _RELATED_KEYS}
            if linked(g, f):
                related.append({**entry, "link": "cause", "by": f["caused_by"].get("link")})
            elif linked(f, g):
                related.append({**entry, "link": "consequence", "by": g["caused_by"].get("link")})
            elif not given and (
                g.get("subject") == f.get("subject")
                or (f.get("pci_bus_id") and g.get("pci_bus_id") == f.get("pci_bus_id"))
            ):
                related.append(entry)
        shown = {(r.get("code"), r.get("subject")) for r in related}
        related += [r for r in given if (r.get("code"), r.get("subject")) not in shown]
        # the cause first, then what follows from this one, then the same subject's
        order = {"cause": 0, "consequence": 1}
        f["related"] = sorted(related, key=lambda r: order.get(str(r.get("link")), 2))


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
        from moptd.kernel.xid import describe_bucket, xid_info
    except ImportError:
        return f
    actions = []
    for code in codes:
        info = xid_info(code)
        # NVIDIA's bucket names (RESTART_BM, WORKFLOW_XID_48) mean nothing at 3 a.m.: in words
        if info.immediate_action:
            actions.append(
                f"Xid {code} ({info.mnemonic}): {describe_bucket(info.immediate_action)}"
            )
        if info.investigatory_action:
            actions.append(
                f"Xid {code}, then investigate: {describe_bucket(info.investigatory_action)}"
            )
    return {**f, "nvidia_actions": actions}
