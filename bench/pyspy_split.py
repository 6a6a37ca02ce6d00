#!/usr/bin/env python3
"""Where a daemon's GIL time goes, by part, from py-spy raw profiles of two trees.

Record each tree's daemon with py-spy (`pip install py-spy`; root, or ptrace allowed) while
bench/daemon_steady.py runs it, sampling only the thread that holds the GIL:

    py-spy record -p DAEMON_PID -d 280 -r 1000 --gil --nonblocking -f raw -o this.raw

then

    python bench/pyspy_split.py this.raw other.raw

Each sample goes to the first part, in the order of PARTS, that has a frame on its stack
(so the store's writes made while a rule tick holds the store count as that hold's exit,
and those made directly as the store's); the rest is listed by its innermost frame. A
sample is a millisecond of the GIL at -r 1000: the counts of two runs of the same length
compare directly.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

PARTS = (
    "HostCollector",
    "_GeneratorContextManager.__exit__",  # the writes held during a rule tick, applied
    "SignalStore",
    "RuleService",
    "Diagnosis",
    "NvmlCollector",
    "MetricsEndpoint",
    "ContainerCollector",
    "DaemonJournalCollector",
    "KernelLog",
    "read_self",
    "CollectorRuntime",
    "FindingsDB",
)


def split(path: Path) -> tuple[collections.Counter[str], int]:
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        total += n
        for part in PARTS:
            if any(f.startswith(part) for f in frames):
                parts[part] += n
                break
        else:
            parts["other: " + frames[-1].split(" (")[0]] += n
    return parts, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("this", type=Path)
    ap.add_argument("other", type=Path)
    ap.add_argument("--rows", type=int, default=25)
    args = ap.parse_args()
    a, total_a = split(args.this)
    b, total_b = split(args.other)
    print(f"{'this':>7} {'other':>7}  part (GIL samples)")
    print(f"{total_a:7d} {total_b:7d}  all")
    for key in sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))[: args.rows]:
        print(f"{a[key]:7d} {b[key]:7d}  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
