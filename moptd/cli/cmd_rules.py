"""`moptd rules check|test [PATH...]`: lint rule files, run rule tests (both run in CI)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from moptd.cli import EXIT_USAGE


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rules", help="check and test diagnosis rules")
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION")
    check = rsub.add_parser(
        "check", help="schema, unknown signals and names, unreachable branches, codes"
    )
    check.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="rule files or directories "
        "(default: the shipped rules); later paths override earlier ones by id",
    )
    check.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    check.set_defaults(func=cmd_check)
    test = rsub.add_parser("test", help="run *.test.yaml rule tests (promtool-style)")
    test.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="test files or directories (default: the shipped rules)",
    )
    test.add_argument(
        "--no-coverage",
        action="store_true",
        help="do not require a firing and a silent test for every stable rule",
    )
    test.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    test.set_defaults(func=cmd_test)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help(sys.stderr)
    return EXIT_USAGE


def _print_json(obj: dict[str, object]) -> None:
    import json

    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def _paths(args: argparse.Namespace) -> list[Path]:
    from moptd.diagnose.loader import default_rules_dir

    return [Path(p) for p in args.paths] or [default_rules_dir()]


def cmd_check(args: argparse.Namespace) -> int:
    from moptd.daemon.views import links_view
    from moptd.diagnose.lint import lint
    from moptd.diagnose.loader import load_rules

    paths = _paths(args)
    errors, rules = lint(paths)
    links = links_view(load_rules(paths).ruleset.links)
    if args.json:
        problems = [{"file": e.file, "line": e.line, "message": e.message} for e in errors]
        _print_json({"ok": not errors, "rules": rules, "links": links, "problems": problems})
        return 1 if errors else 0
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"{len(errors)} problem(s)", file=sys.stderr)
        return 1
    from moptd.cli.sanitize import escape_text

    for lk in links:  # before the verdict line, which stays the last (scripts read it)
        print(escape_text(_link_line(lk)))
    print(f"{len(links)} links, {rules} rules OK")
    return 0


def _link_line(lk: dict[str, Any]) -> str:
    """One link: what follows from what, over which join, and where it is declared."""
    consequence = ", ".join(map(str, lk["consequence"]))
    cause = ", ".join(map(str, lk["cause"]))
    cond = f" if {lk['if']}" if lk["if"] else ""
    off = "" if lk["enabled"] else " (disabled)"
    return (
        f"link {lk['id']}{off}: {consequence} <- {cause} ({lk['join']}, within "
        f"{lk['within_seconds']:g}s{cond})  {lk['file']}:{lk['line']}"
    )


def cmd_test(args: argparse.Namespace) -> int:
    from moptd.bundle import read_bundle
    from moptd.diagnose.testing import run_tests

    report = run_tests(_paths(args), require_coverage=not args.no_coverage, read_bundle=read_bundle)
    if args.json:
        _print_json(
            {
                "ok": report.ok,
                "files": report.files,
                "tests": report.tests,
                "failures": [
                    {"file": f.file, "line": f.line, "test": f.name, "message": f.message}
                    for f in report.failures
                ],
                "errors": [
                    {"file": e.file, "line": e.line, "message": e.message} for e in report.errors
                ],
            }
        )
        return 0 if report.ok else 1
    for e in report.errors:
        print(e, file=sys.stderr)
    for f in report.failures:
        print(f"FAIL {f}", file=sys.stderr)
    status = "OK" if report.ok else "FAILED"
    print(
        f"{report.tests} tests in {report.files} files: {len(report.failures)} failed, "
        f"{len(report.errors)} errors: {status}"
    )
    return 0 if report.ok else 1
