"""count(STREAM, WINDOW[, WHERE]) kept incrementally agrees with walking the event log, for
every subject, as time moves on and events arrive (and when a query goes back in time)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.diagnose import expr
from moptd.diagnose.expr import Compiler, Env
from moptd.observations import Event
from moptd.store import SignalStore

SUBJECTS = ["gpu:0", "gpu:1", "gpu:0000:19:00.0", "gpu:0000:1a:00.0", "node"]
ENVS = [("gpu:0", "0000:19:00.0"), ("gpu:1", None), ("gpu:2", "0000:1a:00.0")]
CONDITIONS = [
    ("gpu", "count(kernel.xid, 60s)"),
    ("gpu", "count(kernel.xid, 30s, code in [48, 79])"),
    ("node", "count(kernel.xid, 45s, code == 13)"),
]

event = st.tuples(
    st.floats(0, 20),  # seconds after the previous step
    st.sampled_from(SUBJECTS),
    st.sampled_from([13, 48, 79]),
    st.sampled_from([None, "0000:19:00", "00000000:1A:00.0"]),
)


def plain(compiled, env: Env) -> object:
    expr.INCREMENTAL_COUNT = False
    try:
        return compiled(env)
    finally:
        expr.INCREMENTAL_COUNT = True


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(event, max_size=6), st.floats(0.5, 40)), max_size=25),
       st.integers(5, 40))
def test_incremental_count_agrees_with_the_plain_walk(steps, max_events):
    store = SignalStore(clock=VirtualClock(0.0), max_events=max_events)
    compiled = [(scope, Compiler(CATALOG, scope=scope).compile(text)) for scope, text in CONDITIONS]
    now = 1000.0
    for batch, dt in steps:
        events = []
        t = now
        for gap, subject, code, pci in batch:
            t = min(t + gap, now + dt)  # arrive no later than the next step
            fields = {"code": code, "pci_bus_id": pci} if pci else {"code": code}
            events.append(Event("kernel.xid", subject, t, fields))
        store.add_events(events)
        now += dt
        for scope, c in compiled:
            for subject, pci in ENVS if scope == "gpu" else [("node", None)]:
                env = Env(store, subject, now, pci)
                assert c(env) == plain(c, env), (scope, c.text, subject, now)
                past = Env(store, subject, now - dt / 2, pci)  # back in time: plain walk
                assert c(past) == plain(c, past)
