"""Lines of `moptd explain` for the 20 findings of tests/fixtures/explain-drill (issue 16
target: at most 80 by default), piped and on terminals of a few widths.

Piped is what a ticket gets (`moptd explain | cat`, COLUMNS as given); a terminal is rendered
by the same code with rich told it is one. With --tree OTHER, the same bundle is explained by
that tree's moptd too (piped only: an older one may not know --verbose), side by side.

    python bench/explain_lines.py [--tree OTHER_TREE] [--columns 80]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DRILL = "tests/fixtures/explain-drill"


def piped(tree: Path, columns: int, *extra: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": str(columns), "TZ": "UTC"}
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "explain", "--bundle", str(REPO / DRILL), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tree,
        check=True,
    )
    return out.stdout


def on_terminal(view: dict[str, Any], width: int, verbose: bool = False) -> str:
    from rich.console import Console

    from moptd.cli.render_explain import print_explain

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=True, color_system=None)
    print_explain(view, console, verbose=verbose)
    return buf.getvalue()


def bundle_view_as_cli_builds_it() -> dict[str, Any]:
    """What `moptd explain --bundle` renders (the JSON leaves out the GPU list)."""
    from moptd.cli.cmd_explain import add_related, bundle_view, enrich
    from moptd.cli.explain_facts import annotate, load_ruleset
    from moptd.diagnose.loader import default_rules_dir

    view = bundle_view(REPO / DRILL)
    assert view is not None
    ruleset = load_ruleset([default_rules_dir()])
    view["findings"] = [annotate(enrich(f), ruleset) for f in view["findings"]]
    add_related(view["findings"])
    return view


def lines(text: str) -> int:
    return len(text.splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tree", type=Path, help="another moptd tree to compare with")
    ap.add_argument("--columns", type=int, default=80)
    args = ap.parse_args()
    view = bundle_view_as_cli_builds_it()
    findings = view["findings"]
    assert isinstance(findings, list)
    row = {
        "findings": len(findings),
        "piped": lines(piped(REPO, args.columns)),
        "piped_verbose": lines(piped(REPO, args.columns, "--verbose")),
        **{f"terminal_{w}": lines(on_terminal(view, w)) for w in (80, 100, 120, 160)},
        "longest_piped_line": max(map(len, piped(REPO, args.columns).splitlines())),
    }
    print(json.dumps({"tree": str(REPO), "columns": args.columns, **row}))
    if args.tree:
        text = piped(args.tree.resolve(), args.columns)
        print(json.dumps({"tree": str(args.tree), "columns": args.columns, "piped": lines(text)}))


if __name__ == "__main__":
    main()
