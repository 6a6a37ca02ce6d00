"""`moptd explain` for people: what is wrong, why moptd thinks so, and what to do.

Meant to be read at 3 a.m.: by default a header and one short block per problem, causes
first (moptd.cli.explain_compact, ordered by moptd.cli.explain_order). `--verbose` adds, for
each finding, the decision path with the values each condition saw (undecided ones too), all
its evidence with times, NVIDIA's actions, all of moptd's and the related findings.
Colour on a terminal; rich drops it when the output is piped, and then wraps nothing.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console, Group
from rich.text import Text
from rich.tree import Tree

from moptd.cli.explain_compact import (
    SEVERITY_STYLE,
    ago,
    header,
    incident_block,
    runbooks_in_header,
    when,
    where_line,
)
from moptd.cli.explain_order import Incident, incidents
from moptd.diagnose.wording import fmt

__all__ = ["ago", "finding_block", "print_explain", "print_status_findings", "when"]

_SEVERITY_STYLE = SEVERITY_STYLE
_MARK = {True: ("✓", "green"), False: ("✗", "dim"), None: ("?", "yellow")}
_LINK_WORDS = {"cause": "its cause: ", "consequence": "follows from it: "}


def _value(v: Any) -> str:
    return fmt(v)  # the same wording as the decision path the engine records


def _header(f: dict[str, Any]) -> Text:
    sev = str(f.get("severity", "info"))
    t = Text()
    t.append(f" {sev.upper()} ", style=_SEVERITY_STYLE.get(sev, "bold"))
    t.append(" ")
    t.append(str(f.get("code", "?")), style="bold")
    t.append("  ")
    t.append(str(f.get("subject", "?")), style="bold cyan")
    ident = [f"{k} {f[k]}" for k in ("uuid", "pci_bus_id") if f.get(k)]
    if ident:
        t.append(f"  ({', '.join(ident)})")
    if f.get("id") is not None:
        t.append(f"  #{f['id']}", style="dim")
    return t


def _path_tree(f: dict[str, Any]) -> Tree:
    tree = Tree(Text(f"Decision path (rule {f.get('rule', '?')})", style="bold"))
    steps = f.get("steps") or []
    taken = set(f.get("path") or [])
    if not steps:
        for node in f.get("path") or []:
            tree.add(Text(f"✓ {node}", style="green"))
        return tree
    for s in steps:
        mark, style = _MARK.get(s.get("value"), ("?", "yellow"))
        line = Text(f"{mark} ", style=style)
        line.append(str(s.get("node", "")), style="bold" if s.get("node") in taken else "")
        line.append(f": {s.get('cond', '')}")
        line.append(f"  → {_value(s.get('value'))}", style=style)
        branch = tree.add(line)
        for seen in s.get("seen") or []:
            branch.add(
                Text(
                    f"{seen.get('name')} = {seen.get('text') or _value(seen.get('value'))}",
                    style="dim" if s.get("value") is False else "",
                )
            )
    return tree


def _evidence(f: dict[str, Any]) -> list[Text]:
    lines: list[Text] = []
    for ev in f.get("events") or []:
        t = Text(f"  {when(ev.get('t'))}  ", style="dim")
        t.append(f"{ev.get('stream', '')}  ", style="cyan")
        t.append(str(ev.get("text") or ev.get("fields") or ""))
        lines.append(t)
    for name, value in (f.get("evidence") or {}).items():
        lines.append(Text(f"  {name} = {_value(value)}"))
    return lines


def _whole(text: str, style: str = "") -> Text:
    """A command or URL: never wrapped by rich (a terminal wraps it for the eye, and a copy
    of it pastes whole)."""
    return Text(text, style=style, no_wrap=True, overflow="ignore")


def finding_block(f: dict[str, Any], now: float, gpus: list[dict[str, Any]] | None = None) -> Group:
    """One finding in full (`--verbose`)."""
    parts: list[Any] = [_header(f)]
    since = f.get("first_seen") or f.get("pending_since")
    if f.get("resolved_at"):
        line = Text(f"  resolved {when(f['resolved_at'])}, firing from {when(since)}")
    else:
        line = Text(f"  {f.get('state', 'firing')} since {when(since)}")
        if since is not None:
            line.append(f" ({ago(since, now)})", style="dim")
    parts.append(line)
    if f.get("summary"):
        parts.append(Text(f"  {f['summary']}", style="bold"))
    where = where_line(Incident(root=f, group=[f]), gpus or [])
    if where:
        parts.append(Text(f"  where: {where}"))
    by = f.get("caused_by")
    if isinstance(by, dict):
        tag = f"#{by['id']} " if by.get("id") is not None else ""
        parts.append(
            Text(f"  caused by: {tag}{by.get('code')} on {by.get('subject')} ({by.get('link')})")
        )
    parts.append(Text(""))
    parts.append(_path_tree(f))
    ev = _evidence(f)
    parts.append(Text("Evidence", style="bold"))
    parts.extend(ev or [Text("  (none recorded)", style="dim")])
    nvidia = f.get("nvidia_actions") or []
    if nvidia:
        parts.append(Text("NVIDIA recommends", style="bold"))
        parts.extend(Text(f"  {i}. {a}") for i, a in enumerate(nvidia, 1))
    actions = f.get("actions") or []
    parts.append(Text("What to do (moptd)", style="bold"))
    if actions:
        parts.extend(_whole(f"  {i}. {a}") for i, a in enumerate(actions, 1))
    else:
        parts.append(Text("  (no action given by the rule)", style="dim"))
    if f.get("runbook_command"):
        parts.append(_whole(f"  runbook: {f['runbook_command']}", style="dim"))
    if f.get("runbook"):
        parts.append(_whole(f"  reference: {f['runbook']}", style="dim"))
    related = f.get("related") or []
    if related:
        parts.append(Text("Related findings (same incident)", style="bold"))
        for r in related:
            tag = f"#{r['id']} " if r.get("id") is not None else ""
            how = _LINK_WORDS.get(str(r.get("link")), "")
            parts.append(
                Text(
                    f"  {how}{tag}{r.get('code')} on {r.get('subject')} ({r.get('state')})"
                    f": {r.get('summary', '')}"
                )
            )
    return Group(*parts)


def print_explain(
    view: dict[str, Any], console: Console | None = None, *, verbose: bool = False
) -> None:
    console = console or Console(highlight=False)
    soft = not console.is_terminal  # piped into a ticket: wrap nothing
    now = float(view.get("time") or 0.0)
    blind = view.get("blind") or []
    for line in blind:  # first: what no finding below can mean
        console.print(Text(line, style="bold red"), soft_wrap=soft)
    for note in view.get("notes") or []:
        console.print(Text(note, style="yellow"), soft_wrap=soft)
    findings = view.get("findings") or []
    if not findings:
        what = view.get("asked") or "this host"
        if view.get("source") == "bundle" and not any(
            e.get("used") for e in view.get("read") or []
        ):
            # never a green all-clear over nothing
            console.print(Text("No findings: nothing could be read.", style="bold yellow"))
            return
        if blind:
            console.print(Text(f"No findings for {what} from the sources read: not an all-clear."))
            return
        console.print(Text(f"No active findings for {what}.", style="green"))
        return
    ordered = incidents(findings)
    header(ordered, findings, console, verbose)
    gpus = list(view.get("gpus") or [])
    if not verbose:
        in_header = runbooks_in_header(ordered)
        for n, inc in enumerate(ordered, 1):
            if n > 1:
                console.print()
            incident_block(n, inc, now, gpus, console, local_runbook_in_header=in_header)
        return
    first = True
    for inc in ordered:
        for f in inc.findings:
            if not first:
                console.print(Text("─" * 60, style="dim"))
            first = False
            console.print(finding_block(f, now, gpus), soft_wrap=soft)


def print_status_findings(view: dict[str, Any], console: Console | None = None) -> None:
    """The findings and daemon-health part of `moptd status` (from /v1/status), ranked as
    `moptd explain` ranks them (node-wide causes first, a cause before what it explains);
    piped, each line whole."""
    from moptd.cli.explain_order import incidents

    console = console or Console(highlight=False, soft_wrap=not sys.stdout.isatty())
    store = view.get("findings_store")
    if store:
        if store.get("state") == "ok":
            console.print(Text(f"Findings store: ok ({store.get('path')})", style="dim"))
        else:
            console.print(
                Text(
                    f"Findings store: {store.get('state')}: {store.get('reason')}", style="bold red"
                )
            )
    findings = view.get("findings")
    if findings is None:
        return
    if not findings:
        console.print(Text("Findings: none active", style="green"))
        return
    console.print(
        Text(f"Findings: {len(findings)} active (moptd explain for details)", style="bold")
    )
    for f in [g for inc in incidents(findings) for g in inc.findings]:
        sev = str(f.get("severity", "info"))
        line = Text("  ")
        line.append(f" {sev.upper()} ", style=_SEVERITY_STYLE.get(sev, "bold"))
        line.append(f" {f.get('code')}  {f.get('subject')}  ", style="bold")
        line.append(str(f.get("summary", "")))
        console.print(line)
