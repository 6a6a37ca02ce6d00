"""GPM profiling metrics and per-process utilisation (issue 23), replayed from the real H200
probe capture (tests/fixtures/h200/gpu_depth_probe.json, converted by ``build-probe``)."""

from __future__ import annotations

import asyncio
import io
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors.nvml import NvmlCollector
from moptd.daemon.exporter import render_families
from moptd.gpu.batch import PROCESS_UTIL_CAP, add_processes, add_profile, add_slow
from moptd.gpu.readings import (
    MigReading,
    ProcessReading,
    ProfileReading,
    SlowReading,
    reading_from_dict,
    reading_to_dict,
)
from moptd.gpu.recorded import (
    FORMAT,
    RecordedBackend,
    RecordingError,
    dump_recording,
    from_probe,
    load_recording,
    main,
    parse_recording,
    read_samples,
)
from moptd.observations import Batch
from moptd.store import SignalStore
from tests.conftest import FIXTURES

H200 = FIXTURES / "h200"
PROBE = H200 / "gpu_depth_probe.json"
RECORDING = H200 / "nvml_recording_gpu_depth.jsonl"
OLD_RECORDING = H200 / "nvml_recording_from_captures.jsonl"


def built() -> str:
    out = io.StringIO()
    dump_recording(from_probe(PROBE), out)
    return out.getvalue()


def test_committed_recording_is_what_the_probe_builds():
    """The fixture is derived, not hand-made: rebuilding it from the probe gives it back."""
    assert RECORDING.read_text() == built()
    assert json.loads(RECORDING.read_text().splitlines()[0])["format"] == FORMAT


def _phase_profiles() -> list[ProfileReading]:
    rec = load_recording(RECORDING)
    out = [e.reading for e in rec.stream(0, "profile")]
    assert all(isinstance(r, ProfileReading) for r in out)
    return out  # type: ignore[return-value]


def test_probe_phases_read_as_an_expert_reads_them():
    """Idle: nothing active. The bf16 matmul: SMs and tensor pipes busy, DRAM lightly used,
    few warps resident (large tiles). The 4 GiB copy: DRAM near its peak, no tensor work,
    SMs full of warps. nvidia-smi said 95 % and 99 % for the two loads: only GPM tells a
    compute-bound load from a bandwidth-bound one."""
    idle, tensor, dram = _phase_profiles()
    assert idle.gpm_supported == tensor.gpm_supported == dram.gpm_supported == 1.0
    assert idle.sm_active == 0.0
    assert idle.tensor_active == 0.0
    assert idle.dram_active is not None
    assert idle.dram_active < 0.001
    assert tensor.tensor_active == pytest.approx(0.8938, abs=1e-4)
    assert tensor.sm_active == pytest.approx(0.9206, abs=1e-4)
    assert tensor.sm_occupancy == pytest.approx(0.1360, abs=1e-4)
    assert tensor.dram_active == pytest.approx(0.1662, abs=1e-4)
    assert dram.dram_active == pytest.approx(0.8768, abs=1e-4)
    assert dram.tensor_active == 0.0
    assert dram.sm_occupancy == pytest.approx(0.7904, abs=1e-4)
    # GPM gives MiB/s; moptd bytes/s. nvidia-smi dmon saw rxpci 33 MB/s under the copy.
    assert dram.pcie_rx_bytes == pytest.approx(26.775 * 1024 * 1024, rel=1e-3)
    # No NVLink on this VM: GPM reads 0 for it, which is what it measured.
    assert dram.nvlink_tx_bytes == 0.0


def test_per_process_utilisation_joins_the_running_process():
    rec = load_recording(RECORDING)
    slows = [e.reading for e in rec.stream(0, "slow")]
    assert isinstance(slows[0], SlowReading)
    assert slows[0].processes == ()
    tensor, dram = (r.processes for r in slows[1:] if isinstance(r, SlowReading))
    # nvmlDeviceGetProcessUtilization's own samples (pmon said sm 95/97 in the same phase,
    # a different sampling window).
    assert tensor == (ProcessReading(710, 1184890880.0, "C", "", 0.84, 0.2, 0.0, 0.0),)
    assert dram[0].pid == 746
    assert dram[0].sm_util == 0.9
    assert dram[0].mem_util == 0.51


def _collector(tmp_path: Path, recording: Path, **options: object) -> NvmlCollector:
    opts = {"backend": "recorded", "recording": str(recording), "xid_events": False, **options}
    return NvmlCollector(
        CollectorContext(options=opts, state_dir=tmp_path, clock=VirtualClock(1000.0))
    )


def test_collector_exports_the_profile_tier_and_process_utilisation(tmp_path: Path):
    async def run() -> tuple[Batch, Batch]:
        c = _collector(tmp_path, RECORDING, slow_interval=1.0, profile_interval=1.0)
        await c.start()
        first = await c.collect()  # the first read: idle phase
        await c.settle()
        c.ctx.clock.advance(1.0)  # type: ignore[attr-defined]
        await c.collect()  # reports nothing new, starts the tensor-phase read
        await c.settle()
        c.ctx.clock.advance(1.0)  # type: ignore[attr-defined]
        second = await c.collect()
        await c.stop()
        return first, second

    idle, tensor = asyncio.run(run())

    def v(b: Batch, signal: str, subject: str = "gpu:0") -> list[float]:
        return [s.value for s in b.samples if s.signal == signal and s.subject == subject]

    assert v(idle, "gpu.tensor_active") == [0.0]
    assert v(idle, "gpu.gpm_supported") == [1.0]
    assert v(tensor, "gpu.tensor_active") == [pytest.approx(0.8938, abs=1e-4)]
    assert v(tensor, "process.gpu_sm_util", "process:710") == [0.84]
    ages = [s.labels for s in tensor.samples if s.signal == "gpu.sample_age"]
    assert (("tier", "profile"),) in ages

    store = SignalStore(VirtualClock(1000.0))
    store.ingest("nvml", tensor, 1000.0)
    families = {f.name: f for f in render_families(store.snapshot())}
    (tensor_sample,) = families["moptd_gpu_tensor_active_ratio"].samples
    assert tensor_sample.labels["gpu"] == "0"
    assert "moptd_gpu_pcie_receive_bytes_per_second" in families
    (proc,) = families["moptd_gpu_process_sm_utilization_ratio"].samples
    assert (proc.labels["gpu"], proc.labels["pid"], proc.value) == ("0", "710", 0.84)


def test_a_version_1_recording_replays_without_profile_values(tmp_path: Path):
    backend = RecordedBackend.from_file(OLD_RECORDING)
    backend.init()
    assert backend.read_profile(0) == ProfileReading()
    batches = read_samples(OLD_RECORDING)
    signals = {s.signal for _, b in batches for s in b.samples}
    assert "gpu.sm_active" not in signals
    assert "gpu.util" in signals
    # and the new recording's batches carry the profile values
    signals = {s.signal for _, b in read_samples(RECORDING) for s in b.samples}
    assert {"gpu.sm_active", "gpu.dram_active", "process.gpu_sm_util"} <= signals


def test_process_utilisation_series_are_capped_to_the_busiest():
    procs = tuple(
        ProcessReading(pid, 1.0, "C", "", sm_util=pid / 1000, mem_util=0.0)
        for pid in range(1, PROCESS_UTIL_CAP + 11)
    )
    batch = Batch()
    add_processes(batch, 0, procs)
    util = {s.subject for s in batch.samples if s.signal == "process.gpu_sm_util"}
    assert len(util) == PROCESS_UTIL_CAP
    assert "process:1" not in util
    assert f"process:{PROCESS_UTIL_CAP + 10}" in util
    # memory stays exported for every process, as before
    mem = {s.subject for s in batch.samples if s.signal == "process.gpu_memory"}
    assert len(mem) == len(procs)


def test_process_util_round_trips_and_old_process_dicts_read():
    p = ProcessReading(7, 5.0, "C", "", 0.5, 0.25, 0.0, 0.125)
    slow = SlowReading(processes=(p,))
    assert reading_from_dict(SlowReading, reading_to_dict(slow)) == slow
    old = reading_from_dict(SlowReading, {"processes": [{"pid": 7, "used_memory": 5.0}]})
    assert old.processes[0].sm_util is None


def test_cli_build_probe(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "rec.jsonl"
    assert main(["build-probe", "--probe", str(PROBE), "--out", str(out)]) == 0
    assert out.read_text() == RECORDING.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "moptd-gpu-depth-probe/1", "gpus": []}))
    assert main(["build-probe", "--probe", str(bad), "--out", str(out)]) == 1
    assert "bad.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (json.dumps({"gpu": 0, "tier": "profile", "reading": {"sm_active": "x"}}), "number"),
        (
            json.dumps({"gpu": 0, "tier": "slow", "reading": {"processes": [{"sm_util": 1}]}}),
            "missing key 'pid'",
        ),
    ],
)
def test_bad_profile_lines_name_file_line_and_key(line: str, needle: str):
    with pytest.raises(RecordingError) as e:
        parse_recording([json.dumps({"format": FORMAT}), line], "rec.jsonl")
    assert str(e.value).startswith("rec.jsonl:2: ")
    assert needle in str(e.value)


_value = st.one_of(
    st.none(),
    st.integers(-3, 200),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["format", "taken", "driver_version", "gpus", "phases"]),
        st.one_of(
            _value,
            st.lists(
                st.dictionaries(
                    st.sampled_from(["index", "uuid", "gpus", "gpm", "process_util", "phase"]),
                    st.one_of(
                        _value,
                        st.dictionaries(
                            st.sampled_from(["supported", "metrics", "t2", "utilization"]),
                            _value,
                            max_size=3,
                        ),
                    ),
                    max_size=4,
                ),
                max_size=3,
            ),
        ),
        max_size=5,
    )
)
def test_random_probes_raise_only_recording_error(obj: dict[str, object]):
    obj.setdefault("format", "moptd-gpu-depth-probe/1")
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "probe.json"
        f.write_text(json.dumps(obj))
        try:
            from_probe(f)
        except RecordingError:
            pass


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["pid", "used_memory", "type", "sm_util", "mem_util", "dec_util"]),
        _value,
        max_size=6,
    )
)
def test_random_process_entries_raise_only_recording_error(proc: dict[str, object]):
    line = json.dumps({"gpu": 0, "tier": "slow", "reading": {"processes": [proc]}})
    try:
        parse_recording([line], "fuzz.jsonl")
    except RecordingError:
        pass


def test_per_link_nvlink_values_become_labelled_series_and_round_trip():
    slow = SlowReading(
        nvlink_links_active=2.0,
        nvlink_link_up={"0": 1.0, "1": 1.0, "10": 0.0},
        nvlink_link_errors={"10:replay": 0.0, "1:replay": 3.0, "0:crc": 1.0},
        nvlink_link_bytes={"0:tx": 1024.0, "0:rx": 2048.0},
    )
    assert reading_from_dict(SlowReading, reading_to_dict(slow)) == slow
    batch = Batch()
    add_slow(batch, 0, slow)
    got = [
        (s.signal, dict(s.labels), s.value)
        for s in batch.samples
        if s.signal.startswith("gpu.nvlink_link_")
    ]
    assert ("gpu.nvlink_link_up", {"link": "10"}, 0.0) in got
    assert ("gpu.nvlink_link_errors", {"link": "1", "counter": "replay"}, 3.0) in got
    assert ("gpu.nvlink_link_bytes", {"link": "0", "direction": "rx"}, 2048.0) in got
    errors = [g[1]["link"] for g in got if g[0] == "gpu.nvlink_link_errors"]
    assert errors == ["0", "1", "10"]  # numeric link order


def test_the_h200_vm_has_no_per_link_series():
    """NVML refused every NVLink call on the probe's VM: nothing per link is recorded."""
    signals = {s.signal for _, b in read_samples(RECORDING) for s in b.samples}
    assert not any(name.startswith("gpu.nvlink_link_") for name in signals)


def test_mig_devices_and_activity_become_labelled_series_and_round_trip():
    slow = SlowReading(
        mig_devices=(
            MigReading(1, 0, "MIG-a", 10.0 * 2**30, 2.0 * 2**30),
            MigReading(2, 0, "MIG-b", 20.0 * 2**30, None),
        )
    )
    profile = ProfileReading(gpm_supported=1.0, mig_activity={"1:sm_active": 0.5})
    assert reading_from_dict(SlowReading, reading_to_dict(slow)) == slow
    assert reading_from_dict(ProfileReading, reading_to_dict(profile)) == profile
    out = io.StringIO()
    rec = load_recording(OLD_RECORDING)
    rec.entries.append(replace(rec.entries[-1], reading=slow))
    dump_recording(rec, out)
    assert json.loads(out.getvalue().splitlines()[0])["format"] == FORMAT  # needs version 2
    batch = Batch()
    add_slow(batch, 0, slow)
    add_profile(batch, 0, profile)
    got = {(s.signal, s.labels, s.value) for s in batch.samples if "mig" in s.signal}
    gi1 = (("compute_instance", "0"), ("gpu_instance", "1"))
    assert ("gpu.mig_memory_used", gi1, 2.0 * 2**30) in got
    assert ("gpu.mig_memory_total", gi1, 10.0 * 2**30) in got
    assert not any(s == "gpu.mig_memory_used" and "2" in dict(lab).values() for s, lab, _ in got)
    assert ("gpu.mig_activity", (("gpu_instance", "1"), ("metric", "sm_active")), 0.5) in got


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["gpu_instance", "compute_instance", "uuid", "memory_used"]),
            _value,
            max_size=4,
        ),
        max_size=3,
    )
)
def test_random_mig_entries_raise_only_recording_error(devices: list[dict[str, object]]):
    line = json.dumps({"gpu": 0, "tier": "slow", "reading": {"mig_devices": devices}})
    try:
        parse_recording([line], "fuzz.jsonl")
    except RecordingError:
        pass


LIVE = H200 / "nvml_recording_h200_gpm.jsonl"


def test_a_true_h200_recording_reads_idle_then_matmul_then_idle():
    """The recording `record` took on the H200 while a bf16 matmul ran for 9 s of 26: GPM
    reads the load as SM and tensor activity and nothing while idle, as an expert expects;
    per-process utilisation names the matmul process."""
    rec = load_recording(LIVE)
    profiles = [r for r in rec.entries if r.tier == "profile" and r.reading is not None]
    tensor = [getattr(r.reading, "tensor_active", None) for r in profiles]
    values = [t for t in tensor if t is not None]
    assert values[0] == 0.0
    assert values[-1] == 0.0
    assert max(values) > 0.5  # the matmul: HMMA work
    busy = [r.reading for r in profiles if (getattr(r.reading, "tensor_active", 0) or 0) > 0.5]
    assert all(p.sm_active >= p.tensor_active for p in busy)  # type: ignore[union-attr]
    assert all((p.dram_active or 0) < 0.5 for p in busy)  # type: ignore[union-attr]
    slow = [r.reading for r in rec.entries if r.tier == "slow" and r.reading is not None]
    procs = [p for s in slow for p in (getattr(s, "processes", None) or ())]
    assert procs, "the matmul process is in a slow reading"
    assert all(p.sm_util is not None and 0 < p.sm_util <= 1 for p in procs)
