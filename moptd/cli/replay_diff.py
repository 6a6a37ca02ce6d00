"""`moptd replay --diff A B`: what changed between two bundles.

Versions first (each bundle's versions.json: driver, its CUDA version, kernel module, GPUs,
each serving environment's distributions), then the findings: opened (in B, not in A) and
closed (in A, not in B), by (code, subject). Each side is replayed as `moptd replay` would.
Exit status: 0 nothing changed, 1 versions or findings changed, 3 an input (or the rule
set) could not be used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_SAME = 0
EXIT_CHANGED = 1
EXIT_BAD_INPUT = 3


def cmd_diff(args: argparse.Namespace) -> int:
    from moptd.bundle import BundleError
    from moptd.bundle.intake import read_inputs
    from moptd.cli.bundle_guard import BundleRefused, check_bundle
    from moptd.cli.cmd_replay import report_unusable
    from moptd.diagnose.loader import default_rules_dir, load_rules
    from moptd.diagnose.replay import replay_timeline

    if len(args.inputs) != 2:
        print("moptd replay --diff: give exactly two inputs, A and B", file=sys.stderr)
        return EXIT_BAD_INPUT
    rules = [Path(r) for r in args.rules] or [default_rules_dir()]
    loaded = load_rules(rules)
    if loaded.errors:
        for err in loaded.errors:
            print(err, file=sys.stderr)
        return EXIT_BAD_INPUT
    reports = []
    for name in args.inputs:
        try:
            tl = read_inputs([name], sys.stdin.buffer, check_bundle)
            report = replay_timeline(tl, loaded.ruleset)
        except (BundleError, BundleRefused) as e:
            print(f"moptd replay --diff: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if report_unusable(report.read, "moptd replay --diff"):
            return EXIT_BAD_INPUT
        reports.append(report)
    out = diff_reports(args.inputs[0], reports[0], args.inputs[1], reports[1])
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_diff(out)
    changed = out["versions"]["changes"] or out["findings"]["opened"] or out["findings"]["closed"]
    return EXIT_CHANGED if changed else EXIT_SAME


def diff_reports(name_a: str, a: Any, name_b: str, b: Any) -> dict[str, Any]:
    from moptd.serving.version_lock import diff

    va, vb = a.meta.get("versions"), b.meta.get("versions")
    keys_a = {_key(f): f for f in a.findings}
    keys_b = {_key(f): f for f in b.findings}
    return {
        "a": name_a,
        "b": name_b,
        "versions": {
            "recorded": {"a": va is not None, "b": vb is not None},
            "changes": diff(va, vb) if va is not None and vb is not None else [],
        },
        "findings": {
            "opened": [_brief(keys_b[k]) for k in sorted(set(keys_b) - set(keys_a))],
            "closed": [_brief(keys_a[k]) for k in sorted(set(keys_a) - set(keys_b))],
            "both": [_brief(keys_b[k]) for k in sorted(set(keys_a) & set(keys_b))],
        },
    }


def _key(f: dict[str, Any]) -> tuple[str, str]:
    return str(f.get("code")), str(f.get("subject"))


def _brief(f: dict[str, Any]) -> dict[str, Any]:
    return {k: f.get(k) for k in ("code", "subject", "severity", "summary")}


def print_diff(out: dict[str, Any]) -> None:
    print(f"Changes from {out['a']} to {out['b']}")
    v = out["versions"]
    missing = [side for side in ("a", "b") if not v["recorded"][side]]
    if missing:
        names = " and ".join(out[side] for side in missing)
        print(f"versions: not recorded in {names}")
    elif not v["changes"]:
        print("versions: the same")
    else:
        print("versions:")
        for c in v["changes"]:
            before = c["before"] if c["before"] is not None else "(absent)"
            after = c["after"] if c["after"] is not None else "(absent)"
            print(f"  {c['what']}: {before} -> {after}")
    f = out["findings"]
    for label, items in (("opened", f["opened"]), ("closed", f["closed"])):
        print(f"findings {label}: {len(items)}")
        for item in items:
            print(f"  {item['code']} on {item['subject']} ({item['severity']}): {item['summary']}")
    print(f"findings in both: {len(f['both'])}")
