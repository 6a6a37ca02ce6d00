"""`moptd history [SUBJECT] [--json]`: each GPU board's hardware faults, kept by serial.

Read-only: it opens the daemon's findings database in the state directory read-only (the
daemon may be running) and changes nothing. SUBJECT is a GPU (gpu:0, gpu:<bus>), a serial,
a UUID or a PCI address; every fault of the board(s) it names is listed, also those the
board had under another index or address (after a reboot, a move or re-enumeration).
See docs/runbooks/GPU_FAULT_RECURRING.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from moptd.cli import EXIT_USAGE

EXIT_NO_DATABASE = 1


def handler(args: argparse.Namespace) -> int:
    from moptd.cli.commands import load
    from moptd.findings.queries import read_board_history

    config = load(args)
    if config is None:
        return EXIT_USAGE
    rows, problem = read_board_history(config.state_dir, args.subject)
    if args.json:
        out: dict[str, Any] = {"subject": args.subject, "faults": rows}
        if problem:
            out["error"] = problem
        json.dump(out, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    elif problem:
        print(f"moptd history: {problem}", file=sys.stderr)
    else:
        print_history(rows, args.subject)
    return EXIT_NO_DATABASE if problem else 0


def history_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per board, oldest fault first: when, code, where, what was advised and done."""
    from moptd.cli.explain_compact import when

    by_board: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_board.setdefault(str(r["board"]), []).append(r)
    out: list[str] = []
    for board, faults in by_board.items():
        ids = sorted({str(f[k]) for f in faults for k in ("serial", "uuid") if f.get(k)})
        out.append(
            f"Board {board}" + (f" ({', '.join(ids)})" if ids else "") + f": "
            f"{len(faults)} hardware fault{'s' if len(faults) != 1 else ''}"
        )
        for f in sorted(faults, key=lambda f: float(f["t"])):
            where = str(f["subject"]) + (f" ({f['pci_bus_id']})" if f.get("pci_bus_id") else "")
            state = (
                f"resolved {when(f['resolved_at'])}"
                if f.get("resolved_at")
                else str(f.get("state") or "record pruned")
            )
            out.append(f"  {when(f['t'])}  {f['code']} ({f['severity']}) on {where}; {state}")
            if f.get("summary"):
                out.append(f"      {f['summary']}")
            advised = [  # the kinds: the commands are in the finding (explain)
                str(a.get("kind", "")) if isinstance(a, dict) else str(a).split(":", 1)[0]
                for a in f.get("actions") or []
            ]
            if advised:
                out.append(f"      advised: {', '.join(advised)}")
            for m in f.get("remedies") or []:
                out.append(
                    f"      done: {when(m['t'])} {m['remedy']}: {m['outcome']}"
                    + (f" ({m['reason']})" if m.get("reason") else "")
                )
    return out


def print_history(rows: list[dict[str, Any]], subject: str | None) -> None:
    if not rows:
        who = f" for {subject}" if subject else ""
        print(f"No hardware faults recorded{who}.")
        return
    for line in history_lines(rows):
        print(line)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from moptd.cli import _add_config

    p = subparsers.add_parser(
        "history",
        help="each GPU board's hardware faults, by serial across resets and reboots (read-only)",
        description="List the hardware faults the daemon recorded for each GPU board (by "
        "serial, else UUID, else PCI address), across resets, reboots and re-enumeration, "
        "with what was advised and done. Reads the findings database read-only.",
    )
    _add_config(p)
    p.add_argument(
        "subject",
        nargs="?",
        metavar="SUBJECT",
        help="a GPU (gpu:0, gpu:<bus>), serial, UUID or PCI address; all boards without it",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=handler)
