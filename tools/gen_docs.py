#!/usr/bin/env python3
"""Regenerate the parts of docs/ that derive from code: docs/metrics.md (from the signal
catalog) and the key reference in docs/configuration.md (from the config schema).

    python tools/gen_docs.py          # rewrite
    python tools/gen_docs.py --check  # exit 1 naming each stale file (CI)
"""

from __future__ import annotations

import argparse
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


def replace_generated(text: str, body: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    if not sep:
        raise SystemExit("docs/configuration.md lacks the generated-section marker")
    _, sep2, tail = rest.partition(END)
    if not sep2:
        raise SystemExit("docs/configuration.md lacks the end marker")
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    targets = {
        REPO / "docs/metrics.md": metrics_doc() + "\n",
    }
    conf = REPO / "docs/configuration.md"
    targets[conf] = replace_generated(conf.read_text(), config_reference())
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
