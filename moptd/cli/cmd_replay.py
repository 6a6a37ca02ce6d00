"""`moptd replay BUNDLE [--json] [--rules DIR]`: the diagnosis a live daemon would have given."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_BAD_BUNDLE = 2
EXIT_BAD_RULES = 1


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="evaluate the rules over a recorded bundle")
    p.add_argument("bundle", metavar="BUNDLE", help="bundle directory or .tar.gz")
    p.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    p.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="DIR",
        help="rule files or directories (repeatable; default: the shipped rules; "
        "later ones override earlier ones by id)",
    )
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from moptd.bundle import BundleError, read_bundle
    from moptd.cli.bundle_guard import BundleRefused, check_bundle
    from moptd.cli.replay_progress import TerminalProgress
    from moptd.diagnose.loader import default_rules_dir
    from moptd.diagnose.replay import RulesInvalid, replay

    rules = [Path(r) for r in args.rules] or [default_rules_dir()]
    progress = TerminalProgress(sys.stderr)  # a line on stderr, on a terminal only
    try:
        check_bundle(Path(args.bundle))
        report = replay(Path(args.bundle), rules, read_bundle, progress)
    except (BundleError, BundleRefused) as e:
        print(f"moptd replay: {e}", file=sys.stderr)
        return EXIT_BAD_BUNDLE
    except RulesInvalid as e:
        for err in e.errors:
            print(err, file=sys.stderr)
        return EXIT_BAD_RULES
    finally:
        progress.finish()
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=1, sort_keys=False)
        sys.stdout.write("\n")
        return 0
    from moptd.cli.render_findings import render_replay

    render_replay(report)
    return 0
