"""Reuse: a pass that takes the last pass's result where every read is unchanged gives the
same results as a pass that walks every rule, for the shipped rules, as values, time,
events and missing namespaces move."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.catalog import CATALOG, SignalSpec
from moptd.clock import VirtualClock
from moptd.diagnose.engine import Result, Reuse, evaluate
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.model import RuleSet
from moptd.observations import Batch, Event, labels_of
from moptd.store import SignalStore

SUBJECTS = {
    "gpu": ["gpu:0", "gpu:1"],
    "node": ["node"],
    "serving": ["serving:main"],
    "collector": ["collector:nvml"],
}
# label values the shipped rules ask for, and one they do not
LABELS = {
    "counter": ["replay", "recovery", "crc_flit", "crc_data"],
    "reason": ["hw_slowdown", "sw_power_cap", "gpu_idle"],
    "module": ["nvidia", "nvidia_uvm"],
    "node": ["nvidia0", "nvidiactl", "nvidia-uvm"],
    "engine": ["docker"],
    "quantile": ["0.5", "0.99"],
    "path": ["/", "/models"],
    "file": ["/etc/cdi/nvidia.yaml"],
    "user": ["vllm"],
    "probe": ["generate"],
}
SIGNALS: list[SignalSpec] = sorted(
    (s for s in CATALOG.values() if s.kind != "event" and s.subject in SUBJECTS),
    key=lambda s: s.name,
)
STREAMS = ["kernel.xid", "gpu.xid_event", "serving.engine_dead", "serving.startup_error"]
# gauges cross the shipped thresholds; None leaves the signal unwritten this step
GAUGE = st.sampled_from([None, None, 0.0, 1.0, 0.5, 0.97, 3.0, 95.0, 2e3, 9e10, math.nan])
TEXT = st.sampled_from([None, "535.104.05", "580.65.06", "Disabled", "Enabled"])
STEP = st.sampled_from([0.5, 1.0, 1.0, 1.0, 10.0, 61.0, 301.0, 3700.0])
EVENT = st.tuples(
    st.sampled_from(STREAMS),
    st.sampled_from(["gpu:0", "gpu:1", "gpu:0000:19:00.0", "node", "serving:main"]),
    st.sampled_from([13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 119, 154]),
    st.sampled_from(["kv_no_memory", "oom_on_load", "tokenizer", "other"]),
)
MISSING = st.frozensets(st.sampled_from(["gpu", "kernel", "serving", "host", "driver"]))


@pytest.fixture(scope="module")
def shipped() -> RuleSet:
    loaded = load_rules([default_rules_dir()])
    assert loaded.errors == []
    return loaded.ruleset


def outcome(results: list[Result]) -> str:
    """Everything a result says, as text (NaN evidence compares equal this way)."""
    return repr(
        [
            (
                r.rule.id,
                r.subject,
                r.status,
                r.verdict.code if r.verdict else None,
                r.path,
                r.unknown,
                r.evidence,
                r.summary,
                r.actions,
                [(s.node, s.cond, s.value, s.seen) for s in r.steps],
                r.pci_bus_id,
            )
            for r in results
        ]
    )


def step_batch(values: list[float | str | None], counters: dict[tuple[str, str], float]) -> Batch:
    b = Batch()
    for spec, v in zip(SIGNALS, values, strict=True):
        if v is None:
            continue
        for i, subject in enumerate(SUBJECTS[spec.subject]):
            label_sets = [()]
            if spec.labels:
                name = spec.labels[0]
                label_sets = [labels_of({name: x}) for x in LABELS.get(name, ["x"])]
            for lbl in label_sets:
                if spec.kind == "counter" and isinstance(v, float):
                    key = (spec.name, subject)
                    # a counter mostly rises; a NaN step stands for a reset
                    counters[key] = 0.0 if v != v else counters.get(key, 0.0) + v * (i + 1)
                    b.add(spec.name, subject, counters[key], lbl)
                elif spec.kind == "info":
                    b.add(spec.name, subject, v if isinstance(v, str) else None, lbl)
                else:
                    b.add(spec.name, subject, v if isinstance(v, float) else None, lbl)
    b.describe("gpu:0", pci_bus_id="00000000:19:00.0")
    b.describe("gpu:1", pci_bus_id="00000000:1A:00.0")
    return b


step = st.tuples(
    STEP,
    st.lists(st.one_of(GAUGE, TEXT), min_size=len(SIGNALS), max_size=len(SIGNALS)),
    st.lists(EVENT, max_size=3),
    MISSING,
    st.integers(0, 4),  # which (rule, subject) pairs have an open finding: traced
)


def traced_by(salt: int) -> Callable[[str, str], bool] | None:
    """The daemon traces a rule whose finding is still open; 4: none is."""
    if salt == 4:
        return None
    return lambda rule, subject: zlib.crc32(f"{rule} {subject}".encode()) % 4 == salt


def pairs(results: list, traced: Callable[[str, str], bool] | None) -> frozenset:
    """`traced` as the daemon passes it: the (rule id, subject) pairs it holds."""
    if traced is None:
        return frozenset()
    return frozenset(
        (r.rule.id, r.subject) for r in results if traced(r.rule.id, r.subject)
    ) | {("no-such-rule", "gpu:0")}


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=2, max_size=12))
def test_reuse_gives_the_results_of_a_full_walk(shipped: RuleSet, steps: list) -> None:
    clock = VirtualClock(1000.0)
    store = SignalStore(clock=clock)
    reuse, by_set = Reuse(), Reuse()
    counters: dict[tuple[str, str], float] = {}
    now = 1000.0
    for dt, values, events, missing, salt in steps:
        now += dt
        clock.set(now)
        store.ingest("test", step_batch(values, counters), t=now)
        store.add_events(
            Event(stream, subject, now, {"code": code, "kind": kind})
            for stream, subject, code, kind in events
        )
        traced = traced_by(salt)
        full = evaluate(shipped, store, now, missing, traced=traced)
        again = evaluate(shipped, store, now, missing, traced=traced, reuse=reuse)
        assert outcome(again) == outcome(full)
        # the same pairs given as a set, with a reuse of their own
        as_set = evaluate(shipped, store, now, missing, traced=pairs(full, traced), reuse=by_set)
        assert outcome(as_set) == outcome(full)


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=2, max_size=12))
def test_reuse_as_replay_reads_gives_the_results_of_a_full_walk(
    shipped: RuleSet, steps: list
) -> None:
    """As replay evaluates: each namespace's series read as of its newest evidence
    (evidence_at), which a reused result may rest on however far the clock moves, until
    new evidence of the namespace or the retention changes what the read sees."""
    clock = VirtualClock(1000.0)
    store = SignalStore(clock=clock)
    reuse, by_set = Reuse(), Reuse()
    counters: dict[tuple[str, str], float] = {}
    evidence: dict[str, float] = {}
    now = 1000.0
    for dt, values, events, missing, salt in steps:
        now += dt
        clock.set(now)
        batch = step_batch(values, counters)
        store.ingest("test", batch, t=now)
        for sample in batch.samples:
            evidence[sample.signal.partition(".")[0]] = now
        store.add_events(
            Event(stream, subject, now, {"code": code, "kind": kind})
            for stream, subject, code, kind in events
        )
        traced = traced_by(salt)
        full = evaluate(shipped, store, now, missing, traced=traced, evidence_at=evidence)
        again = evaluate(
            shipped, store, now, missing, traced=traced, reuse=reuse, evidence_at=evidence
        )
        assert outcome(again) == outcome(full)
        as_set = evaluate(
            shipped,
            store,
            now,
            missing,
            traced=pairs(full, traced),
            reuse=by_set,
            evidence_at=evidence,
        )
        assert outcome(as_set) == outcome(full)


def test_a_steady_store_reuses_nearly_everything(shipped: RuleSet) -> None:
    clock = VirtualClock(1000.0)
    store = SignalStore(clock=clock)
    reuse = Reuse()
    values: list[float | str | None] = ["580.65.06" if s.kind == "info" else 1.0 for s in SIGNALS]
    counters: dict[tuple[str, str], float] = {}
    for t in range(1000, 1010):
        clock.set(float(t))
        # the same readings each second; counters stand still
        store.ingest("test", step_batch(values, counters), t=float(t))
        counters = {k: 0.0 for k in counters}
        results = evaluate(shipped, store, float(t), reuse=reuse)
    reused_last, unread_last = reuse.reused, reuse.unread
    again = evaluate(shipped, store, 1010.0, reuse=reuse)
    # everything is taken as it was, a match with its path and evidence too
    assert reuse.reused - reused_last == len(results) > 30
    matches = [r for r in again if r.status == "match"]
    assert matches
    assert all(r.steps and r.summary for r in matches)
    # and most without reading again: the store generations they read stand
    assert reuse.unread - unread_last > len(results) // 2


def one_rule(tmp_path: Path, condition: str) -> RuleSet:
    f = tmp_path / "t.rules.yaml"
    f.write_text(
        "schema: moptd.rules/v1\n"
        "rules:\n"
        "  - id: t\n    title: t\n    layer: hardware\n    scope: gpu\n"
        "    status: experimental\n"
        "    decide:\n"
        f"      - id: t\n        if: {condition}\n"
        "        verdict: {code: THERMAL_THROTTLE, summary: t, actions: [],"
        " runbook: https://example.invalid}\n"
    )
    loaded = load_rules([f])
    assert loaded.errors == []
    return loaded.ruleset


def test_a_changed_read_is_walked_again(tmp_path: Path) -> None:
    rules = one_rule(tmp_path, "gpu.temperature > 90")
    store = SignalStore(clock=VirtualClock(0.0))
    reuse = Reuse()

    def at(t: float, temp: float) -> str:
        b = Batch()
        b.add("gpu.temperature", "gpu:0", temp)
        store.ingest("test", b, t=t)
        return evaluate(rules, store, t, reuse=reuse)[0].status

    assert at(1.0, 50.0) == "ok"
    assert at(2.0, 50.0) == "ok"
    assert reuse.reused == 1
    assert at(3.0, 95.0) == "match"
    assert reuse.reused == 1
    assert at(4.0, 50.0) == "ok"
    # no new reading for longer than a value stays fresh: the read changes to unknown
    assert evaluate(rules, store, 400.0, reuse=reuse)[0].status == "unknown"


def test_a_changed_event_count_is_walked_again(tmp_path: Path) -> None:
    rules = one_rule(tmp_path, "count(kernel.xid, 1m) > 0")
    store = SignalStore(clock=VirtualClock(0.0))
    b = Batch()
    b.add("gpu.temperature", "gpu:0", 50.0)
    store.ingest("test", b, t=0.0)
    reuse = Reuse()

    def at(t: float) -> str:
        return evaluate(rules, store, t, reuse=reuse)[0].status

    assert at(1.0) == "ok"
    assert at(2.0) == "ok"
    assert reuse.reused == 1
    store.add_events([Event("kernel.xid", "gpu:0", 2.5, {"code": 79})])
    assert at(3.0) == "match"
    assert at(4.0) == "match"
    assert at(70.0) == "ok"  # the event left the window


def test_a_window_read_as_of_old_evidence_is_read_again_after_eviction(tmp_path: Path) -> None:
    """Replay reads the GPU's window as of its last dump (evidence_at). No new dump comes,
    so that time stands; but the store's retention drops the hot point from the window,
    and the reused result must follow what a full walk reads."""
    rules = one_rule(tmp_path, "max(gpu.temperature, 1h) > 90")
    store = SignalStore(clock=VirtualClock(0.0))
    reuse = Reuse()
    for t, temp in ((0.0, 95.0), (10.0, 50.0), (250.0, 50.0)):
        b = Batch()
        b.add("gpu.temperature", "gpu:0", temp)
        store.ingest("gpu", b, t=t)
    evidence = {"gpu": 250.0}

    def at(t: float) -> tuple[str, str]:
        full = evaluate(rules, store, t, evidence_at=evidence)[0].status
        return full, evaluate(rules, store, t, reuse=reuse, evidence_at=evidence)[0].status

    assert at(250.0) == ("match", "match")
    assert at(3000.0) == ("match", "match")
    assert reuse.unread == 1  # the read as of 250 s stood while the clock moved
    other = Batch()
    other.add("host.memory_available", "node", 1e9)
    store.ingest("host", other, t=3800.0)  # the retention's pass drops the 95 at 0 s
    assert at(3800.0) == ("ok", "ok")


def test_subjects_follow_new_event_subjects_and_changed_addresses(tmp_path: Path) -> None:
    """Reuse keeps each scope's subjects while the store's layout stands: a GPU known only
    from a kernel line, and a GPU whose PCI address changes to that line's, must show."""
    rules = one_rule(tmp_path, "count(kernel.xid, 1h) > 0")
    store = SignalStore(clock=VirtualClock(0.0))
    reuse = Reuse()

    def gpu0(pci: str, t: float) -> None:
        b = Batch()
        b.add("gpu.temperature", "gpu:0", 50.0)
        b.describe("gpu:0", pci_bus_id=pci)
        store.ingest("t", b, t=t)

    def at(t: float) -> list[tuple[str, str]]:
        full = [(r.subject, r.status) for r in evaluate(rules, store, t)]
        again = [(r.subject, r.status) for r in evaluate(rules, store, t, reuse=reuse)]
        assert again == full
        return again

    gpu0("00000000:19:00.0", 0.0)
    assert at(1.0) == [("gpu:0", "ok")]
    store.add_events([Event("kernel.xid", "gpu:0", 1.5, {"code": 79})])
    assert at(2.0) == [("gpu:0", "match")]
    # a second subject in a stream that was there already
    store.add_events([Event("kernel.xid", "gpu:0000:3b:00.0", 2.5, {"code": 79})])
    assert at(3.0) == [("gpu:0", "match"), ("gpu:0000:3b:00.0", "match")]
    gpu0("00000000:3B:00.0", 4.0)  # the line's GPU is gpu:0 after all
    assert at(5.0) == [("gpu:0", "match")]
