"""Live == replay on a real GPU host: the collectors read the host once, `moptd record`
writes a bundle of the same host at the same time, and replay (which runs the same
collectors over the bundle's files, nvidia-smi dumps for the GPUs) must see the same
values for everything that cannot move in a few seconds.

Runs only on a GPU host (``pytest -m gpu tests/gpu``). Tolerances: nvidia-smi prints
memory in MiB, so gpu.memory_total may differ by under 1 MiB; every other compared value is
exact.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from moptd.bundle import read_bundle
from moptd.collectors import registry
from moptd.config import load_config
from moptd.daemon.app import make_runtime
from moptd.observations import Sample
from moptd.store import SignalStore

pytestmark = pytest.mark.gpu

MIB = 1024.0 * 1024.0
# Values that hold still for the seconds between the live pass and the recording.
STILL = (
    "driver.module_loaded",
    "driver.kernel_module_version",
    "driver.nvml_version_match",
    "driver.dev_node_present",
    "driver.tainted",
    "container.nvidia_runtime_configured",
    "node.memory_total",
    "node.swap_total",
    "node.swappiness",
    "gpu.sm_clock_max",
    "gpu.mem_clock_max",
    "gpu.power_limit",
    "gpu.power_limit_default",
    "gpu.pcie_link_gen_max",
    "gpu.pcie_link_width_max",
    "gpu.ecc_enabled",
    "gpu.persistence_mode",
    "gpu.compute_mode",
    "gpu.mig_mode",
    "gpu.memory_total",
)
# Compared values that must be on both sides, or the test proves nothing.
REQUIRED = ("driver.kernel_module_version", "node.memory_total", "gpu.power_limit")

Key = tuple[str, str, tuple[tuple[str, str], ...]]


def _latest(samples: list[Sample]) -> dict[Key, object]:
    return {(s.signal, s.subject, s.labels): s.value for s in samples if s.signal in STILL}


def _live() -> dict[Key, object]:
    async def run() -> list[Sample]:
        store = SignalStore()
        runtime = make_runtime(load_config(None, registry()), store)
        await runtime.collect_once()
        return list(store.snapshot().samples)

    return _latest(asyncio.run(run()))


def _replayed(bundle: Path) -> dict[Key, object]:
    timeline = read_bundle(bundle)
    samples: list[Sample] = []
    for _, _, batch in timeline.observations:
        samples.extend(batch.samples)
    return _latest(samples)


def test_replay_of_a_recording_sees_what_the_live_collectors_see(tmp_path: Path) -> None:
    if not Path("/dev/nvidiactl").exists():
        pytest.skip("no NVIDIA driver on this host")
    bundle = tmp_path / "bundle"
    subprocess.run(
        [sys.executable, "-m", "moptd", "record", "--duration", "2s", "--interval", "1s",
         "--quiet", "--out", str(bundle)],
        check=True, timeout=120,
    )
    live = _live()
    replayed = _replayed(bundle)
    for name in REQUIRED:
        assert any(k[0] == name for k in live), f"live pass has no {name}"
        assert any(k[0] == name for k in replayed), f"replay has no {name}"
    differ = {}
    for key in sorted(live.keys() & replayed.keys()):
        a, b = live[key], replayed[key]
        tolerance = MIB if key[0] == "gpu.memory_total" else 0.0
        if isinstance(a, float) and isinstance(b, float):
            if abs(a - b) > tolerance:
                differ[key] = (a, b)
        elif a != b:
            differ[key] = (a, b)
    assert not differ, f"live vs replay: {differ}"
    # Every GPU the live pass saw is in the replay, with the same static signals.
    gpus = {k[1] for k in live if k[0].startswith("gpu.")}
    assert gpus
    assert gpus <= {k[1] for k in replayed}
