#!/usr/bin/env python3
"""Check that runbooks, diagnosis codes and alert rules agree.

The codes come from moptd/diagnose/codes.py, their one declaration. Fails, naming the
offender, when: a diagnosis code has no runbook; a runbook names no known code; a runbook
lacks one of its sections; the runbook index or the table of docs/diagnosis-codes.md misses
a code or lists an unknown one; an alert lacks a summary, a description or a runbook_url, or
its runbook_url points at no file; an alert's code label is no code, or its severity label
differs from the code's default severity; a severity has no alert on the findings of that
severity; an alert queries a metric the catalog lacks; an alert has no firing or no silent
promtool test case.

Usage:
    python tools/check_runbooks.py [--repo DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moptd.diagnose.codes import CODES, SEVERITIES  # noqa: E402

RUNBOOK_BASE = "https://github.com/moptd/moptd/blob/main/"
CODE_TEMPLATE = "docs/runbooks/{{ $labels.code }}.md"
CODE_FILE = re.compile(r"^[A-Z][A-Z0-9_]*\.md$")
CODE_ROW = re.compile(r"^\|\s*\w+\s*\|\s*([A-Z][A-Z0-9_]*)\s*\|\s*(info|warning|critical)\s*\|")
SECTIONS = ("## What it means", "## How to confirm", "## What to do", "## When to escalate")
# a metric moptd exports; a name inside a recorded series' level:metric:operations is not
METRIC = re.compile(r"(?<![:\w])(moptd_[a-zA-Z0-9_]+)\b(?!:)")
RECORDED = re.compile(r"(?<![\w:])([a-zA-Z_]\w*:[\w:]*\w)")


def read_codes(path: Path) -> list[str]:
    return parse_codes(path.read_text(encoding="utf-8"))


def parse_codes(text: str) -> list[str]:
    """The codes of a markdown table whose rows read | layer | CODE | severity | ... |."""
    return [m.group(1) for line in text.splitlines() if (m := CODE_ROW.match(line))]


def check_runbooks(repo: Path, codes: Iterable[str]) -> list[str]:
    problems = []
    known = set(codes)
    directory = repo / "docs" / "runbooks"
    present = {
        p.stem: p
        for p in directory.glob("*.md")
        if CODE_FILE.match(p.name) and p.name != "README.md"
    }
    for code in sorted(known - set(present)):
        problems.append(f"docs/runbooks/{code}.md: missing (every diagnosis code needs a runbook)")
    for code in sorted(set(present) - known):
        problems.append(
            f"docs/runbooks/{code}.md: runbook for {code}, which is not a diagnosis code in "
            "moptd/diagnose/codes.py"
        )
    for code in sorted(set(present) & known):
        text = present[code].read_text(encoding="utf-8")
        if not text.startswith(f"# {code}\n"):
            problems.append(f"docs/runbooks/{code}.md: must start with '# {code}'")
        for section in SECTIONS:
            if f"\n{section}\n" not in text:
                problems.append(f"docs/runbooks/{code}.md: missing section '{section}'")
    index = directory / "README.md"
    index_text = index.read_text(encoding="utf-8") if index.is_file() else ""
    for code in sorted(known):
        if f"]({code}.md)" not in index_text:
            problems.append(f"docs/runbooks/README.md: no link to {code}.md")
    return problems


def _alerts(doc: Any) -> list[dict[str, Any]]:
    out = []
    for group in (doc or {}).get("groups", []) or []:
        for rule in group.get("rules", []) or []:
            if isinstance(rule, dict) and "alert" in rule:
                out.append(rule)
    return out


def check_alert(
    rel: str,
    rule: Mapping[str, Any],
    repo: Path,
    codes: set[str],
    metrics: set[str] | None,
    recorded: set[str] | None = None,
) -> list[str]:
    name = rule.get("alert", "?")
    where = f"{rel}: alert {name}"
    problems = []
    annotations = rule.get("annotations") or {}
    for key in ("summary", "description", "runbook_url"):
        if not str(annotations.get(key, "")).strip():
            problems.append(f"{where}: no {key} annotation")
    labels = rule.get("labels") or {}
    severity = labels.get("severity")
    if severity not in SEVERITIES:
        problems.append(f"{where}: severity label must be {', '.join(SEVERITIES)}")
    code = labels.get("code")
    if code is not None and code not in codes:
        problems.append(f"{where}: code label {code!r} is not a diagnosis code")
    elif code is not None and code in CODES and severity != CODES[code].severity:
        # the alert pages as the finding of that code would, or the two disagree on a node
        problems.append(
            f"{where}: severity {severity} but {code}'s default severity is "
            f"{CODES[code].severity} (moptd/diagnose/codes.py)"
        )
    url = str(annotations.get("runbook_url", ""))
    if url:
        if not url.startswith(RUNBOOK_BASE):
            problems.append(f"{where}: runbook_url must start with {RUNBOOK_BASE}")
        else:
            path = url[len(RUNBOOK_BASE) :]
            if path == CODE_TEMPLATE:
                if "moptd_finding_active" not in str(rule.get("expr", "")):
                    problems.append(
                        f"{where}: a runbook_url templated on $labels.code needs an expression "
                        "over moptd_finding_active (which carries code)"
                    )
            elif not (repo / path).is_file():
                problems.append(f"{where}: runbook_url points to {path}, which does not exist")
            elif code is not None and path != f"docs/runbooks/{code}.md":
                problems.append(f"{where}: code {code} but runbook_url points to {path}")
    if metrics is not None:
        for metric in METRIC.findall(str(rule.get("expr", ""))):
            if metric not in metrics:
                problems.append(f"{where}: queries {metric}, which the metric catalog lacks")
    if recorded is not None:
        for name in RECORDED.findall(str(rule.get("expr", ""))):
            if name not in recorded:
                problems.append(f"{where}: queries {name}, which no rule file records")
    return problems


def _recorded(repo: Path) -> set[str]:
    """The series the shipped rule files record (alerts may query them)."""
    out: set[str] = set()
    for directory in ("alerts", "recording"):
        for path in sorted((repo / "grafana" / directory).glob("*.rules.yaml")):
            try:
                doc = yaml.safe_load(path.read_text(encoding="utf-8"))
            except yaml.YAMLError:
                continue  # named by check_alerts
            for group in (doc or {}).get("groups", []) or []:
                for rule in group.get("rules", []) or []:
                    if isinstance(rule, dict) and "record" in rule:
                        out.add(str(rule["record"]))
    return out


def check_alerts(repo: Path, codes: Iterable[str], metrics: set[str] | None) -> list[str]:
    problems = []
    known = set(codes)
    alert_dir = repo / "grafana" / "alerts"
    names: dict[str, str] = {}
    exprs: list[str] = []
    recorded = _recorded(repo)
    for path in sorted(alert_dir.glob("*.rules.yaml")):
        rel = str(path.relative_to(repo))
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            problems.append(f"{rel}: YAML error: {exc}")
            continue
        for rule in _alerts(doc):
            names[str(rule["alert"])] = rel
            exprs.append(" ".join(str(rule.get("expr", "")).split()))
            problems += check_alert(rel, rule, repo, known, metrics, recorded)
    for severity in SEVERITIES:
        # a new code needs no alert of its own: the finding alerts page for every code
        selector = f'moptd_finding_active{{severity="{severity}"}}'
        if not any(selector in expr for expr in exprs):
            problems.append(
                f"grafana/alerts: no alert on {selector}: findings of severity {severity} "
                "would never page"
            )
    firing: set[str] = set()
    silent: set[str] = set()
    for path in sorted(alert_dir.glob("*.rules.test.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for test in doc.get("tests", []) or []:
            for case in test.get("alert_rule_test", []) or []:
                (firing if case.get("exp_alerts") else silent).add(str(case.get("alertname")))
    for name, rel in sorted(names.items()):
        if name not in firing:
            problems.append(f"{rel}: alert {name} has no promtool test case where it fires")
        if name not in silent:
            problems.append(f"{rel}: alert {name} has no promtool test case where it stays silent")
    return problems


def catalog_metrics(repo: Path) -> set[str] | None:
    sys.path.insert(0, str(repo))
    try:
        from moptd.catalog import CATALOG
    except ImportError:
        return None
    return set(CATALOG.by_metric())


def run(repo: Path) -> list[str]:
    codes = list(CODES)
    problems = []
    codes_doc = repo / "docs" / "diagnosis-codes.md"
    if not codes_doc.is_file():
        problems.append("docs/diagnosis-codes.md: missing")
    else:
        table = read_codes(codes_doc)
        dupes = sorted({c for c in table if table.count(c) > 1})
        problems += [f"docs/diagnosis-codes.md: {c} listed twice" for c in dupes]
        hint = "(run python tools/gen_docs.py)"
        for code in sorted(set(codes) - set(table)):
            problems.append(f"docs/diagnosis-codes.md: {code} is missing from the table {hint}")
        for code in sorted(set(table) - set(codes)):
            problems.append(
                f"docs/diagnosis-codes.md: {code} is not in moptd/diagnose/codes.py {hint}"
            )
    problems += check_runbooks(repo, codes)
    problems += check_alerts(repo, codes, catalog_metrics(repo))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="check runbooks, codes and alert rules")
    parser.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args(argv)
    problems = run(args.repo.resolve())
    for problem in problems:
        print(f"check_runbooks: {problem}", file=sys.stderr)
    if problems:
        return 1
    print("check_runbooks: every code has a runbook, every alert is documented and tested")
    return 0


if __name__ == "__main__":
    sys.exit(main())
