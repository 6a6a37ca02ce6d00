"""The live NVML backend against ``nvidia-smi -q -x`` on the same host at the same moment.

Runs only on a GPU host (``pytest -m gpu tests/gpu``). NVML is read just before and just
after nvidia-smi runs; a dynamic value passes when nvidia-smi's figure lies within the
before/after range widened by the field's tolerance. Tolerances (and why):

- identity, modes, maxima, limits, ECC/remap/replay counters, BAR1 and memory totals:
  exact, up to nvidia-smi's rounding (MiB for memory, 0.01 W for limits, 1 MHz for clocks);
- memory used/free/reserved, BAR1 used: 2 MiB (rounding, allocations in between);
- utilisation: 0.10 (the driver's sample window moves between the reads);
- temperatures: 2 C; power: 15 W or 10 % (nvidia-smi prints a separate average);
- SM clock: 20 % (boost moves per ms); memory clock: 1 MHz;
- cumulative clock-event time: 1 s (nvidia-smi prints µs; NVML fields are ns);
- clock-event bitmask: equal to NVML's before or after value (bits flicker at idle).

Fields nvidia-smi reports as N/A (None after parsing) are skipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from moptd.gpu.nvsmi import parse_xml
from moptd.gpu.readings import (
    FastReading,
    SlowReading,
    StaticReading,
    merge_costly,
)

pytestmark = pytest.mark.gpu

MIB = 1024.0 * 1024.0
DRIVER_PRESENT = Path("/dev/nvidiactl").exists()

# field -> (absolute tolerance, relative tolerance)
TOLERANCE: dict[str, tuple[float, float]] = {
    "memory_total": (MIB, 0),
    "memory_used": (2 * MIB, 0),
    "memory_free": (2 * MIB, 0),
    "memory_reserved": (2 * MIB, 0),
    "bar1_total": (MIB, 0),
    "bar1_used": (2 * MIB, 0),
    "util": (0.10, 0),
    "mem_util": (0.10, 0),
    "temperature": (2.0, 0),
    "memory_temperature": (2.0, 0),
    "power": (15.0, 0.10),
    "power_limit": (0.01, 0),
    "power_limit_default": (0.01, 0),
    "sm_clock": (1e6, 0.20),
    "mem_clock": (1e6, 0),
    "sm_clock_max": (1e6, 0),
    "mem_clock_max": (1e6, 0),
}
CLOCK_EVENT_TIME_TOLERANCE = 1.0
NOT_IN_NVSMI = {
    "energy",
    "nvlink_links_active",
    "nvlink_errors",
    "processes",
    # issue 23's per-link NVLink and MIG values (tests/gpu/test_gpm_live.py checks them
    # against nvidia-smi nvlink -s and nvidia-smi -L)
    "nvlink_link_up",
    "nvlink_link_errors",
    "nvlink_link_bytes",
    "mig_devices",
}


@pytest.fixture(scope="module")
def backend() -> Any:
    if shutil.which("nvidia-smi") is None or not Path("/dev/nvidiactl").exists():
        pytest.skip("no NVIDIA driver on this host")
    from moptd.gpu.backend import NvmlBackend

    b = NvmlBackend()
    b.init()
    yield b
    b.shutdown()


def nvidia_smi_xml() -> str:
    return subprocess.run(
        ["nvidia-smi", "-q", "-x"], check=True, capture_output=True, text=True, timeout=60
    ).stdout


def read_all(backend: Any) -> list[tuple[StaticReading, FastReading, SlowReading]]:
    out = []
    for i in range(backend.device_count()):
        slow = merge_costly(backend.read_slow(i), backend.read_costly(i))
        assert slow is not None
        out.append((backend.read_static(i), backend.read_fast(i), slow))
    return out


def within(field: str, smi: float, before: float | None, after: float | None) -> bool:
    known = [v for v in (before, after) if v is not None]
    if not known:
        return False
    absolute, relative = TOLERANCE.get(field, (0.0, 0.0))
    lo, hi = min(known), max(known)
    slack = max(absolute, relative * max(abs(lo), abs(hi)))
    return lo - slack - 1e-9 <= smi <= hi + slack + 1e-9


def compare(name: str, smi: Any, before: Any, after: Any, problems: list[str]) -> int:
    checked = 0
    for f in dataclasses.fields(smi):
        key = f.name
        s = getattr(smi, key)
        b, a = getattr(before, key), getattr(after, key)
        if key in NOT_IN_NVSMI or s is None or s == "" or s == {}:
            continue
        checked += 1
        if isinstance(s, str):
            if s not in (b, a):
                problems.append(f"{name}.{key}: nvidia-smi {s!r}, NVML {b!r} / {a!r}")
        elif key == "clock_event_reasons":
            if s not in (b, a):
                problems.append(f"{name}.{key}: nvidia-smi {s:#x}, NVML {b} / {a}")
        elif key == "clock_event_time":
            for reason, v in s.items():
                lo = (b or {}).get(reason)
                hi = (a or {}).get(reason)
                if lo is None or hi is None:
                    problems.append(f"{name}.{key}[{reason}]: NVML has no value, smi {v}")
                elif not lo - CLOCK_EVENT_TIME_TOLERANCE <= v <= hi + CLOCK_EVENT_TIME_TOLERANCE:
                    problems.append(f"{name}.{key}[{reason}]: nvidia-smi {v}s, NVML {lo}..{hi}s")
        elif not within(key, float(s), b, a):
            problems.append(f"{name}.{key}: nvidia-smi {s}, NVML {b} / {a}")
    return checked


def test_every_field_matches_nvidia_smi(backend: Any):
    before = read_all(backend)
    dump = parse_xml(nvidia_smi_xml(), "nvidia-smi -q -x")
    after = read_all(backend)
    assert len(dump.gpus) == backend.device_count()
    problems: list[str] = []
    checked = 0
    for g, b, a in zip(dump.gpus, before, after, strict=True):
        assert g.static.pci_bus_id == b[0].pci_bus_id, "nvidia-smi and NVML order GPUs alike"
        for tier, smi, pre, post in (
            ("static", g.static, b[0], a[0]),
            ("fast", g.fast, b[1], a[1]),
            ("slow", g.slow, b[2], a[2]),
        ):
            checked += compare(f"gpu{g.static.index}.{tier}", smi, pre, post, problems)
        smi_pids = {p.pid for p in g.slow.processes}
        nvml_pids = {p.pid for p in b[2].processes} | {p.pid for p in a[2].processes}
        if not smi_pids <= nvml_pids:
            problems.append(f"gpu{g.static.index}: processes {smi_pids} vs NVML {nvml_pids}")
    assert not problems, "\n".join(problems)
    assert checked >= 30 * len(dump.gpus)


def test_energy_counter_moves_forward(backend: Any):
    first = backend.read_costly(0).energy
    if first is None:
        pytest.skip("total energy not supported on this GPU")
    assert first > 0
    assert backend.read_costly(0).energy >= first
    assert backend.read_slow(0).energy is None  # energy is the costly tier's


async def test_collector_runs_live(tmp_path: Path):
    if not DRIVER_PRESENT:
        pytest.skip("no NVIDIA driver on this host")
    from moptd.collector import CollectorContext
    from moptd.collectors.nvml import NvmlCollector

    c = NvmlCollector(CollectorContext(state_dir=tmp_path))
    await c.start()
    try:
        for _ in range(3):
            batch = await c.collect()
            await asyncio.sleep(0.2)
    finally:
        await c.stop()
    gpus = {s.subject for s in batch.samples if s.subject.startswith("gpu:")}
    assert gpus
    for subject in gpus:
        errs = [
            s.value for s in batch.samples if s.signal == "gpu.nvml_error" and s.subject == subject
        ]
        assert errs == [0.0]
        assert any(s.signal == "gpu.util" and s.subject == subject for s in batch.samples)
