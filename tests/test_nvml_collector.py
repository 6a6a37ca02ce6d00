"""The NVML collector over the recorded backend (built from real H200 captures), with the
recording's fault entries standing in for a lost or hung GPU."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest

from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.collector import CollectorContext, Unavailable
from moptd.collectors.nvml import NvmlCollector
from moptd.daemon.exporter import render_families
from moptd.observations import Batch, Event
from moptd.store import SignalStore
from tests.conftest import FIXTURES

DRIVER_PRESENT = Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()
RECORDING = FIXTURES / "h200" / "nvml_recording_from_captures.jsonl"


def values(batch: Batch, signal: str, subject: str) -> list[object]:
    return [s.value for s in batch.samples if s.signal == signal and s.subject == subject]


def one(batch: Batch, signal: str, subject: str, labels: tuple = ()) -> object:
    (v,) = [
        s.value
        for s in batch.samples
        if s.signal == signal and s.subject == subject and s.labels == labels
    ]
    return v


async def tick(c: NvmlCollector) -> Batch:
    """One collection, then wait for the read it started: the collector reports each
    tick the read the previous tick started (pipelined), so tests settle in between."""
    batch = await c.collect()
    await c.settle()
    return batch


def collector(tmp_path: Path, recording: Path = RECORDING, clock=None, **options) -> NvmlCollector:
    opts = {"backend": "recorded", "recording": str(recording), "xid_events": False, **options}
    ctx = CollectorContext(options=opts, state_dir=tmp_path, clock=clock or VirtualClock(1000.0))
    return NvmlCollector(ctx)


def write_recording(tmp_path: Path, extra: list[dict], gpus: int = 2) -> Path:
    """The real recording's first static/fast/slow readings for each GPU, plus extra lines."""
    lines = RECORDING.read_text().splitlines()
    header = json.loads(lines[0])
    header["gpus"] = gpus
    first = {}
    for line in lines[1:]:
        obj = json.loads(line)
        first.setdefault(obj["tier"], obj)
    out = [json.dumps(header)]
    for g in range(gpus):
        for tier in ("static", "fast", "slow"):
            out.append(json.dumps({**first[tier], "gpu": g}))
    out.extend(json.dumps(e) for e in extra)
    p = tmp_path / "rec.jsonl"
    p.write_text("\n".join(out) + "\n")
    return p


async def test_eight_gpus_from_a_one_gpu_recording(tmp_path: Path):
    c = collector(tmp_path, replicate=8)
    await c.start()
    try:
        batch = await tick(c)
    finally:
        await c.stop()
    for i in range(8):
        subject = f"gpu:{i}"
        assert one(batch, "gpu.lost", subject) == 0.0
        assert one(batch, "gpu.nvml_error", subject) == 0.0
        assert one(batch, "gpu.memory_total", subject) == 143771 * 1024 * 1024
        assert one(batch, "gpu.sm_clock_max", subject) == 1980e6
        assert one(batch, "gpu.clock_event_reasons", subject) == 1.0
        assert one(batch, "gpu.clock_event_active", subject, (("reason", "gpu_idle"),)) == 1.0
        for tier in ("static", "fast", "slow"):
            assert one(batch, "gpu.sample_age", subject, (("tier", tier),)) == 0.0
        assert batch.attrs[subject]["pci_bus_id"] == "0000:00:06.0"
    assert len({batch.attrs[f"gpu:{i}"]["uuid"] for i in range(8)}) == 8
    for s in batch.samples:
        assert s.signal in CATALOG
    # NVML started: what a bundle reads from nvidia-smi (rule driver-nvml-init decides)
    assert one(batch, "gpu.nvml_init_error", "node") == 0.0


async def test_tiers_follow_their_intervals(tmp_path: Path):
    clock = VirtualClock(1000.0)
    c = collector(
        tmp_path, clock=clock, slow_interval=5.0, costly_interval=3.0, static_interval=300.0
    )
    await c.start()
    try:
        await tick(c)
        ages = []
        for _ in range(6):
            clock.advance(1.0)
            b = await tick(c)
            ages.append(
                tuple(
                    one(b, "gpu.sample_age", "gpu:0", (("tier", tier),))
                    for tier in ("fast", "slow", "costly", "static")
                )
            )
    finally:
        await c.stop()
    # pipelined: each tick reports the read the previous tick started, so fast values
    # are one tick old and a tier is never older than its interval
    assert [a[0] for a in ages] == [1.0] * 6
    assert [a[1] for a in ages] == [1.0, 2.0, 3.0, 4.0, 5.0, 1.0]
    assert [a[2] for a in ages] == [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    assert [a[3] for a in ages] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


async def test_costly_values_come_from_their_own_tier(tmp_path: Path):
    """The real H200 recording: energy and the HW counters appear with the slow tier's
    values, and energy only moves when the costly tier is read again."""
    clock = VirtualClock(0.0)
    rec = FIXTURES / "h200" / "nvml_recording_h200.jsonl"
    c = collector(
        tmp_path, rec, clock=clock, slow_interval=1.0, costly_interval=10.0, energy_interval=10.0
    )
    await c.start()
    try:
        energies = []
        for _ in range(12):
            b = await tick(c)
            energies.append(one(b, "gpu.energy", "gpu:0"))
            assert (
                one(b, "gpu.clock_event_time", "gpu:0", (("reason", "hw_power_brake_slowdown"),))
                == 0.0
            )
            clock.advance(1.0)
    finally:
        await c.stop()
    # read when due at t=10, reported by the next tick (t=11)
    assert len(set(energies[:11])) == 1
    assert energies[11] > energies[0]


async def test_energy_has_its_own_slower_cadence(tmp_path: Path):
    """Total energy (3 ms a read) is read with the costly tier only every energy_interval;
    in between the HW counters refresh and energy keeps its last value, its age growing."""
    clock = VirtualClock(0.0)
    rec = FIXTURES / "h200" / "nvml_recording_h200.jsonl"
    c = collector(
        tmp_path, rec, clock=clock, slow_interval=1.0, costly_interval=5.0, energy_interval=20.0
    )
    await c.start()
    try:
        energies, costly_ages, energy_ages = [], [], []
        for _ in range(22):
            b = await tick(c)
            energies.append(one(b, "gpu.energy", "gpu:0"))
            costly_ages.append(one(b, "gpu.sample_age", "gpu:0", (("tier", "costly"),)))
            energy_ages.append(one(b, "gpu.sample_age", "gpu:0", (("tier", "energy"),)))
            clock.advance(1.0)
    finally:
        await c.stop()
    # read when due at t=20, reported by the next tick (t=21); costly reads at 5, 10, 15
    # did not move it
    assert len(set(energies[:21])) == 1
    assert energies[21] > energies[0]
    assert max(costly_ages) <= 5.0
    assert energy_ages[20] == 20.0


async def test_fast_values_advance_through_the_capture(tmp_path: Path):
    c = collector(tmp_path)
    await c.start()
    try:
        powers = [one(await tick(c), "gpu.power", "gpu:0") for _ in range(20)]
    finally:
        await c.stop()
    assert powers[0] == pytest.approx(94.963)
    assert max(p for p in powers if isinstance(p, float)) > 600  # the load reached the cap


async def test_a_lost_gpu_does_not_disturb_the_others(tmp_path: Path):
    path = write_recording(tmp_path, [{"gpu": 1, "tier": "fast", "fault": "lost"}], gpus=3)
    c = collector(tmp_path, path)
    await c.start()
    try:
        first = await tick(c)  # GPU 1 reads its real entry first
        second = await tick(c)  # then reaches the "lost" entry
        third = await tick(c)
    finally:
        await c.stop()
    assert one(first, "gpu.lost", "gpu:1") == 0.0
    for b in (second, third):
        assert one(b, "gpu.lost", "gpu:1") == 1.0
        assert one(b, "gpu.nvml_error", "gpu:1") == 15.0  # NVML_ERROR_GPU_IS_LOST
        assert values(b, "gpu.util", "gpu:1") == []  # no stale numbers for a lost GPU
        assert b.attrs["gpu:1"]["uuid"]  # still identified
        for ok in ("gpu:0", "gpu:2"):
            assert one(b, "gpu.lost", ok) == 0.0
            assert values(b, "gpu.util", ok) == [0.0]


async def test_a_hung_gpu_does_not_delay_the_others(tmp_path: Path):
    path = write_recording(tmp_path, [{"gpu": 1, "tier": "fast", "fault": "hang", "seconds": 30}])
    clock = VirtualClock(1000.0)
    c = collector(tmp_path, path, clock=clock, gpu_deadline=0.3)
    await c.start()
    try:
        await c.collect()  # reads both GPUs, then starts the next reads: GPU 1's blocks
        await c.settle(0.2)  # GPU 0's next read finishes; GPU 1's does not
        clock.advance(1.0)  # past the deadline
        t0 = time.monotonic()
        hung = await c.collect()
        took = time.monotonic() - t0
        await c.settle(0.2)
        clock.advance(1.0)
        again = await c.collect()  # GPU 1's call is still blocked: skipped, not re-queued
    finally:
        await c.stop()  # ends the recorded hang
    assert took < 2.0
    for b in (hung, again):
        assert one(b, "gpu.nvml_error", "gpu:1") == 10.0  # NVML_ERROR_TIMEOUT
        assert values(b, "gpu.util", "gpu:1") == []
        assert values(b, "gpu.lost", "gpu:1") == []
        assert one(b, "gpu.lost", "gpu:0") == 0.0
        assert values(b, "gpu.util", "gpu:0") == [0.0]
    assert one(again, "gpu.sample_age", "gpu:1", (("tier", "fast"),)) >= 0.0


async def test_a_hung_gpu_first_in_line_holds_the_others_one_deadline_at_most(tmp_path: Path):
    """Healthy GPUs share one reader thread. When the GPU read first hangs, the reads queued
    behind it wait one deadline, then go on a new shared thread; the hung GPU keeps the
    stuck one."""
    path = write_recording(
        tmp_path, [{"gpu": 0, "tier": "fast", "fault": "hang", "seconds": 30}], gpus=3
    )
    clock = VirtualClock(1000.0)
    c = collector(tmp_path, path, clock=clock, gpu_deadline=0.3)
    before = set(threading.enumerate())  # earlier tests' hung readers may still be blocked
    await c.start()
    try:
        await c.collect()  # first reads; then GPU 0's next read blocks the shared thread
        await c.settle(0.2)
        clock.advance(1.0)
        hung = await c.collect()  # GPU 0 isolated; GPUs 1 and 2 read again, elsewhere
        await c.settle(0.5)
        clock.advance(1.0)
        after = await c.collect()
        readers = [t.name for t in set(threading.enumerate()) - before if "reader" in t.name]
    finally:
        await c.stop()
    assert one(hung, "gpu.nvml_error", "gpu:0") == 10.0
    assert one(after, "gpu.nvml_error", "gpu:0") == 10.0
    for ok in ("gpu:1", "gpu:2"):
        assert one(after, "gpu.nvml_error", ok) == 0.0
        assert values(after, "gpu.util", ok) == [0.0]
        # the read reported was started on the previous tick, not the stuck one
        assert one(after, "gpu.sample_age", ok, (("tier", "fast"),)) == 1.0
    assert readers == ["moptd-nvml-reader"] * 2  # the stuck one and the new one


async def test_healthy_gpus_share_one_reader_thread(tmp_path: Path):
    c = collector(tmp_path, replicate=8)
    before = set(threading.enumerate())
    await c.start()
    try:
        for _ in range(3):
            b = await tick(c)
        readers = [t.name for t in set(threading.enumerate()) - before if "reader" in t.name]
    finally:
        await c.stop()
    assert readers == ["moptd-nvml-reader"]
    assert {s.subject for s in b.samples if s.signal == "gpu.util"} == {
        f"gpu:{i}" for i in range(8)
    }


async def test_an_nvml_error_is_a_signal(tmp_path: Path):
    path = write_recording(tmp_path, [{"gpu": 0, "tier": "slow", "fault": "error", "code": 10}])
    clock = VirtualClock(0.0)
    c = collector(tmp_path, path, clock=clock, slow_interval=1.0)
    await c.start()
    try:
        await tick(c)
        for _ in range(2):  # due at t=1, reported at t=2
            clock.advance(1.0)
            b = await tick(c)
    finally:
        await c.stop()
    assert one(b, "gpu.nvml_error", "gpu:0") == 10.0
    assert one(b, "gpu.nvml_error", "gpu:1") == 0.0
    assert one(b, "gpu.lost", "gpu:0") == 0.0
    assert values(b, "gpu.util", "gpu:0") == [0.0]
    assert one(b, "gpu.sample_age", "gpu:0", (("tier", "slow"),)) == 2.0  # kept, with its age


async def test_processes_are_attributed_from_proc(tmp_path: Path):
    pid = os.getpid()
    slow = {"processes": [{"pid": pid, "used_memory": 2.0**30, "type": "C"}]}
    path = write_recording(tmp_path, [{"gpu": 1, "tier": "slow", "reading": slow}])
    clock = VirtualClock(0.0)
    c = collector(tmp_path, path, clock=clock, slow_interval=1.0)
    await c.start()
    try:
        await tick(c)
        for _ in range(2):  # due at t=1, reported at t=2
            clock.advance(1.0)
            b = await tick(c)
        assert one(b, "process.gpu_memory", f"process:{pid}", (("gpu", "1"),)) == 2.0**30
        attrs = b.attrs[f"process:{pid}"]
        assert attrs["name"]  # from /proc/PID/comm
        assert "pytest" in attrs["cmdline"] or "python" in attrs["cmdline"]
        clock.advance(1.0)
        gone = await tick(c)  # the recording wraps: no process any more
        assert values(gone, "process.gpu_memory", f"process:{pid}") == []
        assert f"process:{pid}" not in gone.attrs
    finally:
        await c.stop()


async def test_xid_events_are_published_from_the_event_thread(tmp_path: Path):
    path = write_recording(tmp_path, [{"gpu": 1, "xid": 79}])
    got: list[Event] = []
    arrived = asyncio.Event()

    def publish(events: list[Event]) -> None:
        got.extend(events)
        arrived.set()

    ctx = CollectorContext(
        options={"backend": "recorded", "recording": str(path)},
        state_dir=tmp_path,
        publish=publish,
    )
    c = NvmlCollector(ctx)
    await c.start()
    try:
        await asyncio.wait_for(arrived.wait(), 5)
    finally:
        await c.stop()
    (ev,) = got
    assert (ev.stream, ev.subject, ev.fields["code"]) == ("gpu.xid_event", "gpu:1", 79)
    assert CATALOG["gpu.xid_event"].kind == "event"


async def test_no_driver_is_unavailable(tmp_path: Path):
    """The real pynvml on this CPU host: libnvidia-ml is missing, no driver trace."""
    if DRIVER_PRESENT:
        pytest.skip("an NVIDIA driver is present")
    procfs = tmp_path / "proc"
    procfs.mkdir()
    c = NvmlCollector(CollectorContext(options={"backend": "live"}, procfs=procfs))
    with pytest.raises(Unavailable, match="NVIDIA driver not loaded"):
        await c.start()
    with pytest.raises(Unavailable):
        await tick(c)
    await c.stop()


async def test_driver_present_but_nvml_broken_is_a_failure(tmp_path: Path):
    if DRIVER_PRESENT:
        pytest.skip("a real driver is present")
    procfs = tmp_path / "proc"
    (procfs / "driver" / "nvidia").mkdir(parents=True)
    c = NvmlCollector(CollectorContext(options={"backend": "live"}, procfs=procfs))
    await c.start()  # logs, and collect reports the failure
    with pytest.raises(RuntimeError, match="NVML init failed"):
        await tick(c)
    await c.stop()


async def test_bad_recording_option_fails_clearly(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "moptd-nvml-recording/1"}\n{"gpu": 0, "tier": "fast"}\n')
    c = collector(tmp_path, bad)
    await c.start()
    with pytest.raises(Exception, match=r"bad.jsonl:2: missing key 'reading'"):
        await tick(c)
    await c.stop()


async def test_exporter_renders_the_collector_output(tmp_path: Path):
    c = collector(tmp_path, replicate=2)
    store = SignalStore(VirtualClock(1000.0))
    await c.start()
    try:
        store.ingest("nvml", await tick(c), 1000.0)
    finally:
        await c.stop()
    families = {f.name: f for f in render_families(store.snapshot())}
    util = families["moptd_gpu_utilization_ratio"]
    labels = sorted((s.labels["gpu"], s.labels["uuid"]) for s in util.samples)
    assert [g for g, _ in labels] == ["0", "1"]
    assert all(u.startswith("GPU-") for _, u in labels)
    assert "moptd_gpu_clock_event_seconds" in families  # counters drop _total in the family


async def test_stop_waits_for_the_xid_thread_before_shutting_down() -> None:
    # NVML frees the event set in shutdown(); the Xid thread must be out of its wait first
    c = NvmlCollector(
        CollectorContext(
            options={"backend": "recorded", "recording": str(RECORDING), "xid_events": True}
        )
    )
    await c.start()
    await c.collect()
    xid = c._xid_thread
    assert xid is not None
    assert xid.is_alive()
    t0 = time.monotonic()
    await c.stop()
    assert not xid.is_alive()
    assert time.monotonic() - t0 < 0.9  # the recorded wait is woken, not waited out
