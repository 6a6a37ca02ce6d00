"""`moptd reload`: ask a running daemon to read its rules and remediation policy again.

It sends SIGHUP to the daemon's pid, after checking that the pid is a `moptd run`, so that
systemd's `ExecReload=` needs nothing outside moptd and systemd (procps' /bin/kill is
missing on minimal hosts and in the image, and `systemctl reload moptd` failed there).
Under systemd the unit passes `--pid $MAINPID`; systemd also sets MAINPID in ExecReload='s
environment, which is the default here. The reload itself runs in the daemon after this
returns: its outcome is in the daemon's log, `moptd rules` and moptd_rules_load_errors.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from moptd.cli import EXIT_USAGE


def _is_moptd_run(pid: int, proc: Path = Path("/proc")) -> bool:
    """The process runs `moptd run` (as the console script or `python -m moptd run`)."""
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [Path(a.decode(errors="replace")).name for a in argv if a]
    return "run" in words and any(w == "moptd" for w in words)


def handler(args: argparse.Namespace) -> int:
    given = args.pid if args.pid is not None else os.environ.get("MAINPID", "")
    try:
        pid = int(given)
    except ValueError:
        print(
            "moptd: reload needs the daemon's pid: --pid PID (under systemd, ExecReload= "
            "passes $MAINPID)" + (f"; not a pid: {given!r}" if given else ""),
            file=sys.stderr,
        )
        return EXIT_USAGE
    if pid <= 1 or not _is_moptd_run(pid):
        print(f"moptd: pid {pid} is not a running `moptd run`: nothing sent", file=sys.stderr)
        return 1
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        print(f"moptd: cannot signal pid {pid}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"reload asked of moptd (pid {pid}): rules and remediation policy are read again")
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "reload",
        help="ask the running daemon to read its rules and remediation policy again (SIGHUP)",
        description="Send SIGHUP to the daemon, after checking the pid is a `moptd run`: "
        "what systemd's ExecReload= runs (`systemctl reload moptd`).",
    )
    p.add_argument(
        "--pid",
        metavar="PID",
        help="the daemon's pid (default: $MAINPID, which systemd sets for ExecReload=)",
    )
    p.set_defaults(func=handler)
