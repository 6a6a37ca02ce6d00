#!/usr/bin/env python3
"""The costliest rule set the load-time bound accepts (issue 18, item 2): its tick time, its
memory, and /metrics while a real daemon runs it.

Every expression is built at the per-expression limits (moptd/diagnose/expr.py: 500 tokens,
1,000 nodes after macro expansion, 32 levels): a GPU rule whose condition ORs macros of
window functions over an hour, each term a signal and window no other term reads (so the
per-tick memo and the shared sliding aggregates do not help), every term false (so no OR
stops early). ``--rules N`` of them are added to the shipped set.

    python bench/rule_cost.py --rules 1 2 4 8 16          # in-process: tick ms and memory
    python bench/rule_cost.py --daemon --rules 8 --seconds 60   # a real `moptd run`
    python bench/rule_cost.py --daemon --fill --seconds 45 --other /tmp/base --rounds 3 \
        --switch-interval 0.001 --out ab.json   # side by side (bench/daemon_bench.py)

In-process it fills the store as bench/rules_tick.py does (8 GPUs, an hour of 1 s history)
and times RuleService.tick() (CPU time). With ``--daemon`` it writes the set to a rules.d,
runs `moptd run` with it and times /metrics scrapes as bench/hostile_endpoint.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchenv import add_ports_arg, use_ports
from daemon_bench import REPO, Arm, Daemon, arms_from, latency_figures, metric, side_by_side
from percentile import pct
from rules_tick import batch_at

from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.diagnose import expr
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.rule_cost import MAX_TICK_READS, SUBJECTS, rule_reads
from moptd.diagnose.service import RuleService
from moptd.store import SignalStore

GAUGE_FUNCS = ("max", "min", "avg", "slope", "changes")
COUNTER_FUNCS = ("increase", "rate", "changes", "max")
RECORDING = Path(__file__).resolve().parent.parent / "tests/fixtures/h200/nvml_recording_h200.jsonl"
SIGNALS = {
    scope: sorted(
        (s.name, s.kind)
        for s in CATALOG.values()
        if s.subject == scope and s.kind in ("gauge", "counter") and not s.labels
    )
    for scope in ("gpu", "serving", "node")
}


def _term(k: int, scope: str = "gpu") -> str:
    # a window of its own per term: 3600 s, 3599 s, ... (memo keys and aggregates differ)
    signals = SIGNALS[scope]
    sig, kind = signals[k % len(signals)]
    funcs = COUNTER_FUNCS if kind == "counter" else GAUGE_FUNCS
    func = funcs[(k // len(signals)) % len(funcs)]
    return f"{func}({sig}, {3600 - k % 3000}s) > 1e12"


def shipped_reads() -> dict[str, int]:
    held: dict[str, set[str]] = {}
    for rule in load_rules([default_rules_dir()]).ruleset.rules:
        held.setdefault(rule.scope, set()).update(rule_reads(rule))
    return {scope: len(reads) for scope, reads in held.items()}


def fill_to_bound() -> list[tuple[str, int]]:
    """(scope, terms) for the costliest set the bound accepts: the GPU reads to the bound
    (the costliest per read: one per GPU), then what is left as node reads."""
    shipped = shipped_reads()
    used = sum(n * SUBJECTS.get(sc, 1) for sc, n in shipped.items())
    gpu = (MAX_TICK_READS - used) // SUBJECTS["gpu"]
    rest = MAX_TICK_READS - used - gpu * SUBJECTS["gpu"]
    return [(sc, n) for sc, n in (("gpu", gpu), ("node", rest)) if n > 0]


def costly_rule_file(
    n_rules: int, first_term: int = 0, plan: list[tuple[str, int]] | None = None
) -> tuple[dict[str, Any], int]:
    """A rule file of n_rules GPU rules at the expression limits (or one rule per scope
    with the given number of terms); the terms it uses."""
    macros: dict[str, str] = {}
    rules = []
    k = first_term
    plan = plan or [("gpu", 10**9)] * n_rules
    for r, (scope, budget) in enumerate(plan):
        names: list[str] = []
        used = 0
        while used < budget:
            # the largest macro body under the token limit
            terms: list[str] = []
            while used + len(terms) < budget:
                trial = " or ".join([*terms, _term(k + len(terms), scope)])
                if len(expr._TOKEN.findall(trial)) > expr.MAX_TOKENS:
                    break
                terms.append(_term(k + len(terms), scope))
            name = f"cost_r{r}_m{len(names)}"
            candidate = {**macros, name: " or ".join(terms)}
            comp = expr.Compiler(CATALOG, macros=candidate, scope=scope)
            try:
                comp.cost(" or ".join([*names, name]))
            except expr.ExprError:
                break  # the condition would pass MAX_NODES
            macros = candidate
            names.append(name)
            k += len(terms)
            used += len(terms)
        rules.append(
            {
                "id": f"cost-{r}",
                "title": "a rule at the cost limits",
                "description": "bench/rule_cost.py",
                "layer": "hardware",
                "scope": scope,
                "status": "experimental",
                "decide": [
                    {
                        "id": "all",
                        "if": " or ".join(names),
                        "verdict": {
                            "code": "THERMAL_THROTTLE",
                            "summary": "{{subject}}",
                            "actions": [{"kind": "inspect", "instruction": "none"}],
                            "runbook": "https://example.invalid/rule-cost",
                        },
                    }
                ],
            }
        )
    return {"schema": "moptd.rules/v1", "macros": macros, "rules": rules}, k - first_term


def in_process(n_rules: int, ticks: int, history: int, fill: bool) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="moptd-rulecost-"))
    doc, terms = costly_rule_file(n_rules, plan=fill_to_bound() if fill else None)
    (tmp / "cost.rules.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    loaded = load_rules([default_rules_dir(), tmp])
    if loaded.errors:
        return {"rules_added": n_rules, "refused": [str(e) for e in loaded.errors[:3]]}
    random.seed(1)
    clock = VirtualClock(1_000_000.0)
    store = SignalStore(clock=clock)
    rss0 = rss_mib(os.getpid())
    svc = RuleService(store, clock, [default_rules_dir(), tmp])
    assert not svc.errors, svc.errors
    t = clock.now()
    for _ in range(history):
        store.ingest("bench", batch_at(t), t)
        t += 1
        clock.set(t)
    rss1 = rss_mib(os.getpid())
    times = []
    for _ in range(ticks):
        store.ingest("bench", batch_at(t), t)
        t0 = time.process_time()
        svc.tick(t)
        times.append((time.process_time() - t0) * 1000)
        t += 1
        clock.set(t)
    rss2 = rss_mib(os.getpid())
    return {
        "rules_added": len(doc["rules"]),
        "terms": terms,
        "rules_total": len(svc.ruleset.rules),
        "tick_median_ms": round(statistics.median(times), 3),
        "tick_p99_ms": round(pct(times, 0.99), 3),
        "tick_first_ms": round(times[0], 3),
        "rss_mib_before_rules": round(rss0, 1),
        "rss_mib_after_history": round(rss1, 1),
        "rss_mib_after_ticks": round(rss2, 1),
        "rss_mib_growth_in_ticks": round(rss2 - rss1, 1),
        "maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


DAEMON_KEYS = ("rss_mib_last", "metrics_p50_ms", "metrics_p99_ms", "metrics_p99_after_10s_ms",
               "metrics_max_ms", "daemon_cpu_seconds", "ticks_over_budget")


def daemon(
    n_rules: int, seconds: float, arm: Arm, scrapes_per_s: int, fill: bool
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="moptd-rulecost-"))
    rules_d = tmp / "rules.d"
    rules_d.mkdir()
    if n_rules or fill:
        doc, _ = costly_rule_file(n_rules, plan=fill_to_bound() if fill else None)
        (rules_d / "cost.rules.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    config = {
        "rules": {"paths": [str(default_rules_dir()), str(rules_d)]},
        # 8 GPUs from the recorded H200 backend, so the GPU rules have their subjects
        "collectors": {
            "nvml": {"interval": "1s", "backend": "recorded", "recording": str(RECORDING),
                     "replicate": 8},
            "host": {"interval": "1s"},
        },
    }
    d = Daemon(arm, config, tmp)
    try:
        d.wait_up()
        lat, rss_at, text = d.scrape_for(seconds, scrapes_per_s)
    finally:
        d.stop()
    rss = [m for _, m in rss_at]
    gpus = sum(1 for ln in text.splitlines() if ln.startswith("moptd_gpu_temperature"))
    return {
        "rules_added": n_rules,
        "fill": fill,
        "gpus_in_metrics": gpus,
        "tree": str(arm.tree),
        "switch_interval": arm.switch_interval,
        "rules_loaded": metric(text, "moptd_rules_loaded"),
        "rss_mib_first": round(rss[0], 1),
        "rss_mib_last": round(rss[-1], 1),
        "rss_mib_max": round(max(rss), 1),
        **latency_figures(lat, scrapes_per_s),
        "daemon_cpu_seconds": metric(text, "moptd_daemon_cpu_seconds_total"),
        "ticks_over_budget": metric(text, "moptd_rule_ticks_over_budget_total"),
        "load1_at_end": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rules", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    ap.add_argument("--shipped-too", action="store_true",
                    help="with --fill: run the shipped set alone first, then the filled one")
    ap.add_argument("--ticks", type=int, default=60)
    ap.add_argument("--history", type=int, default=3600)
    ap.add_argument("--daemon", action="store_true")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--tree", type=Path, default=REPO, help="--daemon: the tree to run")
    ap.add_argument("--other", type=Path,
                    help="--daemon: another tree (a git archive) run alternately with --tree")
    ap.add_argument("--switch-interval", type=float,
                    help="--daemon: also run the tree with sys.setswitchinterval(S) at start")
    ap.add_argument("--rounds", type=int, default=1, help="--daemon: runs of each arm")
    ap.add_argument("--scrapes-per-s", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--fill", action="store_true",
        help="instead of --rules: one rule per scope taking it to the load-time bound",
    )
    add_ports_arg(ap)
    args = ap.parse_args()
    use_ports(args.ports)
    results = []
    runs = [(n, False) for n in args.rules] if not args.fill else [(0, True)]
    if args.fill and args.shipped_too:
        runs = [(0, False), (0, True)]
    arms = [a if a.name == "other" else replace(a, tree=args.tree)
            for a in arms_from(args.other, args.switch_interval)]
    if args.daemon and len(arms) > 1:
        for n, fill in runs:
            summary = side_by_side(
                arms, args.rounds,
                lambda arm, n=n, fill=fill: daemon(n, args.seconds, arm, args.scrapes_per_s, fill),
                DAEMON_KEYS,
            )
            summary["rules_added"], summary["fill"] = n, fill
            results.append(summary)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1) + "\n")
        return 0
    for n, fill in runs:
        if args.daemon:
            r = daemon(n, args.seconds, arms[0], args.scrapes_per_s, fill)
        else:
            r = in_process(n, args.ticks, args.history, fill)
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
