"""Real NVML error paths on a real GPU host, through the live backend.

- NotSupported: an H200 has no page retirement (Ampere and later remap rows instead), so
  NVML answers NotSupported for the retired-page fields. That is a value, not an error:
  the signal is absent (never 0) and gpu.nvml_error stays 0.

Lost, unknown and timed-out GPUs cannot be caused on a healthy card without changing its
state (never done here); they run through the recorded backend in tests/faults/. A NULL
device handle is no substitute: libnvidia-ml 580 dereferences it and the process dies
(SIGSEGV in nvmlDeviceGetUtilizationRates, seen on the H200 host).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

DRIVER_PRESENT = Path("/dev/nvidiactl").exists()


def _values(batch, signal: str, subject: str) -> list[float]:
    return [s.value for s in batch.samples if s.signal == signal and s.subject == subject]


@pytest.fixture
def live():
    if not DRIVER_PRESENT:
        pytest.skip("no NVIDIA driver on this host")


async def _run(tmp_path: Path, backend, ticks: int = 3):
    from moptd.collector import CollectorContext
    from moptd.collectors.nvml import NvmlCollector

    c = NvmlCollector(
        CollectorContext(options={"xid_events": False}, state_dir=tmp_path)
    )
    c.backend = backend
    await c.start()
    try:
        for _ in range(ticks):
            batch = await c.collect()
            await c.settle()
            await asyncio.sleep(0.1)
    finally:
        await c.stop()
    return batch


async def test_not_supported_fields_are_absent_not_zero(live, tmp_path: Path):
    from moptd.gpu.backend import NvmlBackend

    backend = NvmlBackend()
    batch = await _run(tmp_path, backend)
    probe = NvmlBackend()
    probe.init()
    try:
        slow = probe.read_slow(0)
    finally:
        probe.shutdown()
    if slow.retired_pages_sbe is not None:
        pytest.skip("this GPU supports page retirement (pre-Ampere)")
    assert _values(batch, "gpu.retired_pages", "gpu:0") == []
    assert _values(batch, "gpu.nvml_error", "gpu:0") == [0.0]
    assert _values(batch, "gpu.util", "gpu:0")
