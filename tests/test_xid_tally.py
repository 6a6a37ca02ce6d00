"""The shared Xid counter: an Xid reported by the kernel log and by NVML counts once, an
Xid only NVML saw counts, and one collector reports the counter."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.collector import CollectorContext
from moptd.collectors.nvml import NvmlCollector
from moptd.kernel.xid_tally import KERNEL, MATCH_WINDOW, NVML, XidTally
from moptd.observations import Batch, Event


def _counts(tally: XidTally) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    b = Batch()
    tally.report(b)
    xids = [s for s in b.samples if s.signal == "gpu.xid_errors"]
    return {(s.subject, s.labels): float(s.value) for s in xids}


def test_the_same_xid_from_both_sources_counts_once():
    t = XidTally()
    assert t.add(NVML, "gpu:0", 79, 100.0)
    assert not t.add(KERNEL, "gpu:0", 79, 100.4)  # the kernel line of the same Xid
    assert _counts(t) == {("gpu:0", (("xid", "79"),)): 1.0}


def test_an_xid_only_nvml_saw_counts():
    t = XidTally()
    for i in range(3):
        assert t.add(NVML, "gpu:1", 13, 50.0 + i * 60)
    assert _counts(t) == {("gpu:1", (("xid", "13"),)): 3.0}


def test_a_burst_seen_by_both_counts_as_many_as_the_source_that_saw_more():
    t = XidTally()
    for i in range(10):
        t.add(KERNEL, "gpu:2", 13, 10.0 + i * 0.01)
    for i in range(7):  # NVML dropped three of them
        t.add(NVML, "gpu:2", 13, 10.02 + i * 0.01)
    assert _counts(t) == {("gpu:2", (("xid", "13"),)): 10.0}


def test_other_codes_gpus_and_distant_times_are_other_xids():
    t = XidTally()
    t.add(NVML, "gpu:0", 79, 100.0)
    assert t.add(KERNEL, "gpu:0", 48, 100.0)
    assert t.add(KERNEL, "gpu:1", 79, 100.0)
    assert t.add(KERNEL, "gpu:0", 79, 100.0 + MATCH_WINDOW + 1)
    assert t.add(NVML, "gpu:0", 79, 100.0 + MATCH_WINDOW + 1.5) is False
    assert sum(_counts(t).values()) == 4


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([KERNEL, NVML]), st.integers(0, 2), st.floats(0, 100)),
        max_size=200,
    )
)
def test_the_count_is_between_the_larger_source_and_the_sum(occurrences):
    t = XidTally()
    for source, gpu, when in occurrences:
        t.add(source, f"gpu:{gpu}", 13, when)
    counts = _counts(t)
    for gpu in range(3):
        mine = [o for o in occurrences if o[1] == gpu]
        got = counts.get((f"gpu:{gpu}", (("xid", "13"),)), 0.0)
        per_source = [sum(1 for o in mine if o[0] == s) for s in (KERNEL, NVML)]
        assert max(per_source) <= got <= sum(per_source)


async def test_the_nvml_collector_hands_its_xid_events_to_the_shared_counter():
    shared = XidTally()
    published: list[Event] = []
    nvml = NvmlCollector(CollectorContext(xids=shared, publish=published.extend))
    ev = Event("gpu.xid_event", "gpu:0", 100.0, {"code": 79, "source": "nvml"}, "NVML Xid 79")
    nvml._publish([ev])  # what the Xid thread hands the loop
    assert published == [ev]
    assert _counts(shared) == {("gpu:0", (("xid", "79"),)): 1.0}
    assert not shared.add(KERNEL, "gpu:0", 79, 100.2)  # its kernel line: the same Xid


async def test_the_nvml_collector_reports_the_counter_where_the_kernel_log_is_not_followed(
    tmp_path,
):
    import asyncio

    from tests.test_nvml_collector import tick, write_recording

    path = write_recording(tmp_path, [{"gpu": 1, "xid": 79}])  # the recorded Xid event
    shared = XidTally()
    arrived = asyncio.Event()
    nvml = NvmlCollector(
        CollectorContext(
            options={"backend": "recorded", "recording": str(path)},
            state_dir=tmp_path,
            publish=lambda events: arrived.set(),
            xids=shared,
        )
    )
    await nvml.start()
    try:
        await asyncio.wait_for(arrived.wait(), 5)
        alone = await tick(nvml)  # no kernel collector follows the kernel log
        shared.kernel_following = True
        beside = await tick(nvml)  # one does: it reports the shared counter, NVML does not
    finally:
        await nvml.stop()
    xids = [(s.subject, s.labels, s.value) for s in alone.samples if s.signal == "gpu.xid_errors"]
    assert xids == [("gpu:1", (("xid", "79"),), 1.0)]
    assert [s for s in beside.samples if s.signal.startswith("gpu.xid_")] == []
