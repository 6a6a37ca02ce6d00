"""`moptd status` shows a GPU that only kernel lines name (NVML does not list it): a note
under the GPU table with its PCI address and UUID, not a row of "-".

The GPU table comes from the real NVML recording of the H200 host; the kernel lines are a
real report of a GPU that fell off the bus (tests/fixtures/kernel-only-gpu/SOURCE.md),
written to the real /dev/kmsg and read by the real kernel collector."""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from pathlib import Path

import pytest

from moptd.cli import render
from moptd.collector import Collector, CollectorContext
from moptd.collectors.kernel_log import KernelLogCollector
from moptd.collectors.nvml import NvmlCollector
from moptd.daemon.runtime import CollectorRuntime
from moptd.daemon.views import status_view
from moptd.store import SignalStore
from tests.api_helpers import kmsg_writable
from tests.conftest import FIXTURES

LINES = FIXTURES / "kernel-only-gpu" / "gpud_sxid_readme_xid79.txt"
RECORDING = FIXTURES / "h200" / "nvml_recording_h200.jsonl"
UUID = "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not kmsg_writable(), reason="needs a writable /dev/kmsg (root)"),
]


def write_lines(domain: str) -> None:
    for raw in LINES.read_text().splitlines():
        text = re.sub(r"^\[\s*[\d.]+\] ", "", raw).replace("0000:91:00", f"{domain}:91:00")
        fd = os.open("/dev/kmsg", os.O_WRONLY)  # one open per write: the kernel rate-limits
        try:
            os.write(fd, f"<3>{text}\n".encode())
        finally:
            os.close(fd)


async def test_a_gpu_seen_only_in_kernel_lines_is_a_note_not_a_row_of_dashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SignalStore()
    nvml = NvmlCollector(
        CollectorContext(
            options={"backend": "recorded", "recording": str(RECORDING), "xid_events": False}
        )
    )
    kernel = KernelLogCollector(CollectorContext(options={}, state_dir=tmp_path))
    collectors: dict[str, tuple[Collector, float, float]] = {
        "nvml": (nvml, 5.0, 5.0),
        "kernel": (kernel, 5.0, 10.0),
    }
    runtime = CollectorRuntime(store, collectors)
    kernel.ctx.publish = runtime.publish
    domain = f"{random.randint(0x1000, 0xFFFE):04x}"
    bus = f"{domain}:91:00.0"
    await runtime.start(loops=False)
    try:
        for _ in range(2):  # NVML reports the read the previous pass started
            await runtime.run_once()
            await nvml.settle()
        await asyncio.to_thread(write_lines, domain)
        deadline = time.monotonic() + 5
        while not any(bus in ev.subject for ev in store.events("kernel.xid")):
            assert time.monotonic() < deadline, "the Xid never reached the store"
            await asyncio.sleep(0.01)
        await runtime.run_once()
    finally:
        await runtime.stop()
    view = status_view(store, runtime.health.values())
    assert any(g["subject"] == f"gpu:{bus}" for g in view["gpus"])  # the JSON keeps it
    render.print_status(view)
    out = capsys.readouterr().out
    table, _, below = out.partition("Seen only in the kernel log")
    assert below, out
    assert bus not in table  # no row of "-" for it in the GPU table
    assert "NVIDIA H200" in table  # the GPUs NVML lists are still rows
    # other tests' records in this boot's ring may add notes of their own: find ours
    note = next(line for line in below.splitlines() if bus in line)
    assert f"PCI {bus}" in note
    assert UUID in note
