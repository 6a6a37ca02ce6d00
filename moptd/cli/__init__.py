"""The moptd command line."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from moptd import __version__

EXIT_USAGE = 2


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="PATH",
        help="configuration file (default: $MOPTD_CONFIG, else /etc/moptd/moptd.yaml "
        "when it exists, else built-in defaults)",
    )


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only`` (a command whose module is cmd_<only>.py),
    of the further commands only that one's module is imported and added (main()), or all
    where that module adds no command of that name."""
    parser = argparse.ArgumentParser(
        prog="moptd",
        description="Node daemon and diagnostician for NVIDIA GPU inference hosts.",
    )
    parser.add_argument("--version", action="version", version=f"moptd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon in the foreground")
    _add_config(run)
    run.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="override log_level from the configuration",
    )
    run.add_argument(
        "--collector",
        action="append",
        default=[],
        metavar="NAME",
        help="enable a collector (repeatable)",
    )
    run.add_argument(
        "--no-collector",
        action="append",
        default=[],
        metavar="NAME",
        help="disable a collector (repeatable)",
    )

    status = sub.add_parser("status", help="GPUs, host and collector health")
    _add_config(status)
    status.add_argument("--json", action="store_true", help="print JSON for scripts")
    status.add_argument(
        "--offline", action="store_true", help="do not ask the daemon; run one collection pass here"
    )

    check = sub.add_parser(
        "config",
        help="check and print the effective configuration",
        description="Check the configuration and print the effective one (defaults filled "
        "in) as YAML that loads back as a configuration file, or with --json as one "
        'object {"source": ..., "config": {...}}.',
    )
    _add_config(check)
    check.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    check.add_argument(
        "--schema",
        action="store_true",
        help="print the configuration file's JSON Schema (for editors and CI) instead",
    )
    # Further commands live in moptd/cli/cmd_<name>.py, each with
    # add_parser(subparsers) that sets `func` on its parser.
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_") and (only is None or info.name == f"cmd_{only}"):
            importlib.import_module(f"{__name__}.{info.name}").add_parser(sub)
    if only is not None and only not in sub.choices:
        return build_parser()  # its module names no such command: all, as for a typo
    return parser


def _command_module(argv: Sequence[str]) -> str | None:
    """The command a command line names where its module is cmd_<command>.py: its parser
    is then the only further one built. Importing every cmd_*.py and building all their
    parsers was 0.06 s of each command (BENCHMARKS.md, issue 32 on the merged tree); the
    top level has no option but --version and -h, so the first word is the command."""
    first = argv[0] if argv else ""
    if not first.isidentifier() or first.startswith("_"):
        return None  # an option, or a name no module can have (install-service: all)
    spec = importlib.util.find_spec(f"{__name__}.cmd_{first}")
    return first if spec is not None else None


class ClosedPipeGuard:
    """stdout that a reader may close (`moptd replay ... | head -3`): from the first write
    that finds the pipe closed, output goes to /dev/null, so the command runs on to the
    status it would have had, and says nothing about the pipe (neither a traceback nor
    Python's "Exception ignored" at exit)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._to_devnull()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._to_devnull()

    def _to_devnull(self) -> None:
        self.closed_pipe = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            # what the buffer still holds goes there too, at exit's flush
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    if not isinstance(sys.stdout, ClosedPipeGuard) and hasattr(sys.stdout, "fileno"):
        sys.stdout = ClosedPipeGuard(sys.stdout)
    from moptd.cli.sanitize import TerminalStream

    if not isinstance(sys.stderr, TerminalStream):
        # error messages quote evidence (a member name from a tarball, a pasted line): one
        # sanitiser for all of them, not one call at each (issue 30, item 4)
        sys.stderr = TerminalStream(sys.stderr)
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_module(words))
    args = parser.parse_args(words)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    handler = getattr(args, "func", None)
    if handler is None:
        from moptd.cli import commands

        handler = getattr(commands, f"cmd_{args.command}")
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def setup_logging(level: str) -> None:
    from moptd.daemon.sdnotify import log_formatter

    handler = logging.StreamHandler(sys.stderr)
    # under journald: <N> priority prefixes (journald adds the time); elsewhere a timestamp
    handler.setFormatter(log_formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
