"""The replay walk with two versions of moptd/diagnose/engine.py, alternately, in one
process (issue 32): for a change to the engine alone, finer than a pair of whole replays.

    git show REV:moptd/diagnose/engine.py > /tmp/engine_old.py
    python bench/replay_walk_ab.py BUNDLE /tmp/engine_old.py [--rounds 6]

The old file is loaded as a module beside the current one and must work with the current
expr and store (an engine from before a change to those does not). Each round replays the
same bundle with each engine (old, new; new, old; ...), timing ``replay_timeline`` with
``time.process_time``; prints the medians and every round.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

from moptd.bundle import read_bundle
from moptd.diagnose import engine as new_engine
from moptd.diagnose import replay
from moptd.diagnose.loader import default_rules_dir, load_rules


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", type=Path)
    ap.add_argument("old_engine", type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("engine_old", args.old_engine)
    assert spec is not None
    assert spec.loader is not None
    old_engine = importlib.util.module_from_spec(spec)
    sys.modules["engine_old"] = old_engine  # dataclasses look their module up
    spec.loader.exec_module(old_engine)
    ruleset = load_rules([default_rules_dir()]).ruleset
    times: dict[str, list[float]] = {"old": [], "new": []}
    sides = [("old", old_engine), ("new", new_engine)]
    for r in range(args.rounds):
        for name, mod in sides if r % 2 == 0 else sides[::-1]:
            replay.evaluate, replay.Reuse = mod.evaluate, mod.Reuse  # type: ignore[attr-defined]
            tl = read_bundle(args.bundle)
            c = time.process_time()
            replay.replay_timeline(tl, ruleset)
            times[name].append(time.process_time() - c)
    replay.evaluate, replay.Reuse = new_engine.evaluate, new_engine.Reuse
    for name, got in times.items():
        rounds = " ".join(f"{t:.3f}" for t in got)
        print(f"{name}: median {statistics.median(got):.3f} s CPU (rounds {rounds})")


if __name__ == "__main__":
    main()
