"""`moptd explain`'s "What moptd did": the remedies the remediation policy chose for the
findings shown (the audit trail, docs/remediation.md), after the findings themselves."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from moptd.cli.explain_compact import when

OUTCOME_STYLE = {
    "done": "green",
    "dry-run": "cyan",
    "failed": "red",
    "suppressed-by-guard": "yellow",
    "verifying": "yellow",
}


def remedy_lines(findings: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(text, outcome) for every remedy recorded on the findings, oldest first."""
    rows = sorted(
        (r for f in findings for r in f.get("remediations") or []),
        key=lambda r: float(r.get("t") or 0.0),
    )
    out = []
    for r in rows:
        outcome = str(r.get("outcome", ""))
        text = (
            f"{when(float(r.get('t') or 0.0))}  {r.get('remedy')} for {r.get('code')} on "
            f"{r.get('subject')}: {outcome}. {r.get('reason', '')} "
            f"({r.get('actor', 'moptd')}, {r.get('entry', '')})"
        )
        out.append((text, outcome))
    return out


def print_remedies(view: dict[str, Any], console: Console | None = None) -> None:
    lines = remedy_lines(list(view.get("findings") or []))
    if not lines:
        return
    console = console or Console(highlight=False)
    console.print()
    console.print(Text("What moptd did", style="bold"))
    for text, outcome in lines:
        console.print(
            Text(f"  {text}", style=OUTCOME_STYLE.get(outcome, "")),
            soft_wrap=not console.is_terminal,
        )
