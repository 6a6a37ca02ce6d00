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
from moptd.diagnose.links import JOINS  # noqa: E402
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
        "not zero. The *signal* column is the name rules and `moptd explain` use. Each series",
        "is written once: where two readings name the same one (a managed engine's KV-cache",
        "capacity, from its page and from its log), the later one's value is written.",
        "",
        "Every enabled collector is in the output from the first scrape after a start: until it",
        "has run once, `moptd_collector_success` is NaN (no `== 0` alert matches it). A scrape",
        "that sends `Accept-Encoding: gzip` (Prometheus does) gets a gzip body, compressed once",
        "per collection like the text itself (about 6 KB for the 28 KB of one 8-GPU host).",
        "",
        "A *histogram* is the serving engine's own: its `_bucket{le}` series, `_sum` and",
        "`_count` are the engine's cumulative values passed through (summed over data-parallel",
        "ranks), so they reset when the engine restarts, as Prometheus expects of counters.",
        "Aggregate it across hosts with",
        "`histogram_quantile(0.99, sum by (le) (rate(X_bucket[$__rate_interval])))`.",
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
                le = ("le",) if s.kind == "histogram" else ()  # _bucket's; _sum/_count lack it
                labels = ", ".join([*SUBJECT_LABELS.get(s.subject, ()), *s.labels, *le]) or "-"
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
    return "\n".join(out + dcgm_section())


def dcgm_section() -> list[str]:
    from moptd.catalog.dcgm import DCGM_UNITS, NOT_PROVIDED

    provided = sorted(
        (s.dcgm, s.metric, DCGM_UNITS[s.dcgm])
        for s in CATALOG.values()
        if s.metric and s.dcgm in DCGM_UNITS and not s.labels
    )
    out = [
        "## dcgm-exporter compatibility",
        "",
        "`grafana/recording/moptd-dcgm.rules.yaml` (generated from the *dcgm-exporter* column",
        "above and the units in `moptd/catalog/dcgm.py`) records the `DCGM_FI_*` series an",
        "existing dcgm-exporter dashboard or alert reads, converted to DCGM's units and with",
        "dcgm-exporter's labels: `gpu`, `UUID`, `device` (`nvidia<gpu>`), `modelName`,",
        "`pci_bus_id` and `DCGM_FI_DRIVER_VERSION`. Load it in Prometheus beside moptd's alert",
        "rules. Two differences: `pci_bus_id` keeps moptd's form (`0000:3b:00.0`, where",
        "dcgm-exporter prints NVML's `00000000:3B:00.0`), and there is no `hostname` label",
        "(`instance` names the host). Tested on a real Prometheus scraping moptd over a real",
        "H200 recording, where every panel of NVIDIA's own dcgm-exporter dashboard",
        "(`tests/fixtures/dcgm-exporter/`) returns data unchanged",
        "(`tests/test_prometheus_e2e.py`), and with `promtool test rules`",
        "(`grafana/recording/moptd-dcgm.rules.test.yaml`).",
        "",
        "| DCGM field | from | DCGM unit |",
        "|---|---|---|",
        *(f"| {d} | `{m}` | {u} |" for d, m, u in provided),
        "",
        "Not provided (dcgm-exporter's default fields, and one often enabled), and why:",
        "",
        *(f"- {d}: {why}." for d, why in sorted(NOT_PROVIDED.items())),
        "",
    ]
    return out


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
    link = schema["$defs"]["link"]["properties"]
    link["consequence"]["items"]["enum"] = list(CODES)
    link["cause"]["items"]["enum"] = list(CODES)
    link["join"]["enum"] = list(JOINS)
    return json.dumps(schema, indent=2) + "\n"


# dcgm-exporter's labels (internal/pkg/rendermetrics/render_metrics.go at d5e5f51): gpu,
# UUID, pci_bus_id, device, modelName, and the driver version as DCGM_FI_DRIVER_VERSION.
# moptd's own gpu and uuid stay; instance and job identify the host. Recorded once, first in
# the group (a group's rules run in order, each seeing the ones before), and joined to each.
DCGM_IDENTITY = "moptd:dcgm_gpu_identity"
_DCGM_LABELS = "UUID, device, modelName, pci_bus_id, DCGM_FI_DRIVER_VERSION"
# topk: one identity per GPU even while a driver upgrade leaves two moptd_gpu_info series
# for a few minutes (a join to two would fail the whole rule)
_IDENTITY_EXPR = (
    "topk by (instance, job, gpu, uuid) (1,\n"
    "  max by (instance, job, gpu, uuid, " + _DCGM_LABELS + ") (\n"
    "    label_replace(label_replace(label_replace(label_replace(moptd_gpu_info,\n"
    '      "UUID", "$1", "uuid", "(.+)"),\n'
    '      "device", "nvidia$1", "gpu", "(.+)"),\n'
    '      "modelName", "$1", "name", "(.+)"),\n'
    '      "DCGM_FI_DRIVER_VERSION", "$1", "driver_version", "(.+)")\n'
    "  )\n"
    ")\n"
)


def _scaled(metric: str, factor: float) -> str:
    if factor == 1.0:
        return metric
    if factor < 1.0:
        return f"{metric} / {round(1 / factor)}"
    return f"{metric} * {factor:g}"


def dcgm_recording_rules() -> str:
    """grafana/recording/moptd-dcgm.rules.yaml: the DCGM_FI_* series an existing
    dcgm-exporter dashboard reads, from moptd's metrics, converted to DCGM's units."""
    from moptd.catalog.dcgm import DCGM_UNITS, FACTORS

    lines = [
        "# Generated by tools/gen_docs.py from moptd/catalog (the dcgm column) and",
        "# moptd/catalog/dcgm.py (DCGM's units); do not edit. See docs/metrics.md.",
        "groups:",
        "  - name: moptd-dcgm-compat",
        "    rules:",
        f"      - record: {DCGM_IDENTITY}",
        "        expr: |",
        *("          " + line for line in _IDENTITY_EXPR.splitlines()),
    ]
    for spec in sorted(CATALOG.values(), key=lambda s: s.dcgm):
        if not spec.metric or spec.dcgm not in DCGM_UNITS or spec.labels:
            continue
        factor = FACTORS.get((spec.unit, DCGM_UNITS[spec.dcgm]))
        if factor is None:
            raise SystemExit(
                f"{spec.name}: no factor from {spec.unit!r} to {DCGM_UNITS[spec.dcgm]!r}"
            )
        lines += [
            f"      - record: {spec.dcgm}",
            "        expr: |",
            f"          {_scaled(spec.metric, factor)}",
            f"          * on (instance, job, gpu, uuid) group_left ({_DCGM_LABELS})",
            f"          {DCGM_IDENTITY}",
        ]
    return "\n".join(lines) + "\n"


def _parser() -> Any:
    import os

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: fix it here
    from moptd.cli import build_parser

    return build_parser()


def exit_status_rows() -> list[tuple[str, int, str]]:
    from moptd.cli.exit_status import ANY_COMMAND, EXIT_STATUS

    rows = [(cmd, code, text) for cmd, codes in EXIT_STATUS.items() for code, text in codes]
    return rows + [("any command", code, text) for code, text in ANY_COMMAND]


def cli_doc() -> str:
    """docs/cli.md: the exit status table, shell completion and the man page."""
    lines = [
        "# The command line",
        "",
        "Generated by `tools/gen_docs.py` from `moptd/cli/exit_status.py` (every command's exit",
        "status, declared once) and the argument parser; CI fails when this file is stale.",
        "`moptd --help` and `moptd COMMAND --help` give each command's options; `man moptd`",
        "(from `docs/man/moptd.1`) gives them all on one page.",
        "",
        "## Exit status",
        "",
        "| command | status | means |",
        "|---|---|---|",
        *(f"| `moptd {c}` | {n} | {t} |" if c != "any command" else f"| any command | {n} | {t} |"
          for c, n, t in exit_status_rows()),
        "",
        "Scripts: `moptd doctor` and `moptd replay` exit by the worst thing they found (0 / 1 /",
        "2), so `moptd replay ticket.txt || page` works; 3 from `replay` means moptd could not",
        "read what it was given, never \"healthy\". Every command with `--json` prints exactly",
        "one JSON object on stdout; messages go to stderr.",
        "",
        "## Shell completion and the man page",
        "",
        "Generated from the parser (shtab, argparse-manpage) into `contrib/completion/` and",
        "`docs/man/`:",
        "",
        "```bash",
        "sudo install -m 0644 contrib/completion/moptd.bash \\",
        "    /usr/share/bash-completion/completions/moptd",
        "sudo install -m 0644 contrib/completion/_moptd /usr/share/zsh/vendor-completions/_moptd",
        "sudo install -m 0644 docs/man/moptd.1 /usr/share/man/man1/moptd.1 && man moptd",
        "```",
        "",
    ]
    return "\n".join(lines)


def man_page() -> str:
    from argparse_manpage.manpage import Manpage  # type: ignore[import-untyped]

    from moptd import __version__

    page = str(
        Manpage(
            _parser(),
            _data={
                "project_name": "moptd",
                "version": __version__,
                "manual_title": "moptd manual",
                "description": "node daemon and diagnostician for NVIDIA GPU inference hosts",
            },
            format="single-commands-section",
        )
    )
    # No date: argparse-manpage writes today's (or SOURCE_DATE_EPOCH's) into .TH when given
    # none, so the committed page went stale every midnight. The version names the page;
    # the .TH line is ours, with the date field empty (man(7) allows it).
    head, sep, body = page.partition("\n")
    if not head.startswith(".TH ") or not sep:
        raise SystemExit(f"argparse-manpage's page does not start with .TH: {head[:60]!r}")
    page = f'.TH MOPTD "1" "" "moptd {__version__}" "moptd manual"\n{body}'
    status = [".SH EXIT STATUS"]
    for cmd, code, text in exit_status_rows():
        status += [".TP", f"\\fB{cmd}\\fR {code}", text.replace("-", "\\-")]
    return page.rstrip("\n") + "\n" + "\n".join(status) + "\n"


def completion(shell: str) -> str:
    import shtab

    return str(shtab.complete(_parser(), shell=shell))


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
        REPO / "grafana/recording/moptd-dcgm.rules.yaml": dcgm_recording_rules(),
        REPO / "docs/cli.md": cli_doc(),
        REPO / "docs/man/moptd.1": man_page(),
        REPO / "contrib/completion/moptd.bash": completion("bash"),
        REPO / "contrib/completion/_moptd": completion("zsh"),
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
                path.parent.mkdir(parents=True, exist_ok=True)
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
