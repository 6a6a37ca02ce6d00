"""moptd_software_version_info: the versions the collectors read, one series per component,
for the fleet rules (grafana/alerts/moptd-fleet.rules.yaml) to compare hosts by."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors.host import HostCollector
from moptd.collectors.versions import MANAGED_COMMAND, SITE_PACKAGES, VersionsCollector
from moptd.daemon.exporter import SnapshotCollector, TextRenderer
from moptd.daemon.software import COMPONENTS, MAX_VERSIONS, software_samples
from moptd.observations import Batch, Sample, labels_of
from moptd.store import SignalStore
from tests.conftest import FIXTURES

SP = FIXTURES / "site-packages"
# real captures: an H200 host's /proc/driver/nvidia/version and kernel release
BUNDLE = FIXTURES / "bundles" / "h200-matmul-power-cap"


def _proc(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    (proc / "driver" / "nvidia").mkdir(parents=True)
    (proc / "sys" / "kernel").mkdir(parents=True)
    shutil.copy(BUNDLE / "kernel" / "driver_version", proc / "driver" / "nvidia" / "version")
    shutil.copy(BUNDLE / "kernel" / "uname_r", proc / "sys" / "kernel" / "osrelease")
    shutil.copy(BUNDLE / "host" / "meminfo", proc / "meminfo")
    shutil.copy("/proc/stat", proc / "stat")  # no capture holds one; its values go unchecked
    return proc


def _render(store: SignalStore) -> bytes:
    fast = TextRenderer().render(store.snapshot())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(store))
    assert fast == generate_latest(registry)  # both renderers compose it alike
    return fast


def _info_lines(text: bytes) -> list[str]:
    return [
        line
        for line in text.decode().splitlines()
        if line.startswith("moptd_software_version_info{")
    ]


def test_the_collectors_versions_reach_metrics(tmp_path: Path) -> None:
    """The versions collector over a real vLLM 0.4.0 site-packages and the host collector
    over a real kernel release: /metrics names the engine, PyTorch and the kernel."""
    proc = _proc(tmp_path)
    store = SignalStore(VirtualClock(1_795_969_300.0))
    ctx = CollectorContext(
        procfs=proc,
        global_options={SITE_PACKAGES: (str(SP / "vllm-0.4.0-cu121"),), MANAGED_COMMAND: None},
    )
    versions = VersionsCollector(ctx)
    store.ingest("versions", asyncio.run(versions.collect()))
    asyncio.run(versions.stop())
    store.ingest("host", asyncio.run(HostCollector(CollectorContext(procfs=proc)).collect()))
    release = (proc / "sys" / "kernel" / "osrelease").read_text().strip()
    assert _info_lines(_render(store)) == [
        f'moptd_software_version_info{{component="kernel",version="{release}"}} 1.0',
        'moptd_software_version_info{component="torch",version="2.1.2"} 1.0',
        'moptd_software_version_info{component="vllm",version="0.4.0.post1"} 1.0',
    ]


def test_one_series_per_component_however_many_versions() -> None:
    """Two serving environments on other vLLM versions than a third endpoint's page: one
    series, the versions sorted and joined, at most MAX_VERSIONS and a count of the rest
    (the fleet rules join per component and need one series per host)."""
    b = Batch()
    b.add("driver.user_space_version", "node", 1.0, labels_of(version="570.124.06", source="nvml"))
    b.add("versions.driver_cuda", "node", 12080.0, labels_of(source="nvml"))
    for i, version in enumerate(["0.9.1", "0.8.5", "0.10.0", "0.7.3", "0.6.0", "0.9.1"]):
        b.add("versions.package", "node", 1.0,
              labels_of(serving=f"e{i}", package="vllm", version=version))  # fmt: skip
    b.add("serving.info", "serving:trt", 1.0,
          labels_of(engine="trtllm", version="1.0.0", model="m", endpoint="u"))  # fmt: skip
    b.add("serving.info", "serving:idle", 1.0,
          labels_of(engine="sglang", version="", model="", endpoint="u"))  # fmt: skip
    store = SignalStore(VirtualClock(0))
    store.ingest("t", b)
    lines = _info_lines(_render(store))
    assert lines == [
        'moptd_software_version_info{component="driver",version="570.124.06"} 1.0',
        'moptd_software_version_info{component="cuda",version="12.8"} 1.0',
        'moptd_software_version_info{component="vllm",version="0.10.0,0.6.0,0.7.3,0.8.5,+1"} 1.0',
        'moptd_software_version_info{component="tensorrt_llm",version="1.0.0"} 1.0',
    ]
    assert MAX_VERSIONS == 4


def test_nothing_known_exports_nothing_and_the_count_is_bounded() -> None:
    assert software_samples([Sample("node.memory_total", "node", 1.0)]) == []
    many = [
        Sample("versions.package", "node", 1.0, labels_of(serving=str(i), package=p, version=v))
        for i in range(50)
        for p in ("torch", "vllm", "sglang", "tensorrt-llm", "numpy")
        for v in (f"1.{i}", "x" * 500)
    ]
    got = software_samples(many)
    assert len(got) <= len(COMPONENTS)
    assert all(len(dict(s.labels)["version"]) < 300 for s in got)
