"""The NVML collector's per-tick shortcuts (issue 32, GPU part) give exactly the samples of
the plain builders: FastSamples against add_fast, add_ages_at against add_ages, and the
collector's own read handle (moptd.collectors.nvml._Read) keeps a Future's rules."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from moptd.collectors.nvml import _DONE, _Pass, _Read
from moptd.gpu.batch import FastSamples, add_ages, add_ages_at, add_fast, age_keys, new_sample
from moptd.gpu.readings import FastReading
from moptd.gpu.recorded import RecordedBackend
from moptd.observations import Batch, Sample
from tests.conftest import FIXTURES

RECORDINGS = sorted((FIXTURES / "h200").glob("nvml_recording_*.jsonl"))


def plain(r: FastReading) -> list[Sample]:
    batch = Batch()
    add_fast(batch, 3, r)
    return batch.samples


def composed(cache: FastSamples, r: FastReading) -> list[Sample]:
    out: list[Sample] = []
    cache.add(out, r)
    return out


def test_the_recorded_fast_readings_give_add_fasts_samples_tick_after_tick():
    ticks = 0
    for path in RECORDINGS:
        backend = RecordedBackend.from_file(Path(path))
        for gpu in range(backend.device_count()):
            cache = FastSamples(3)
            stream = backend.recording.stream(gpu, "fast")
            for entry in stream:
                if isinstance(entry.reading, FastReading):
                    assert composed(cache, entry.reading) == plain(entry.reading)
                    ticks += 1
    assert ticks > 50  # the captures hold real fast readings


values = st.one_of(st.none(), st.sampled_from([0.0, 1.0, 0.5, 33.0, 78.7]), st.floats(0, 1e12))
readings = st.builds(
    FastReading,
    util=values,
    mem_util=values,
    memory_total=values,
    memory_used=values,
    memory_free=values,
    memory_reserved=values,
    temperature=values,
    power=values,
    sm_clock=values,
    mem_clock=values,
    pstate=values,
    clock_event_reasons=st.one_of(st.none(), st.integers(0, 0x1FF), st.integers(0, 2**40)),
)


@given(st.lists(readings, min_size=1, max_size=12))
def test_any_sequence_of_readings_gives_add_fasts_samples(seq):
    cache = FastSamples(3)
    for r in seq:
        assert composed(cache, r) == plain(r)


@given(
    st.dictionaries(
        st.sampled_from(["static", "fast", "slow", "costly", "energy", "profile"]),
        st.floats(0, 2e9),
        min_size=1,
    ),
    st.floats(0, 2e9),
)
def test_ages_at_are_add_ages(read_at, now):
    want = Batch()
    add_ages(want, 2, {t: now - read_at[t] for t in read_at})
    got: list[Sample] = []
    add_ages_at(got, "gpu:2", age_keys(read_at), read_at, now)
    assert got == want.samples


def test_a_read_cancelled_while_queued_is_never_started():
    rd = _Read()
    seen: list[object] = []
    rd.add_done_callback(seen.append)
    assert rd.cancel()
    assert rd.cancelled()
    assert rd.done()
    assert not rd.start()
    assert seen == [rd]


def test_a_running_read_cannot_be_cancelled_and_reports_once_finished():
    rd = _Read()
    assert rd.start()
    assert rd.running()
    assert not rd.cancel()
    assert not rd.done()
    seen: list[object] = []
    rd.add_done_callback(seen.append)
    rd.finish(_Pass(error=3))
    assert rd.state == _DONE
    assert rd.done()
    assert not rd.cancelled()
    assert rd.result().error == 3
    assert seen == [rd]
    late: list[object] = []
    rd.add_done_callback(late.append)  # after the end: called at once, as a Future does
    assert late == [rd]


@given(st.text(max_size=5), st.text(max_size=5), st.floats(allow_nan=False), st.booleans())
def test_new_sample_is_the_dataclasss_sample(signal, subject, value, labelled):
    labels = (("tier", "fast"),) if labelled else ()
    made = new_sample(signal, subject, value, labels)
    assert made == Sample(signal, subject, value, labels)
    assert hash(made) == hash(Sample(signal, subject, value, labels))
