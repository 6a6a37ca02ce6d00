"""The driver collector against the live driver: nvidia-smi and /proc/driver/nvidia/version.

Runs only on a GPU host (``pytest -m gpu tests/gpu``).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from moptd.collector import CollectorContext
from moptd.collectors.driver import DriverCollector, parse_module_version
from moptd.gpu.identities import gpu_identities
from moptd.observations import Batch
from moptd.proc.pci import pci_key

pytestmark = pytest.mark.gpu

VERSION_FILE = Path("/proc/driver/nvidia/version")


def _smi(*args: str) -> str:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not on PATH")
    return subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def _pass() -> Batch:
    async def run() -> Batch:
        collector = DriverCollector(CollectorContext())
        try:
            return await collector.collect()
        finally:
            await collector.stop()

    return asyncio.run(run())


def _by(batch: Batch, signal: str) -> dict[tuple[tuple[str, str], ...], object]:
    return {s.labels: s.value for s in batch.samples if s.signal == signal}


def test_versions_match_the_live_driver():
    smi_version = _smi("--query-gpu=driver_version", "--format=csv,noheader").split()[0]
    batch = _pass()
    user = _by(batch, "driver.user_space_version")
    assert [dict(k)["version"] for k in user] == [smi_version]
    if not VERSION_FILE.exists():
        pytest.skip(f"{VERSION_FILE} is absent here (a sandboxed kernel)")
    module = parse_module_version(VERSION_FILE.read_text())
    assert module is not None
    assert _by(batch, "driver.kernel_module_version") == {
        (("flavor", module[1]), ("version", module[0])): 1.0
    }
    assert _by(batch, "driver.nvml_version_match") == {(): float(module[0] == smi_version)}
    assert _by(batch, "driver.module_loaded")[(("module", "nvidia"),)] == 1.0


def test_dev_nodes_and_gsp_firmware_match_the_live_driver():
    batch = _pass()
    present = _by(batch, "driver.dev_node_present")
    for node in ("nvidiactl", "nvidia0"):
        assert present[(("node", node),)] == float(Path(f"/dev/{node}").exists())
    smi_q = _smi("-q")
    expected = {
        line.split(":", 1)[1].strip()
        for line in smi_q.splitlines()
        if line.strip().startswith("GSP Firmware Version")
    }
    got = {dict(k)["version"] for k in _by(batch, "driver.gsp_firmware_version")}
    assert got == expected


def test_gpu_map_matches_nvidia_smi():
    rows = _smi("--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader")
    expected_index = {}
    expected_uuid = {}
    for row in rows.strip().splitlines():
        index, bus, uuid = (c.strip() for c in row.split(","))
        expected_index[pci_key(bus)] = int(index)
        expected_uuid[pci_key(bus)] = uuid
    index_by_bus, uuid_by_bus, version = gpu_identities(Path("/proc"))
    assert index_by_bus == expected_index
    assert uuid_by_bus == expected_uuid
    assert version
