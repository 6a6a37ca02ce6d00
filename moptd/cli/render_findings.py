"""Rich rendering of findings for `moptd replay`."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from moptd.diagnose.engine import fmt
from moptd.diagnose.replay import ReplayReport

_UNWRAPPED = 100_000
_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def _time(t: object) -> str:
    if not isinstance(t, int | float):
        return "?"
    return datetime.fromtimestamp(float(t), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def read_lines(read: list[dict[str, object]]) -> tuple[list[str], list[str]]:
    """(what was read, what was not used), one line each, for a person."""
    used: list[str] = []
    unused: list[str] = []
    for e in read:
        where = str(e.get("input", "?"))
        lines = e.get("lines")
        if isinstance(lines, list) and len(lines) == 2:
            a, b = lines
            where += f" line {a}" if a == b else f" lines {a}-{b}"
        if e.get("used"):
            used.append(f"{e.get('summary') or e.get('kind')}  ({where})")
        else:
            at = str(e.get("at") or "")
            # the line a dump stops reading at, where the section's own lines do not say it
            at = (
                f" (at {at})" if at and not where.endswith(f" line {at.rsplit(':', 1)[-1]}") else ""
            )
            unused.append(f"{where}: {e.get('reason', 'not used')}{at}")
    return used, unused


def _when(f: dict[str, object], key: str) -> str:
    """A finding's time; an untimed replay's in seconds since what it is relative to."""
    rel = f.get("relative")
    if f.get(key) is None and isinstance(rel, dict) and isinstance(rel.get(key), int | float):
        return f"{rel[key]:.3f} s"
    return _time(f.get(key))


def render_replay(
    report: ReplayReport, console: Console | None = None, *, verbose: bool = False
) -> None:
    # piped (into a ticket) nothing is wrapped: a command or condition stays one line
    out = console or Console(width=None if Console().is_terminal else _UNWRAPPED)
    host = report.meta.get("host")
    head = f"Replay of {report.bundle}" + (f" (host {host})" if host else "")
    out.print(Text(head, style="bold"))
    used, unused = read_lines(report.read)
    if used:
        read_tree = Tree(Text("Read", style="bold"))
        for line in used:
            read_tree.add(line)
        out.print(read_tree)
    if unused:
        not_used = Tree(Text("Not used", style="bold yellow"))
        for line in unused:
            not_used.add(line)
        out.print(not_used)
    out.print(
        f"{report.steps} steps; missing evidence: {', '.join(report.missing_evidence) or 'none'}"
    )
    if report.untimed:
        out.print(report.time_note())
    for note in report.notes:
        out.print(note, soft_wrap=True)
    if not report.findings and not used:
        # never a green all-clear over nothing
        out.print(Text("No findings: nothing could be read.", style="bold yellow"))
    elif not report.findings:
        out.print(Text("No findings.", style="green"))
    else:
        n = len(report.findings)
        out.print(f"{n} finding{'' if n == 1 else 's'}:")
    from moptd.cli.explain_order import incidents

    # in explain's order: node-wide causes first (a half-applied driver update's
    # DRIVER_VERSION_MISMATCH before the GPU_INIT_FAILED it explains), causes before effects
    for f in [g for inc in incidents(report.findings) for g in inc.findings]:
        sev = str(f["severity"])
        label = Text.assemble(
            (f"{sev.upper():8}", _STYLE.get(sev, "")),
            (f" {f['code']}", "bold"),
            f" on {f['subject']}",
            f" ({f['pci_bus_id']})" if f.get("pci_bus_id") else "",
        )
        tree = Tree(label)
        tree.add(str(f["summary"]))
        state = "unconfirmed" if f.get("state") == "unconfirmed" else "firing"
        span = f"{state} {_when(f, 'first_seen')} .. {_when(f, 'last_seen')}"
        if f.get("untimed"):
            span = f"{state} on lines without a time of their own"
        if f.get("note"):
            span += f" ({f['note']})"
        if _when(f, "resolved_at") != "?":
            span += f", resolved {_when(f, 'resolved_at')}"
        tree.add(span)
        tree.add(f"rule {f['rule']}, path: {' > '.join(map(str, f['path']))}")
        evidence = f.get("evidence") or {}
        if isinstance(evidence, dict) and evidence:
            ev = tree.add("evidence")
            for k, v in evidence.items():
                ev.add(f"{k} = {fmt(v)}")
        actions = f.get("actions") or []
        if isinstance(actions, list) and actions:
            act = tree.add("actions")
            for a in actions:
                act.add(str(a))
        if f.get("runbook"):
            tree.add(f"runbook: {f['runbook']}")
        out.print(tree)
    if report.unknown and not verbose:
        print_undecided(report, out)
    elif report.unknown:
        undecided = Tree(
            Text("Undecided for missing evidence (never read as healthy)", style="bold")
        )
        by_rule: dict[str, list[str]] = {}
        conds: dict[str, list[str]] = {}
        for u in report.unknown:
            rule = str(u["rule"])
            by_rule.setdefault(rule, []).append(str(u["subject"]))
            c = u["conditions"]
            conds.setdefault(rule, [str(x) for x in c] if isinstance(c, list) else [])
        for rule, subjects in by_rule.items():
            more = f" and {len(subjects) - 3} more" if len(subjects) > 3 else ""
            node = undecided.add(f"{rule} on {', '.join(subjects[:3])}{more}")
            for cond in conds[rule]:
                node.add(cond)
        out.print(undecided)


def print_undecided(report: ReplayReport, console: Console | None = None) -> None:
    """How many rules the inputs left undecided: never read as healthy, so always said."""
    if not report.unknown:
        return
    out = console or Console(width=None if Console().is_terminal else _UNWRAPPED)
    n = len({str(u["rule"]) for u in report.unknown})
    out.print(
        f"{n} rule{'' if n == 1 else 's'} undecided for missing evidence (never read as "
        "healthy); --verbose lists them"
    )
