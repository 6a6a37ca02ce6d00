#!/usr/bin/env python3
"""Long runs of a real `moptd run` against a hostile serving endpoint (issue 30, item 8: "under
rotating labels below the series cap RSS still creeps"), with a memory probe inside the daemon.

Each arm is a tree (and, optionally, environment variables such as MALLOC_ARENA_MAX=2 or
MOPTD_... knobs); every arm runs AT THE SAME TIME, each its own daemon (own config, state dir,
socket and ports) against its own engine, so a loaded machine loads them alike. The engine
serves bench/hostile_endpoint.py's page: the captured vLLM page and ``--rotating`` lines of
``vllm:request_success_total`` whose ``finished_reason`` no earlier page had.

Inside each daemon a probe (a ``sitecustomize`` put on its PYTHONPATH after the tree, so any
tree runs it unchanged) writes one JSON line every ``--every`` seconds: VmRSS and its anonymous
part, ``sys.getallocatedblocks()``, pymalloc's arenas (``sys._debugmallocstats``), glibc's
``mallinfo2`` and arena count (``malloc_stats``), sqlite's ``sqlite3_memory_used``, gc-tracked
objects by type, the signal store's counts and the label cache's size; with ``--tracemalloc``
also the 15 source lines whose traced memory grew most since the first minute.

    python bench/hostile_rss.py --seconds 900 --other /tmp/base --out R.json
    python bench/hostile_rss.py --seconds 900 --arm-env arena2:MALLOC_ARENA_MAX=2 --out R.json
    python bench/hostile_rss.py --seconds 900 --retention 60s --arm-env trim:MOPTD_MEMPROBE_TRIM=1

``MOPTD_MEMPROBE_TRIM=1`` (an experiment, not moptd's code) calls glibc's ``malloc_trim(0)``
after a store eviction that dropped 1,000 series or more.

Run it from the tree under test with that tree's python; ports come from --ports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchenv import add_ports_arg, use_ports
from daemon_bench import REPO, Arm, Daemon, metric, rss_mib
from hostile_endpoint import Engine

PROBE = r'''
import os
_OUT = os.environ.get("MOPTD_MEMPROBE")
if _OUT:
    import collections, ctypes, gc, json, re, sys, tempfile, threading, time

    _TM = os.environ.get("MOPTD_MEMPROBE_TRACEMALLOC") == "1"
    if _TM:
        import tracemalloc
        tracemalloc.start(int(os.environ.get("MOPTD_MEMPROBE_FRAMES", "1")))

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    _libc = ctypes.CDLL("libc.so.6")
    _libc.mallinfo2.restype = _MallInfo2
    try:
        _sq = ctypes.CDLL("libsqlite3.so.0")  # the library _sqlite3 already loaded
        _sq.sqlite3_memory_used.restype = ctypes.c_int64
    except OSError:
        _sq = None

    def _stderr_of(fn):
        """What a C function prints on fd 2 (the daemon's own log lines meanwhile are lost)."""
        with tempfile.TemporaryFile() as f:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(f.fileno(), 2)
            try:
                fn()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            f.seek(0)
            return f.read().decode("utf-8", "replace")

    def _pymalloc():
        out = {}
        for line in _stderr_of(sys._debugmallocstats).splitlines():
            m = re.match(r"^(# arenas allocated current|# bytes in allocated blocks|"
                         r"# bytes in available blocks|# bytes lost to pool headers|"
                         r"# bytes lost to quantization|Total)\s*=\s*([\d,]+)$", line)
            if m:
                out[m.group(1).lstrip("# ")] = int(m.group(2).replace(",", ""))
        return out

    def _glibc_arenas():
        text = _stderr_of(lambda: _libc.malloc_stats())
        return text.count("Arena ")

    def _status():
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "VmData", "Threads"):
                    out[k] = int(v.split()[0])
        return out

    # the daemon freezes its start-up heap (gc.freeze), and gc.get_objects() does not list
    # frozen objects: keep each SignalStore as it is made, through an import hook
    _stores = []

    class _Hook:
        def find_spec(self, name, path, target=None):
            if name != "moptd.store":
                return None
            import importlib.machinery
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                init = module.SignalStore.__init__

                def __init__(self, *a, **k):
                    init(self, *a, **k)
                    _stores.append(self)

                module.SignalStore.__init__ = __init__
                if os.environ.get("MOPTD_MEMPROBE_TRIM") == "1":
                    # the experiment: hand freed heap back to the kernel after a purge
                    evict = module.SignalStore.evict

                    def evict_and_trim(self, now):
                        before = len(self._series)
                        evict(self, now)
                        if before - len(self._series) >= 1000:
                            _libc.malloc_trim(0)

                    module.SignalStore.evict = evict_and_trim

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())

    def _store_counts(objs):
        for o in _stores[-1:]:
            if True:
                c = dict(o.stats())
                c["held"] = dict(o._held)
                c["attrs"] = len(o._attrs)
                c["index"] = len(o._index)
                c["generations"] = len(o.generations)
                c["current_samples"] = sum(len(b.samples) for b in o._current.values())
                return c
        return {}

    def _innermost(tb):
        while tb.tb_next is not None:
            tb = tb.tb_next
        c = tb.tb_frame.f_code
        return f"{c.co_filename.rsplit('/', 2)[-1]}:{c.co_name}:{tb.tb_lineno}"

    def _run():
        base = None
        t0 = time.monotonic()
        every = float(os.environ.get("MOPTD_MEMPROBE_EVERY", "10"))
        n = 0
        while True:
            time.sleep(every)
            n += 1
            rec = {"t": round(time.monotonic() - t0, 1), **_status()}
            rec["allocated_blocks"] = sys.getallocatedblocks()
            rec["pymalloc"] = _pymalloc()
            mi = _libc.mallinfo2()
            rec["mallinfo2"] = {k: getattr(mi, k) for k, _ in _MallInfo2._fields_}
            rec["glibc_arenas"] = _glibc_arenas()
            if _sq is not None:
                rec["sqlite_memory_used"] = _sq.sqlite3_memory_used()
            objs = gc.get_objects()
            rec["gc_objects"] = len(objs)
            rec["gc_frozen"] = gc.get_freeze_count()
            by_type = collections.Counter(type(o).__name__ for o in objs)
            rec["types"] = {k: v for k, v in by_type.most_common(25)}
            rec["store"] = _store_counts(objs)
            rec["frames"] = dict(collections.Counter(
                f"{o.f_code.co_filename.rsplit('/', 2)[-1]}:{o.f_code.co_name}:{o.f_lineno}"
                for o in objs if type(o).__name__ == "frame").most_common(8))
            rec["tracebacks"] = dict(collections.Counter(
                _innermost(o) for o in objs if type(o).__name__ == "traceback").most_common(8))
            del objs
            pt = sys.modules.get("moptd.serving.promtext")
            if pt is not None:
                rec["label_cache"] = len(pt._LABEL_CACHE)
            if _TM:
                snap = tracemalloc.take_snapshot()
                rec["traced"] = tracemalloc.get_traced_memory()[0]
                if base is None and n * every >= 60:
                    base = snap
                elif base is not None:
                    rec["grew"] = [str(s) for s in snap.compare_to(base, "lineno")[:15]]
                del snap
            with open(_OUT, "a") as f:
                f.write(json.dumps(rec) + "\n")

    threading.Thread(target=_run, name="memprobe", daemon=True).start()
'''


def parse_arm_env(spec: str) -> tuple[str, dict[str, str]]:
    name, _, rest = spec.partition(":")
    env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return name, env


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=900.0)
    ap.add_argument("--rotating", type=int, default=1000, help="new label values per page")
    ap.add_argument("--interval", default="500ms", help="the serving collector's interval")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--other", type=Path, help="another tree run beside this one")
    ap.add_argument("--arm-env", action="append", default=[], metavar="NAME:K=V[,K=V]",
                    help="this tree again, with these environment variables")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="environment of every arm")
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--max-series", type=int, help="store.max_series (default: the tree's)")
    ap.add_argument("--host-kmsg", action="store_true",
                    help="read this host's /dev/kmsg (default: an empty file)")
    ap.add_argument("--retention", help="store.retention (default: the tree's, 1h)")
    ap.add_argument("--out", type=Path)
    add_ports_arg(ap)
    args = ap.parse_args()
    use_ports(args.ports)
    common = dict(kv.split("=", 1) for kv in args.env)
    arms: list[tuple[Arm, dict[str, str]]] = [(Arm("this", REPO), dict(common))]
    if args.other is not None:
        arms.append((Arm("other", args.other), dict(common)))
    for spec in args.arm_env:
        name, env = parse_arm_env(spec)
        arms.append((Arm(name, REPO), {**common, **env}))

    probe_dir = Path(tempfile.mkdtemp(prefix="moptd-memprobe-"))
    (probe_dir / "sitecustomize.py").write_text(PROBE)
    runs = []
    for arm, env in arms:
        engine = Engine(args.rotating)
        tmp = Path(tempfile.mkdtemp(prefix=f"moptd-rss-{arm.name}-"))
        probe_out = tmp / "probe.jsonl"
        config: dict[str, Any] = {
            "collectors": {"serving": {
                "interval": args.interval,
                "endpoints": [{"name": "hostile", "url": f"http://127.0.0.1:{engine.port}",
                               "engine": "vllm", "probes": ["health"]}],
            }},
        }
        if not args.host_kmsg:
            # other people's tests write Xid lines to this host's /dev/kmsg: each made GPU
            # subjects and findings, growth that is not the endpoint's
            (tmp / "kmsg").write_bytes(b"")
            config["collectors"]["kernel"] = {"kmsg_path": str(tmp / "kmsg")}
        store: dict[str, Any] = {}
        if args.max_series:
            store["max_series"] = args.max_series
        if args.retention:
            # the store forgets a series unseen this long: the rotating values held at the cap
            # are evicted and as many new ones admitted, once per retention (1 h by default)
            store["retention"] = args.retention
        if store:
            config["store"] = store
        saved = dict(os.environ)
        os.environ.update(env)
        os.environ["MOPTD_MEMPROBE"] = str(probe_out)
        os.environ["MOPTD_MEMPROBE_EVERY"] = str(args.every)
        if args.tracemalloc:
            os.environ["MOPTD_MEMPROBE_TRACEMALLOC"] = "1"
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH", ""), str(probe_dir)) if p)
        try:
            d = Daemon(arm, config, tmp)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        runs.append({"arm": arm, "env": env, "engine": engine, "daemon": d, "probe": probe_out,
                     "rss": [], "metrics": {}})
    try:
        for r in runs:
            r["daemon"].wait_up()
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < args.seconds:
            line = [f"{elapsed:6.0f}s"]
            for r in runs:
                mib = rss_mib(r["daemon"].proc.pid)
                r["rss"].append((round(elapsed, 1), round(mib, 1)))
                line.append(f"{r['arm'].name} {mib:.1f} MiB")
            print("  ".join(line), f"load {os.getloadavg()[0]:.1f}", flush=True)
            time.sleep(max(0.0, args.every - (time.monotonic() - t0 - elapsed)))
        for r in runs:
            text = urllib.request.urlopen(r["daemon"].url, timeout=10).read().decode()
            r["metrics"] = {
                "series_dropped_total": metric(
                    text, "moptd_store_series_dropped_total", collector="serving"),
                "serving_up": metric(text, "moptd_serving_up", serving="hostile"),
                "daemon_cpu_seconds": metric(text, "moptd_daemon_cpu_seconds_total"),
            }
    finally:
        for r in runs:
            r["daemon"].stop()
    result: dict[str, Any] = {"argv": sys.argv[1:], "seconds": args.seconds,
                              "rotating_per_page": args.rotating, "arms": {}}
    for r in runs:
        probe = [json.loads(x) for x in r["probe"].read_text().splitlines()] \
            if r["probe"].exists() else []
        mibs = [m for _, m in r["rss"]]
        result["arms"][r["arm"].name] = {
            "tree": str(r["arm"].tree), "env": r["env"],
            "pages_served": r["engine"].scrapes,
            "rss_mib_first": mibs[0], "rss_mib_last": mibs[-1], "rss_mib_max": max(mibs),
            "rss_mib_series": r["rss"], **r["metrics"], "probe": probe,
            "state": str(r["daemon"].tmp),
        }
        print(r["arm"].name, json.dumps({k: v for k, v in result["arms"][r["arm"].name].items()
                                         if k not in ("probe", "rss_mib_series")}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
