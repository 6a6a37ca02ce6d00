"""The recorded NVML backend, built from the real H200 captures."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.catalog import CATALOG
from moptd.gpu.readings import (
    FastReading,
    GpuLost,
    NvmlCallError,
    SlowReading,
    StaticReading,
    reading_from_dict,
    reading_to_dict,
)
from moptd.gpu.recorded import (
    RecordedBackend,
    RecordingError,
    dump_recording,
    from_captures,
    load_recording,
    main,
    parse_recording,
    read_samples,
)
from tests.conftest import FIXTURES

H200 = FIXTURES / "h200"
RECORDING = H200 / "nvml_recording_from_captures.jsonl"
SAMPLES = H200 / "nvml_samples.jsonl"
DUMPS = [H200 / "nvsmi_idle.xml", H200 / "nvsmi_load.xml"]


def built() -> str:
    out = io.StringIO()
    dump_recording(from_captures(DUMPS, SAMPLES), out)
    return out.getvalue()


def test_committed_recording_is_what_the_captures_build():
    """The fixture is derived, not hand-made: rebuilding it from the captures gives it back."""
    assert RECORDING.read_text() == built()


def test_recording_follows_the_capture():
    rec = load_recording(RECORDING)
    assert rec.gpus == 1
    assert rec.driver_version == "580.159.04"
    fast = [e.reading for e in rec.stream(0, "fast")]
    assert len(fast) == 90
    samples = [json.loads(line) for line in SAMPLES.read_text().splitlines()]
    for r, s in zip(fast, samples, strict=True):
        assert isinstance(r, FastReading)
        assert r.util == pytest.approx(s["util"] / 100)
        assert r.power == pytest.approx(s["power_mw"] / 1000)
        assert r.sm_clock == s["sm_clock"] * 1e6
        assert r.clock_event_reasons == s["clock_event_reasons"]
    # Under load the SW power cap (bit 4) holds the clocks down, at idle GpuIdle (bit 1).
    assert {r.clock_event_reasons for r in fast if isinstance(r, FastReading)} >= {1, 4}
    slow = [e.reading for e in rec.stream(0, "slow")]
    # The load dump was taken after the last sample, so every sample takes the idle
    # dump's slow values (power-cap counter still 0) plus its own PCIe gen and processes.
    assert all(isinstance(r, SlowReading) for r in slow)
    assert {r.clock_event_time["sw_power_cap"] for r in slow if isinstance(r, SlowReading)} == {0.0}
    busy = [r for r in slow if isinstance(r, SlowReading) and r.processes]
    assert busy
    assert busy[0].processes[0].pid == 432


def test_replay_order_wraps_and_replicates():
    backend = RecordedBackend.from_file(RECORDING, replicate=8)
    backend.init()
    assert backend.device_count() == 8
    statics = [backend.read_static(i) for i in range(8)]
    assert [s.index for s in statics] == list(range(8))
    assert len({s.uuid for s in statics}) == 8
    assert statics[0].uuid == "GPU-a825b2f6-3dfa-91e3-255f-343d3b48604a"
    first = backend.read_fast(3)
    for _ in range(89):
        backend.read_fast(3)
    assert backend.read_fast(3) == first  # wrapped after 90
    assert backend.read_fast(4) == first  # GPU 4 has its own cursor
    with pytest.raises(NvmlCallError):
        backend.read_fast(8)


def _rec(*lines: dict) -> list[str]:
    return [json.dumps({"format": "moptd-nvml-recording/1", "gpus": 2}), *map(json.dumps, lines)]


def test_faults_lost_error_hang_and_xid():
    rec = parse_recording(
        _rec(
            {"gpu": 0, "tier": "fast", "reading": {"util": 0.5}},
            {"gpu": 1, "tier": "fast", "fault": "error", "code": 10},
            {"gpu": 1, "tier": "fast", "fault": "hang", "seconds": 0.05},
            {"gpu": 1, "tier": "fast", "reading": {"util": 0.25}},
            {"gpu": 1, "tier": "fast", "fault": "lost"},
            {"gpu": 0, "xid": 79},
        )
    )
    b = RecordedBackend(rec)
    assert b.read_fast(0).util == 0.5
    with pytest.raises(NvmlCallError) as e:
        b.read_fast(1)
    assert e.value.code == 10
    assert b.read_fast(1).util == 0.25  # after the 50 ms hang
    with pytest.raises(GpuLost) as lost:
        b.read_fast(1)
    assert lost.value.code == 15
    with pytest.raises(GpuLost):
        b.read_static(1)  # lost is sticky, across tiers
    assert b.read_fast(0).util == 0.5  # the other GPU is untouched
    assert b.wait_xid(10) == [(0, 79)]
    assert b.wait_xid(10) == []


def test_slow_and_costly_split_one_slow_entry():
    b = RecordedBackend.from_file(H200 / "nvml_recording_h200.jsonl")
    slow, costly = b.read_slow(0), b.read_costly(0)
    assert slow.energy is None
    assert costly.energy is not None
    assert costly.energy > 1000  # joules since the driver loaded
    assert set(costly.clock_event_time) == {"hw_thermal_slowdown", "hw_power_brake_slowdown"}
    assert "sw_power_cap" in slow.clock_event_time
    assert "hw_power_brake_slowdown" not in slow.clock_event_time
    assert costly.processes == ()
    assert slow.bar1_total is not None


def test_real_h200_recording_shows_the_load():
    """Recorded on an H200 (driver 580.159.04) with 10 s of bf16 matmul in the middle."""
    rec = load_recording(H200 / "nvml_recording_h200.jsonl")
    assert rec.driver_version.startswith("580.")
    fast = [e.reading for e in rec.stream(0, "fast") if isinstance(e.reading, FastReading)]
    assert {f.clock_event_reasons for f in fast} >= {0x1, 0x4}  # idle, then SW power cap
    assert max(f.power or 0 for f in fast) > 600
    slow = [e.reading for e in rec.stream(0, "slow") if isinstance(e.reading, SlowReading)]
    capped = [s.clock_event_time["sw_power_cap"] for s in slow]
    assert capped == sorted(capped)
    assert capped[-1] > capped[0]  # the cumulative counter caught the capping


def test_reading_round_trip():
    rec = load_recording(RECORDING)
    for e in rec.entries:
        assert e.reading is not None
        again = reading_from_dict(type(e.reading), reading_to_dict(e.reading))
        assert again == e.reading


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"gpu": 0, "tier": "medium", "reading": {}}), "key 'tier'"),
        (json.dumps({"tier": "fast", "reading": {}}), "missing key 'gpu'"),
        (json.dumps({"gpu": 0, "tier": "fast", "reading": {"util": "high"}}), "number"),
        (json.dumps({"gpu": 0, "tier": "fast", "fault": "melt"}), "key 'fault'"),
        (json.dumps({"format": "other/9"}), "key 'format'"),
    ],
)
def test_bad_lines_name_file_line_and_key(line: str, needle: str):
    with pytest.raises(RecordingError) as e:
        parse_recording(["", line], "rec.jsonl")
    assert e.value.line == 2
    assert str(e.value).startswith("rec.jsonl:2: ")
    assert needle in str(e.value)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["t", "gpu", "tier", "reading", "fault", "xid", "format", "code"]),
            st.one_of(
                st.none(),
                st.integers(-3, 5),
                st.floats(allow_nan=False),
                st.sampled_from(["fast", "slow", "static", "lost", "hang", "x"]),
                st.dictionaries(
                    st.sampled_from(["util", "index", "processes", "uuid"]),
                    st.one_of(st.integers(), st.text(max_size=3), st.none()),
                ),
            ),
        ),
        max_size=6,
    )
)
def test_random_recordings_raise_only_recording_error(objs: list[dict]):
    try:
        parse_recording([json.dumps(o) for o in objs], "fuzz.jsonl")
    except RecordingError:
        pass


def test_read_samples_gives_catalog_batches_in_time_order():
    timeline = read_samples(RECORDING)
    assert len(timeline) == 90
    times = [t for t, _ in timeline]
    assert times == sorted(times)
    for _, batch in timeline:
        for s in batch.samples:
            assert s.signal in CATALOG
    util = [
        next(s.value for s in b.samples if s.signal == "gpu.util" and s.subject == "gpu:0")
        for _, b in timeline
    ]
    assert max(v for v in util if isinstance(v, float)) == 1.0
    _, loaded = timeline[20]
    procs = [s for s in loaded.samples if s.signal == "process.gpu_memory"]
    assert procs
    assert procs[0].subject == "process:432"


def test_read_samples_reads_bundle_rows_too():
    """A bundle's gpu/samples.jsonl holds nvml_samples.jsonl rows (no header line)."""
    timeline = read_samples(SAMPLES)
    assert len(timeline) == 90
    t, batch = timeline[0]
    assert t == 1795969286.868
    assert [s.value for s in batch.samples if s.signal == "gpu.power"] == [pytest.approx(94.963)]
    loaded = [b for _, b in timeline if any(s.signal == "process.gpu_memory" for s in b.samples)]
    assert loaded


def test_read_samples_bad_row_names_the_line(tmp_path: Path):
    p = tmp_path / "samples.jsonl"
    p.write_text('{"t": 1, "util": 5}\n{"util": 5}\n')
    with pytest.raises(RecordingError, match=r"samples.jsonl:2: t: Unix seconds expected"):
        read_samples(p)


def test_read_samples_marks_lost(tmp_path: Path):
    p = tmp_path / "samples.jsonl"
    p.write_text("\n".join(_rec({"t": 5.0, "gpu": 1, "tier": "fast", "fault": "lost"})))
    ((t, batch),) = read_samples(p)
    assert t == 5.0
    assert [(s.signal, s.subject, s.value) for s in batch.samples] == [("gpu.lost", "gpu:1", 1.0)]


def test_cli_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "rec.jsonl"
    args = ["build", "--dump", str(DUMPS[0]), "--dump", str(DUMPS[1])]
    assert main([*args, "--samples", str(SAMPLES), "--out", str(out)]) == 0
    assert out.read_text() == RECORDING.read_text()
    assert "wrote 181 entries" in capsys.readouterr().out


def test_cli_record_without_a_driver_reports_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """On this CPU host the real pynvml cannot find libnvidia-ml: a clear one-line error."""
    pytest.importorskip("pynvml")
    rc = main(["record", "--out", str(tmp_path / "r.jsonl"), "--seconds", "0.1"])
    err = capsys.readouterr().err
    if rc == 0:
        pytest.skip("an NVIDIA driver is present here")
    assert rc == 1
    assert err.startswith("error: ")
    assert "Traceback" not in err


def test_static_reading_index_follows_the_gpu_field():
    rec = parse_recording(_rec({"gpu": 1, "tier": "static", "reading": {"index": 7, "uuid": "u"}}))
    (e,) = rec.entries
    assert isinstance(e.reading, StaticReading)
    assert e.reading.index == 1
