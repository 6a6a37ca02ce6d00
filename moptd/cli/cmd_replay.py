"""`moptd replay INPUT... [--json] [--verbose] [--rules DIR]`: the diagnosis a live daemon
would have given, over a bundle or over whatever was pasted (docs/bundle.md)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# as `moptd doctor`: the worst finding's severity; 3: an input that could not be used
EXIT_BY_SEVERITY = {"critical": 2, "warning": 1}
EXIT_BAD_INPUT = 3
EXIT_BAD_BUNDLE = EXIT_BAD_INPUT
EXIT_BAD_RULES = EXIT_BAD_INPUT

EPILOG = """\
INPUT is a bundle directory, a .tar.gz bundle, or any file as it was pasted into a ticket:
a kernel log (dmesg in any format, journalctl -k, syslog, /dev/kmsg), nvidia-smi -q, -q -x,
the nvidia-smi table or its failure message, a vLLM, SGLang, TensorRT-LLM or PyTorch log,
modprobe/insmod output, lsmod or /proc/modules, ls -l /dev/nvidia*,
/proc/driver/nvidia/version, dkms status; or one file holding several of these (a ticket
body), or - for standard input. The content decides what a file is, not its name; the
report starts with what was read and names every file or section that was not used.

examples:
  moptd replay ticket-1234.txt
  moptd replay dmesg.txt nvidia-smi-q.txt vllm.log
  journalctl -k -b | moptd replay -
  moptd replay bundle.tar.gz --json
  moptd replay --diff before.tar.gz after.tar.gz

exit status: 0 no warning or critical finding, 1 the worst is a warning, 2 the worst is
critical, 3 an input (or a --rules file) could not be used at all. With --diff: 0 nothing
changed, 1 versions or findings changed, 3 an input could not be used.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="evaluate the rules over a recorded bundle or pasted files",
        description="Evaluate the rules over a bundle or pasted files, as a live daemon "
        "would have over that evidence.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="bundle directory, .tar.gz, a pasted file, or - (standard input)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    p.add_argument(
        "--diff",
        action="store_true",
        help="compare two inputs A B: versions (versions.json), then findings opened and "
        "closed; exit 0 the same, 1 changed, 3 an input could not be used",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="each finding as a tree (decision path, evidence, every action) and the rules "
        "left undecided for missing evidence, with their conditions; without it, the answer "
        "`moptd explain --bundle` gives",
    )
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
    if args.diff:
        from moptd.cli.replay_diff import cmd_diff

        return cmd_diff(args)
    from moptd.bundle import BundleError
    from moptd.bundle.intake import read_inputs
    from moptd.cli.bundle_guard import BundleRefused, check_bundle
    from moptd.cli.replay_progress import TerminalProgress
    from moptd.cli.sanitize import escape_text
    from moptd.diagnose.loader import default_rules_dir, load_rules
    from moptd.diagnose.replay import replay_timeline

    rules = [Path(r) for r in args.rules] or [default_rules_dir()]
    loaded = load_rules(rules)
    if loaded.errors:
        for err in loaded.errors:
            print(err, file=sys.stderr)
        return EXIT_BAD_RULES
    progress = TerminalProgress(sys.stderr)  # a line on stderr, on a terminal only
    progress.reading(escape_text(", ".join(str(i) for i in args.inputs)))
    try:
        tl = read_inputs(args.inputs, sys.stdin.buffer, check_bundle)
        # a long stream (gpu/samples.jsonl) is read as it is replayed: its bad line too
        report = replay_timeline(tl, loaded.ruleset, progress(tl))
    except (BundleError, BundleRefused) as e:
        print(f"moptd replay: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        progress.finish()
    bad = report_unusable(report.read, "moptd replay")
    code = exit_status(report.findings, bad)
    versions: Any = report.meta.get("versions")
    if args.json:
        json.dump({**report.to_json(), "versions": versions}, sys.stdout, indent=1, sort_keys=False)
        sys.stdout.write("\n")
        return code
    from moptd.cli.sanitize import for_terminal
    from moptd.serving.version_lock import cuda_line

    if args.verbose:  # the tree: every finding's decision path, evidence and actions
        from moptd.cli.render_findings import render_replay

        render_replay(for_terminal(report), verbose=True)  # --json above keeps it exact
    else:  # the answer `moptd explain --bundle` gives for the same inputs
        from moptd.cli.cmd_explain import explained, replay_view
        from moptd.cli.drain_fit import UNKNOWN
        from moptd.cli.render_explain import print_explain
        from moptd.cli.render_findings import print_undecided

        view = replay_view(list(args.inputs), tl, report, bad)
        view["asked"] = "these inputs"
        explained(view, loaded.ruleset, UNKNOWN)  # a bundle's host cannot be looked at
        print_explain(for_terminal(view))
        print_undecided(report)
    print("versions: " + (cuda_line(versions) if versions is not None else "not recorded"))
    return code


def report_unusable(read: Sequence[dict[str, object]], prog: str) -> bool:
    """Name on stderr each input that could not be used (moptd.bundle.intake.unusable);
    True when there was one: the command then exits 3."""
    from moptd.bundle.intake import unusable
    from moptd.cli.sanitize import escape_text

    bad = unusable(read)
    for entry in bad:
        where = entry.get("at") or entry["input"]
        print(escape_text(f"{prog}: {where}: not used: {entry['reason']}"), file=sys.stderr)
    return bool(bad)


def exit_status(findings: list[dict[str, object]], input_unusable: bool) -> int:
    if input_unusable:
        return EXIT_BAD_INPUT
    return max((EXIT_BY_SEVERITY.get(str(f.get("severity")), 0) for f in findings), default=0)
