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
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def daemon(
    n_rules: int, seconds: float, tree: Path, scrapes_per_s: int, fill: bool
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="moptd-rulecost-"))
    rules_d = tmp / "rules.d"
    rules_d.mkdir()
    if n_rules or fill:
        doc, _ = costly_rule_file(n_rules, plan=fill_to_bound() if fill else None)
        (rules_d / "cost.rules.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    port = free_port()
    config = {
        "state_dir": str(tmp / "state"),
        "exporter": {"listen": f"127.0.0.1:{port}"},
        "api": {"socket": str(tmp / "api.sock")},
        "rules": {"paths": [str(default_rules_dir()), str(rules_d)]},
        # 8 GPUs from the recorded H200 backend, so the GPU rules have their subjects
        "collectors": {
            "nvml": {"interval": "1s", "backend": "recorded", "recording": str(RECORDING),
                     "replicate": 8},
            "host": {"interval": "1s"},
        },
    }
    (tmp / "moptd.yaml").write_text(json.dumps(config))
    log = (tmp / "moptd.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moptd", "run", "--config", str(tmp / "moptd.yaml")],
        stdout=log, stderr=subprocess.STDOUT, cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit((tmp / "moptd.log").read_text()[-3000:]) from None
                time.sleep(0.2)
        lat: list[float] = []
        rss: list[float] = []
        t0 = time.monotonic()
        text = ""
        while time.monotonic() - t0 < seconds:
            rss.append(rss_mib(proc.pid))
            for _ in range(scrapes_per_s):
                s0 = time.perf_counter()
                text = urllib.request.urlopen(url, timeout=10).read().decode()
                lat.append((time.perf_counter() - s0) * 1000)
                time.sleep(max(0.0, 1.0 / scrapes_per_s - (time.perf_counter() - s0)))
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
    rules_loaded = next(
        (float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
         if ln.startswith("moptd_rules_loaded")), None,
    )
    gpus = sum(1 for ln in text.splitlines() if ln.startswith("moptd_gpu_temperature"))
    return {
        "rules_added": n_rules,
        "fill": fill,
        "gpus_in_metrics": gpus,
        "tree": str(tree),
        "rules_loaded": rules_loaded,
        "rss_mib_first": round(rss[0], 1),
        "rss_mib_last": round(rss[-1], 1),
        "rss_mib_max": round(max(rss), 1),
        "metrics_p50_ms": round(pct(lat, 0.5), 2),
        "metrics_p99_ms": round(pct(lat, 0.99), 2),
        "metrics_p99_after_10s_ms": round(pct(lat[10 * scrapes_per_s :], 0.99), 2),
        "metrics_max_ms": round(max(lat), 2),
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
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--scrapes-per-s", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--fill", action="store_true",
        help="instead of --rules: one rule per scope taking it to the load-time bound",
    )
    args = ap.parse_args()
    results = []
    runs = [(n, False) for n in args.rules] if not args.fill else [(0, True)]
    if args.fill and args.shipped_too:
        runs = [(0, False), (0, True)]
    for n, fill in runs:
        if args.daemon:
            r = daemon(n, args.seconds, args.tree, args.scrapes_per_s, fill)
        else:
            r = in_process(n, args.ticks, args.history, fill)
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
