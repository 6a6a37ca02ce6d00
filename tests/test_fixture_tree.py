"""The collectors over a fixture root, node_exporter style, and live == replay.

The fixture root is a temporary tree in the live layout (proc/, etc/, dev/) holding copies
of the real H200 captures in tests/fixtures/h200/ (never edited). What a root tree cannot
hold comes through a Source, as it does live: statvfs from the host's real `df -P`
capture (df.txt), the /dev nodes from its real `ls -l` (dev_nodes.txt), NVML from the
recorded backend (nvml_recording_h200.jsonl). The host collector also needs /proc/stat,
which no capture holds: the test copies this machine's, and leaves out every family it
feeds.

1. /metrics golden: the host, driver, container and NVML collectors run through the real
   CollectorRuntime into the real store; the real exporter renders /metrics, diffed
   against tests/golden/metrics_fixture_tree.prom. Set MOPTD_UPDATE_GOLDEN=1 to rewrite it
   after a deliberate change.
2. live == replay: the same captures once as that root tree through the live collectors,
   once as a bundle through read_bundle: the node.*, driver.*, container.* and gpu.*
   samples are equal, but for those only a live host can give (LIVE_ONLY, by name).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from moptd.bundle import read_bundle
from moptd.bundle.sources import parse_dev_nodes, parse_df_usage
from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.collector import Collector, CollectorContext, DiskUsage, GpuIdentities
from moptd.collectors.container import ContainerCollector
from moptd.collectors.driver import DriverCollector
from moptd.collectors.host import HostCollector
from moptd.collectors.nvml import NvmlCollector
from moptd.daemon.exporter import TextRenderer
from moptd.daemon.runtime import CollectorRuntime
from moptd.gpu.batch import gpu_batch
from moptd.gpu.readings import StaticReading
from moptd.gpu.recorded import RecordedBackend, sample_row
from moptd.host_source import LiveSource
from moptd.observations import Batch, Sample
from moptd.proc.pci import pci_key
from moptd.store import SignalStore
from tests.conftest import FIXTURES

H200 = FIXTURES / "h200"
RECORDING = H200 / "nvml_recording_h200.jsonl"
GOLDEN = Path(__file__).parent / "golden" / "metrics_fixture_tree.prom"

# bundle file -> (its real capture, where a live host has it)
CAPTURES = {
    "host/meminfo": ("meminfo", "proc/meminfo"),
    "host/swappiness": ("swappiness", "proc/sys/vm/swappiness"),
    "kernel/proc_modules": ("proc_modules", "proc/modules"),
    "kernel/driver_version": ("proc_driver_nvidia_version", "proc/driver/nvidia/version"),
    "kernel/tainted": ("tainted", "proc/sys/kernel/tainted"),
    "kernel/uname_r": ("uname_r", "proc/sys/kernel/osrelease"),
}
# Families whose values depend on the machine running the test or on the time: this
# machine's /proc/stat (boot time, CPU count and use; no load average is copied), the
# runtime's collector.* health (durations, last success), the age of NVML readings, and
# the build (the Python version). Named by signal; /metrics names them through the catalog.
UNSTABLE_SIGNALS = (
    "node.boot_time",
    "node.cpu_count",
    "node.cpu_util",
    "node.load1",
    "node.load5",
    "node.load15",
    "gpu.sample_age",
    "node.build",
    *(name for name in CATALOG if name.startswith("collector.")),
    # one sample per collector in its health batch, like collector.*: in completion order
    "store.series_dropped",
)
UNSTABLE_FAMILIES = tuple(
    str(CATALOG[name].metric) for name in UNSTABLE_SIGNALS if CATALOG[name].metric
)
# What only a live host tells: /proc/stat, running processes, the NVSwitch directory,
# Secure Boot and lockdown, which engines are installed (binaries, sockets).
LIVE_ONLY = {
    "node.boot_time",
    "node.cpu_count",
    "node.cpu_util",
    "node.load1",
    "node.load5",
    "node.load15",
    "driver.persistenced_running",
    "driver.nvswitch_present",
    "driver.fabricmanager_running",
    "driver.secure_boot",
    "driver.kernel_lockdown",
    "container.engine_present",
}
# A configuration file that is absent: live says "not configured" (0), a bundle without
# the file says nothing (not recorded). Neither tree nor bundle has one.
ABSENT_CONFIG = {
    ("container.nvidia_runtime_configured", "node", (("engine", engine),), 0.0)
    for engine in ("docker", "containerd")
}


class CaptureSource(LiveSource):
    """The live source, with statvfs, /dev and NVML answered from the real captures."""

    def __init__(self) -> None:
        self.disks = parse_df_usage((H200 / "df.txt").read_text(), "df.txt")
        self.nodes = parse_dev_nodes((H200 / "dev_nodes.txt").read_text())
        self.nvml = RecordedBackend.from_file(RECORDING)

    def disk_usage(self, path: Path) -> DiskUsage | None:
        return self.disks.get(str(path))

    def device_nodes(self, dev: Path) -> Mapping[str, os.stat_result | None] | None:
        return self.nodes

    def stat(self, path: Path) -> os.stat_result | None:
        return None

    def gpu_identities(self, procfs: Path) -> GpuIdentities:
        index: dict[str, int] = {}
        uuid: dict[str, str] = {}
        for i in range(self.nvml.device_count()):
            s = self.nvml.read_static(i)
            index[pci_key(s.pci_bus_id)] = i
            uuid[pci_key(s.pci_bus_id)] = s.uuid
        return GpuIdentities(index, uuid, self.nvml.driver_version())


def live_tree(root: Path) -> Path:
    for capture, live in CAPTURES.values():
        (root / live).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(H200 / capture, root / live)
    shutil.copy("/proc/stat", root / "proc/stat")
    for d in ("etc", "dev", "sys", "bin", "run"):
        (root / d).mkdir(exist_ok=True)
    return root


def stack_collectors(
    root: Path, source: CaptureSource
) -> list[HostCollector | DriverCollector | ContainerCollector]:
    def ctx(**options: object) -> CollectorContext:
        return CollectorContext(
            options=options,
            procfs=root / "proc",
            sysfs=root / "sys",
            devfs=root / "dev",
            etc=root / "etc",
            source=source,
            state_dir=root / "state",
            global_options={"watch_paths": list(source.disks)},
        )

    engines = ("docker", "containerd", "podman", "crio")
    sockets = {f"{e}_socket": str(root / "run" / f"{e}.sock") for e in engines}
    return [
        HostCollector(ctx()),
        DriverCollector(ctx(use_tools=False)),
        ContainerCollector(
            ctx(cdi_dirs=["/etc/cdi"], search_path=str(root / "bin"), use_tools=False, **sockets)
        ),
    ]


def render_fixture_tree(root: Path) -> str:
    source = CaptureSource()
    clock = VirtualClock(1_795_974_810.0)
    store = SignalStore(clock)
    nvml = NvmlCollector(
        CollectorContext(
            options={"backend": "recorded", "recording": str(RECORDING), "xid_events": False},
            clock=clock,
        )
    )
    collectors: dict[str, tuple[Collector, float, float]] = {
        c.name: (c, 5.0, 5.0) for c in [*stack_collectors(root, source), nvml]
    }
    runtime = CollectorRuntime(store, collectors)

    async def run() -> None:
        await runtime.start(loops=False)
        try:
            for _ in range(2):  # NVML reports the read the previous pass started
                await runtime.run_once()
                await nvml.settle()
        finally:
            await runtime.stop()

    asyncio.run(run())
    clock.set(max(1_795_974_810.0, max(h.last_run for h in runtime.health.values())))
    text = TextRenderer().render(store.snapshot()).decode()
    return _without(text, UNSTABLE_FAMILIES)


def _without(text: str, families: tuple[str, ...]) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        name = line.split()[2] if line.startswith("#") else re.split(r"[{ ]", line, maxsplit=1)[0]
        if name not in families:
            out.append(line)
    return "".join(out)


def test_metrics_over_the_fixture_tree_golden(tmp_path: Path) -> None:
    text = render_fixture_tree(live_tree(tmp_path / "root"))
    if os.environ.get("MOPTD_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"{GOLDEN} missing: run with MOPTD_UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text()
    # the evidence reached /metrics: memory, the driver module, the H200 under load
    assert "moptd_node_memory_total_bytes " in text
    assert 'moptd_driver_module_loaded{module="nvidia"} 1.0' in text
    assert 'moptd_gpu_info{' in text


# --- live == replay ----------------------------------------------------------------


def _key(s: Sample) -> tuple[str, str, tuple[tuple[str, str], ...], object]:
    return (s.signal, s.subject, s.labels, s.value)


def _stack(samples: list[Sample]) -> set[tuple[str, str, tuple[tuple[str, str], ...], object]]:
    return {_key(s) for s in samples if s.signal.split(".")[0] in ("node", "driver", "container")}


def _bundle(root: Path, fast_rows: list[dict[str, object]]) -> Path:
    for rel, (capture, _) in CAPTURES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(H200 / capture, root / rel)
    shutil.copy(H200 / "df.txt", root / "host/df.txt")
    shutil.copy(H200 / "dev_nodes.txt", root / "host/dev_nodes.txt")
    (root / "gpu/nvidia-smi").mkdir(parents=True)
    shutil.copy(H200 / "nvsmi_idle.xml", root / "gpu/nvidia-smi/001.xml")
    # what `moptd record` writes from NVML when there is no nvidia-smi
    (root / "gpu/samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fast_rows))
    return root


def test_live_and_replay_give_the_same_samples_from_the_same_evidence(tmp_path: Path) -> None:
    source = CaptureSource()
    live = Batch()
    for c in stack_collectors(live_tree(tmp_path / "root"), source):
        live.extend(c.read())
    # the recorded NVML backend's fast readings, as the live collector makes them
    backend = RecordedBackend.from_file(RECORDING)
    readings = [backend.read_fast(0) for _ in range(40)]
    rows = [sample_row(1_795_974_810.0 + i, 0, r) for i, r in enumerate(readings)]
    tl = read_bundle(_bundle(tmp_path / "bundle", rows))

    replay = [s for _, name, b in tl.iter_observations() if name in ("host", "driver", "container")
              for s in b.samples]
    live_stack = {k for k in _stack(live.samples) if k[0] not in LIVE_ONLY}
    assert ABSENT_CONFIG <= live_stack
    live_stack -= ABSENT_CONFIG
    replay_stack = _stack(replay)
    # the user-space version: NVML live, the nvidia-smi dump in the bundle; same version
    version = {k for k in live_stack | replay_stack if k[0] == "driver.user_space_version"}
    assert {dict(k[2])["version"] for k in version} == {"580.159.04"}
    assert {dict(k[2])["source"] for k in version} == {"nvml", "nvidia-smi"}
    live_stack -= version
    replay_stack -= version
    assert replay_stack == live_stack
    assert any(k[0] == "node.memory_total" for k in replay_stack)
    assert any(k[0] == "node.disk_used_ratio" for k in replay_stack)
    assert any(k[0] == "driver.dev_node_present" for k in replay_stack)

    samples = [b for _, name, b in tl.iter_observations() if name == "samples"]
    assert len(samples) == len(readings)
    for r, b in zip(readings, samples, strict=True):
        want = [s for s in gpu_batch(StaticReading(index=0), r, None).samples
                if s.signal != "gpu.info"]
        assert sorted(map(_key, b.samples)) == sorted(map(_key, want))


@pytest.mark.parametrize(
    ("rel", "text", "signal", "expected"),
    [
        # MemTotal 0 (a container's view): live emits no total; replay did, and raised
        # without the line
        ("host/meminfo", "MemTotal: 0 kB\nMemAvailable: 0 kB\n", "node.memory_total", []),
        # a file system whose every block is reserved: live 0.0, replay gave nothing
        (
            "host/df.txt",
            "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
            "/dev/vdb 1000 0 0 100% /data\n",
            "node.disk_used_ratio",
            [0.0],
        ),
    ],
)
def test_the_two_old_disagreements_are_gone(
    tmp_path: Path, rel: str, text: str, signal: str, expected: list[float]
) -> None:
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(text)
    tl = read_bundle(tmp_path)
    got = [s.value for _, _, b in tl.iter_observations() for s in b.samples if s.signal == signal]
    assert got == expected
