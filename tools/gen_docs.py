#!/usr/bin/env python3
"""Regenerate the files and sections that derive from code: docs/metrics.md (from the signal
catalog), the key reference in docs/configuration.md (from the config schema), and from the
diagnosis codes (moptd/diagnose/codes.py) the code, layer and severity enums of
rules/schema/moptd-rules.schema.json (its action kinds from moptd/diagnose/model.py) and the
code tables of docs/diagnosis-codes.md and docs/runbooks/README.md; the engine table of
docs/serving.md from the engine registry (moptd/serving/engines/).

    python tools/gen_docs.py          # rewrite
    python tools/gen_docs.py --check  # exit 1 naming each stale file (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moptd.catalog import CATALOG  # noqa: E402
from moptd.collectors import registry  # noqa: E402
from moptd.config import full_schema  # noqa: E402
from moptd.daemon.exporter import SUBJECT_LABELS  # noqa: E402
from moptd.diagnose.codes import CODES, LAYERS, SEVERITIES  # noqa: E402
from moptd.diagnose.model import ACTION_KINDS  # noqa: E402
from moptd.serving.engines import REGISTRY  # noqa: E402

BEGIN = "<!-- BEGIN GENERATED: tools/gen_docs.py -->"
END = "<!-- END GENERATED -->"


def metrics_doc() -> str:
    out = [
        "# Metrics",
        "",
        "Every metric moptd exports, generated from the signal catalog (`moptd/catalog/`) by",
        "`tools/gen_docs.py`; CI fails when this file is stale. Names follow Prometheus",
        "conventions: `moptd_` prefix, base units, `_total` only on counters, ratios 0-1, no",
        "hostname label (add it as a target label in the scrape config).",
        "",
        "A scrape renders the latest collection: it never calls NVML. A GPU, process or serving",
        "endpoint that goes away disappears from the output. `NotSupported` values are absent,",
        "not zero. The *signal* column is the name rules and `moptd explain` use.",
        "",
        "Every enabled collector is in the output from the first scrape after a start: until it",
        "has run once, `moptd_collector_success` is NaN (no `== 0` alert matches it). A scrape",
        "that sends `Accept-Encoding: gzip` (Prometheus does) gets a gzip body, compressed once",
        "per collection like the text itself (about 6 KB for the 28 KB of one 8-GPU host).",
        "",
    ]
    groups: dict[str, list[Any]] = {}
    for spec in CATALOG.values():
        groups.setdefault(spec.name.split(".")[0], []).append(spec)
    for ns in sorted(groups):
        specs = groups[ns]
        exported = [s for s in specs if s.metric]
        if exported:
            out += [
                f"## {ns}",
                "",
                "| metric | type | labels | signal | help | dcgm-exporter |",
                "|---|---|---|---|---|---|",
            ]
            for s in sorted(exported, key=lambda s: s.metric):
                labels = ", ".join([*SUBJECT_LABELS.get(s.subject, ()), *s.labels]) or "-"
                kind = "gauge" if s.kind == "info" else s.kind
                help_text = s.help.replace("|", "\\|")
                out.append(
                    f"| `{s.metric}` | {kind} | {labels} | `{s.name}` | {help_text} | "
                    f"{s.dcgm or '-'} |"
                )
            out.append("")
        internal = [s for s in specs if not s.metric]
        if internal:
            out += [
                f"Signals of `{ns}` kept for rules only (not exported):",
                "",
                "| signal | kind | unit | fields | help |",
                "|---|---|---|---|---|",
            ]
            for s in sorted(internal, key=lambda s: s.name):
                fields = ", ".join(s.fields) or "-"
                help_text = s.help.replace("|", "\\|")
                out.append(f"| `{s.name}` | {s.kind} | {s.unit or '-'} | {fields} | {help_text} |")
            out.append("")
    return "\n".join(out)


def _schema_rows(schema: Mapping[str, Any], prefix: str = "") -> list[str]:
    rows = []
    for key, spec in schema.items():
        path = f"{prefix}{key}"
        if isinstance(spec, dict):
            rows += _schema_rows(spec, path + ".")
            continue
        types, default, help_text = spec
        if callable(default):
            shown = "depends on the user (see above)"
        elif key.endswith("_mode") and isinstance(default, int):
            shown = f"`{default:#o}`"
        else:
            shown = f"`{default!r}`"
        names = {
            str: "string",
            int: "integer",
            float: "number",
            bool: "bool",
            list: "list",
            type(None): "null",
        }
        type_text = " or ".join(names.get(t, t.__name__) for t in types)
        rows.append(f"| `{path}` | {type_text} | {shown} | {help_text} |")
    return rows


def config_reference() -> str:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    rows += _schema_rows(full_schema(registry()))
    return "\n".join(rows)


def code_table(link_runbooks: bool) -> str:
    """The table of diagnosis codes; the runbook index links each code to its runbook."""
    meaning = "meaning" if link_runbooks else "what it means"
    rows = [f"| layer | code | default severity | {meaning} |", "|---|---|---|---|"]
    for code, info in CODES.items():
        shown = f"[{code}]({code}.md)" if link_runbooks else code
        rows.append(f"| {info.layer} | {shown} | {info.severity} | {info.meaning} |")
    return "\n".join(rows)


def engine_table() -> str:
    """The serving engines of moptd/serving/engines/ (docs/serving.md)."""
    rows = [
        "| engine | `engine:` | default `metrics_path` | read by its own reader | its series "
        "| its own log lines |",
        "|---|---|---|---|---|---|",
    ]
    for e in REGISTRY.values():
        readers = ", ".join(f"`{path}`" for path in e.page_readers) or "-"
        series = ", ".join(f"`{p}`" for p in (*e.prefixes, *e.aliases))
        lines = ", ".join(f"`{needle}`" for needle, _ in e.log_parsers) or "-"
        module = f"[{e.name}.py](../moptd/serving/engines/{e.name}.py)"
        rows.append(
            f"| {e.title} ({module}) | `{e.name}` | `{e.metrics_path}` | {readers} | {series} "
            f"| {lines} |"
        )
    return "\n".join(rows)


def rules_schema(text: str) -> str:
    """The rule schema with its code, layer and severity enums taken from codes.py (and the
    action kinds from the rule model)."""
    schema = json.loads(text)
    schema["$defs"]["rule"]["properties"]["layer"]["enum"] = list(LAYERS)
    schema["$defs"]["action"]["properties"]["kind"]["enum"] = list(ACTION_KINDS)
    verdict = schema["$defs"]["verdict"]["properties"]
    verdict["code"]["enum"] = list(CODES)
    verdict["severity"]["enum"] = list(SEVERITIES)
    return json.dumps(schema, indent=2) + "\n"


def replace_generated(text: str, body: str, rel: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    if not sep:
        raise SystemExit(f"{rel} lacks the generated-section marker {BEGIN}")
    _, sep2, tail = rest.partition(END)
    if not sep2:
        raise SystemExit(f"{rel} lacks the end marker {END}")
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    targets = {
        REPO / "docs/metrics.md": metrics_doc() + "\n",
    }
    sections = {
        "docs/configuration.md": config_reference(),
        "docs/diagnosis-codes.md": code_table(link_runbooks=False),
        "docs/runbooks/README.md": code_table(link_runbooks=True),
        "docs/serving.md": engine_table(),
    }
    for rel, body in sections.items():
        targets[REPO / rel] = replace_generated((REPO / rel).read_text(), body, rel)
    schema = REPO / "rules/schema/moptd-rules.schema.json"
    targets[schema] = rules_schema(schema.read_text())
    stale = []
    for path, content in targets.items():
        current = path.read_text() if path.exists() else ""
        if current != content:
            stale.append(path)
            if not args.check:
                path.write_text(content)
    if args.check and stale:
        for path in stale:
            print(
                f"{path.relative_to(REPO)} is stale: run python tools/gen_docs.py", file=sys.stderr
            )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
