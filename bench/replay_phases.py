"""Where one replay's CPU time goes, per phase, without a profiler (issue 32).

    python bench/replay_phases.py BUNDLE [--rounds 3]
    python bench/replay_phases.py BUNDLE --tree A --tree B --rounds 7   # paired, medians

Each round in a fresh child process (so imports count): ``time.process_time`` around the
imports, ``load_rules``, ``read_bundle`` and ``replay_timeline``, and inside the walk
around ``evaluate``, the store's ``ingest``, the lifecycle's ``update`` and
``link_findings`` (the walk's rest is the lazily read rows and the loop). Build a bundle
with ``bench/replay_bundle.py`` or ``bench/replay_speed.py``'s ``make_bundle``.

With ``--tree`` (repeatable; any tree that has ``moptd.bundle.read_bundle``) each child runs
with PYTHONPATH and working directory set to that tree, the trees alternate round by round
(A, B; B, A; ...) so a shared machine's load falls on all alike, and each phase's median
per tree is printed last, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import collections, json, sys, time
from pathlib import Path
t0 = time.process_time()
from moptd.bundle import read_bundle
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose import replay as R
t1 = time.process_time()
ruleset = load_rules([default_rules_dir()]).ruleset
t2 = time.process_time()
tl = read_bundle(Path(sys.argv[1]))
t3 = time.process_time()
spent = collections.Counter()
def timed(name, fn):
    def call(*a, **k):
        c = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            spent[name] += time.process_time() - c
    return call
R.evaluate = timed("evaluate", R.evaluate)
R.link_findings = timed("links", R.link_findings)
R.Lifecycle.update = timed("lifecycle", R.Lifecycle.update)
R.SignalStore.ingest = timed("ingest", R.SignalStore.ingest)
R.replay_timeline(tl, ruleset)
t4 = time.process_time()
inside = ", ".join(f"{k} {v:.3f}" for k, v in spent.items())
print(f"imports {t1 - t0:.3f} s, rules {t2 - t1:.3f}, reading {t3 - t2:.3f}, "
      f"walk {t4 - t3:.3f} ({inside})")
print("PHASES " + json.dumps({"imports": t1 - t0, "rules": t2 - t1, "reading": t3 - t2,
                              "walk": t4 - t3, "total": t4 - t0, **spent}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", type=Path, action="append", default=[],
                    help="a tree to measure (repeatable: the trees alternate round by round)")
    args = ap.parse_args()
    if not args.tree:
        for _ in range(args.rounds):
            subprocess.run([sys.executable, "-c", CHILD, str(args.bundle)], check=True)
        return
    trees = [t.resolve() for t in args.tree]
    bundle = args.bundle.resolve()
    print(f"bundle {bundle}; trees: {', '.join(map(str, trees))}; "
          f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    got: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(1, args.rounds + 1):
        for tree in trees if r % 2 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            out = subprocess.run([sys.executable, "-c", CHILD, str(bundle)], cwd=tree, env=env,
                                 check=True, capture_output=True, text=True).stdout
            line = next(x for x in out.splitlines() if x.startswith("PHASES "))
            got[tree].append(json.loads(line[len("PHASES "):]))
            print(f"round {r} {tree}: {out.splitlines()[0]}", flush=True)
    for tree, rows in got.items():
        names = list(rows[0])
        med = ", ".join(f"{n} {statistics.median(x.get(n, 0.0) for x in rows):.3f}"
                        for n in names)
        print(f"median {tree}: {med}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
