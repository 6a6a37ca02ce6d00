"""A shared-memory wait that vLLM prints while its model still loads is no SCHEDULER_STALL.

vLLM's engine core waits on its shared-memory queue while the workers compile or profile,
and prints "No available shared memory broadcast block found in 60 seconds" each minute.
The logs are real (tests/fixtures/vllm-shm-wait/SOURCE.md, and the vLLM CPU capture of the
healthy bundle); they run through the log path the collector uses (log_events) and the
shipped serving rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.clock import VirtualClock
from moptd.diagnose.engine import evaluate
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.observations import Event
from moptd.serving.logparse import LogState, parse_line
from moptd.serving.logring import LogRing
from moptd.serving.logsource import log_events
from moptd.store import SignalStore
from tests.conftest import FIXTURES

SHM = FIXTURES / "vllm-shm-wait"
HEALTHY_LOG = FIXTURES / "bundles" / "vllm-log-healthy" / "serving" / "main" / "log.txt"
SUBJECT = "serving:main"


def events_of(lines: list[str], state: LogState | None = None, t: float = 1000.0) -> list[Event]:
    state = state if state is not None else LogState()
    return log_events(lines, t, SUBJECT, LogRing(1000), state, lambda st: st.shutting_down)


def stall_paths(events: list[Event], now: float) -> list[list[str]]:
    """The shipped rules over those events: the paths of SCHEDULER_STALL matches."""
    store = SignalStore(VirtualClock(now))
    store.add_events(events)
    loaded = load_rules([default_rules_dir()])
    assert not loaded.errors
    return [
        r.path
        for r in evaluate(loaded.ruleset, store, now)
        if r.status == "match" and r.verdict is not None and r.verdict.code == "SCHEDULER_STALL"
    ]


def test_shm_waits_during_compilation_and_profiling_are_loading() -> None:
    lines = (SHM / "club3090_46_load.log").read_text().splitlines()
    events = events_of(lines)
    hangs = [e for e in events if e.stream == "serving.hang"]
    assert [(h.fields["kind"], h.fields["seconds"], h.fields["phase"]) for h in hangs] == [
        ("shm_broadcast", 60.0, "loading"),
        ("shm_broadcast", 60.0, "loading"),
    ]
    assert stall_paths(events, 1030.0) == []


def test_a_shm_wait_while_serving_is_a_stall() -> None:
    lines = (SHM / "vllm_omni_2928_serving.log").read_text().splitlines()
    events = events_of(lines)
    hangs = [e for e in events if e.stream == "serving.hang"]
    assert [h.fields["phase"] for h in hangs] == ["serving"]  # a log followed mid-run
    assert stall_paths(events, 1030.0) == [["serving-scheduler-stall/hang-lines"]]


def test_the_phase_follows_a_real_start_up_log() -> None:
    # vLLM on CPU: loading the model, init engine, then "Starting vLLM server on ..."
    state = LogState()
    phases = []
    for line in HEALTHY_LOG.read_text().splitlines():
        events_of([line], state)
        phases.append(state.loading)
    text = HEALTHY_LOG.read_text().splitlines()
    loading_at = next(i for i, ln in enumerate(text) if "Starting to load model" in ln)
    started_at = next(i for i, ln in enumerate(text) if "Starting vLLM server on" in ln)
    assert not any(phases[:loading_at])
    assert all(phases[loading_at:started_at])
    assert not any(phases[started_at:])
    assert state.started


def test_a_load_after_serving_and_its_start_line() -> None:
    # The same server's start-up read again after it served (a restart in one log file).
    state = LogState()
    text = HEALTHY_LOG.read_text().splitlines()
    events_of(text, state)
    assert not state.loading
    events_of((SHM / "club3090_46_load.log").read_text().splitlines(), state)
    assert state.loading
    started = next(ln for ln in text if "Application startup complete" in ln)
    events_of([started], state)
    assert not state.loading


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=30))
def test_any_lines_give_hang_events_with_a_phase(lines: list[str]) -> None:
    shm = (SHM / "club3090_46_load.log").read_text().splitlines()[3]
    for e in events_of([*lines, shm]):
        if e.stream == "serving.hang":
            assert e.fields["phase"] in ("loading", "serving", "unknown")
    for line in lines:
        parse_line(line)
