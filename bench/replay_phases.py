"""Where one replay's CPU time goes, per phase, without a profiler (issue 32).

    python bench/replay_phases.py BUNDLE [--rounds 3]

Each round in a fresh child process (so imports count): ``time.process_time`` around the
imports, ``load_rules``, ``read_bundle`` and ``replay_timeline``, and inside the walk
around ``evaluate``, the store's ``ingest``, the lifecycle's ``update`` and
``link_findings`` (the walk's rest is the lazily read rows and the loop). Build a bundle
with ``bench/replay_bundle.py`` or ``bench/replay_speed.py``'s ``make_bundle``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import collections, sys, time
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
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for _ in range(args.rounds):
        subprocess.run([sys.executable, "-c", CHILD, str(args.bundle)], check=True)


if __name__ == "__main__":
    main()
