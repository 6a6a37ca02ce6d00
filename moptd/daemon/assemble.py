"""The collectors a configuration enables, and the runtime that runs them.

Apart from moptd/daemon/app.py so that a read-only command's one collection pass
(`moptd status --offline`, `moptd explain --offline`, `moptd doctor`) builds exactly the
daemon's collectors without importing the daemon's HTTP server, API and exporter (about
0.14 s a call: BENCHMARKS.md, issue 31).
"""

from __future__ import annotations

from moptd.collector import Collector, CollectorContext
from moptd.collectors import registry
from moptd.collectors.versions import global_options_of
from moptd.config import Config
from moptd.daemon.runtime import CollectorRuntime
from moptd.kernel.xid_tally import XidTally
from moptd.store import SignalStore


def build_collectors(config: Config) -> dict[str, tuple[Collector, float, float]]:
    known = registry()
    out: dict[str, tuple[Collector, float, float]] = {}
    xids = XidTally()  # one for the kernel-log and NVML collectors: an Xid counts once
    versions = global_options_of(config.raw)  # the serving environments whose versions count
    for name, cc in config.collectors.items():
        if not cc.enabled or name not in known:
            continue
        ctx = CollectorContext(
            options=cc.options,
            procfs=config.procfs,
            sysfs=config.sysfs,
            devfs=config.host_root / "dev",
            etc=config.host_root / "etc",
            host_root=config.host_root,
            state_dir=config.state_dir,
            global_options={"watch_paths": config.watch_paths, **versions},
            xids=xids,
        )
        out[name] = (known[name](ctx), cc.interval, cc.timeout)
    return out


def make_runtime(config: Config, store: SignalStore) -> CollectorRuntime:
    collectors = build_collectors(config)
    runtime = CollectorRuntime(store, collectors)
    for collector, _, _ in collectors.values():
        collector.ctx.publish = runtime.publish
    return runtime
