"""The condition language: whitelist, three-valued logic, window functions, load-time errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.diagnose.expr import Compiler, Env, ExprError, truth
from moptd.diagnose.testing import expand_values
from moptd.observations import Batch, Event, labels_of
from moptd.proc.pci import normalize_pci
from moptd.store import SignalStore


def compile_gpu(text: str, **kw: object) -> object:
    return Compiler(CATALOG, scope="gpu", **kw).compile(text)  # type: ignore[arg-type]


@pytest.fixture
def store() -> SignalStore:
    s = SignalStore(clock=VirtualClock(0))
    for i, util in enumerate([0.2, 0.4, 0.6, 0.8]):
        b = Batch()
        b.add("gpu.util", "gpu:0", util)
        b.add("gpu.pcie_replays", "gpu:0", 10.0 * i)
        b.add("gpu.clock_event_reasons", "gpu:0", 0x8 | 0x80)
        b.add("gpu.nvlink_errors", "gpu:0", float(i), labels_of(counter="replay"))
        b.add("gpu.nvlink_errors", "gpu:0", 2.0 * i, labels_of(counter="recovery"))
        s.ingest("nvml", b, t=60.0 * i)
    s.add_events(
        [
            Event("kernel.xid", "gpu:0", 100.0, {"code": 79}),
            Event("kernel.xid", "gpu:1", 110.0, {"code": 13}),
        ]
    )
    return s


def run(text: str, store: SignalStore, now: float = 180.0, **env: object) -> object:
    ex = compile_gpu(text)
    return ex(Env(store, "gpu:0", now, **env))  # type: ignore[operator, arg-type]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gpu.util", 0.8),
        ("avg(gpu.util, 3m)", pytest.approx((0.2 + 0.4 + 0.6) / 3)),
        ("max(gpu.util, 2m)", 0.8),
        ("min(gpu.util, 2m)", 0.4),
        ("increase(gpu.pcie_replays, 3m)", 30.0),
        ("rate(gpu.pcie_replays, 3m)", pytest.approx(30.0 / 180)),
        ("slope(gpu.util, 3m) > 0", True),
        ("changes(gpu.util, 3m)", 3.0),
        ("quantile(0.5, gpu.util, 3m)", 0.4),
        ("count(kernel.xid, 10m, code == 79)", 1.0),
        ("count(kernel.xid, 10m)", 1.0),  # the gpu:1 line is another subject
        ("count(kernel.xid, 1m)", 0.0),
        ("gpu.clock_event_reasons & HW_SLOWDOWN != 0", True),
        ("gpu.clock_event_reasons & SW_THERMAL_SLOWDOWN != 0", False),
        ("increase(gpu.nvlink_errors, 3m)", 9.0),  # summed over label sets
        ('increase(gpu.nvlink_errors, 3m, counter="replay")', 3.0),
        ('last(gpu.nvlink_errors, counter="recovery")', 6.0),
        ("lowest(gpu.nvlink_errors)", 3.0),
        ("gpu.util * 100 >= 80 and not false", True),
        ("1 < gpu.util * 2 < 2", True),
        ("gpu.util in [0.8, 0.9]", True),
        ("present(gpu.util)", True),
        ("absent(gpu.temperature)", True),
        ("abs(-2) == 2", True),
        ("0.5m == 30", True),
        ("1h30m == 5400", True),
        ("'a' == 'a'", True),
    ],
)
def test_values(store: SignalStore, text: str, want: object) -> None:
    assert run(text, store) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gpu.temperature > 80", None),  # no evidence: unknown
        ("gpu.temperature > 80 and false", False),
        ("gpu.temperature > 80 or true", True),
        ("gpu.temperature > 80 or false", None),
        ("not (gpu.temperature > 80)", None),
        ("gpu.temperature + 1", None),
        ("gpu.util / 0", None),
        ("'a' < 1", None),
    ],
)
def test_unknown_propagates(store: SignalStore, text: str, want: object) -> None:
    assert truth(run(text, store)) is want


def test_stale_value_is_unknown(store: SignalStore) -> None:
    assert run("gpu.util", store, now=180.0 + 301) is None
    assert run("gpu.util", store, now=180.0 + 299) == 0.8


def test_missing_namespace_makes_counts_unknown(store: SignalStore) -> None:
    assert run("count(kernel.xid, 10m)", store, missing=frozenset({"kernel"})) is None


def test_events_match_by_pci_address(store: SignalStore) -> None:
    store.add_events(
        [Event("kernel.xid", "gpu:0000:3b:00.0", 170.0, {"code": 48, "pci_bus_id": "0000:3b:00.0"})]
    )
    assert run("count(kernel.xid, 1m)", store, pci_bus_id="0000:3b:00.0") == 1.0
    assert run("count(kernel.xid, 1m)", store) == 0.0


def test_trace_records_what_each_condition_saw(store: SignalStore) -> None:
    trace: list[tuple[str, object]] = []
    run("avg(gpu.util, 3m) > 0.1 and count(kernel.xid, 10m, code in [79]) > 0", store, trace=trace)
    assert trace == [
        ("avg(gpu.util, 3m)", pytest.approx(0.4)),
        ("count(kernel.xid, 10m, code in [79])", 1.0),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu.nope > 1", "unknown signal 'gpu.nope'"),
        ("gpu.util.__class__", "expected a signal name such as gpu.util"),
        (
            "__import__('os')",
            "unknown function '__import__' (functions: last, lowest, highest, "
            "avg, min, max, increase, rate, slope, changes, quantile, count, latest, present, "
            "absent, seen_for, abs)",
        ),
        (
            "open('/etc/passwd')",
            "unknown function 'open' (functions: last, lowest, highest, avg, "
            "min, max, increase, rate, slope, changes, quantile, count, latest, present, absent, "
            "seen_for, abs)",
        ),
        ("gpu.util[0]", "Subscript is not allowed in a condition"),
        ("[x for x in [1]]", "ListComp is not allowed in a condition"),
        ("lambda: 1", "Lambda is not allowed in a condition"),
        ("gpu.util ** 2", "operator Pow is not allowed"),
        ("gpu.util if true else 1", "IfExp is not allowed in a condition"),
        ("avg(gpu.util)", 'avg() takes avg(SIGNAL, WINDOW), labels as name="value"'),
        ("avg(gpu.util, gpu.util)", "expected a window duration such as 5m"),
        ("rate(gpu.util, 5m)", "rate() needs a counter; gpu.util is a gauge"),
        ("count(gpu.util, 5m)", "gpu.util is a gauge, count() takes an event stream"),
        ("kernel.xid > 1", "kernel.xid is an event stream: use count(kernel.xid, WINDOW)"),
        (
            "count(kernel.xid, 5m, colour == 1)",
            "unknown event field 'colour' (fields: "
            "caused_by, cmdline, code, compute_instance, container, diagnoses, error_status, "
            "facility, gpc, gpu_instance, incident, intrinfo, link, link_scope, location, "
            "message, mmu_access_type, mmu_client, mmu_engine, mmu_fault_type, mnemonic, "
            "nvlink5_action, nvlink5_severity, nvlink_unit, nvlink_xc, pci_bus_id, pid, plan, "
            "pod_uid, previous_recovery_action, "
            "previous_recovery_action_code, process, recovery_action, recovery_action_code, "
            "severity, sm, tpc, user, uuid)",
        ),
        ('last(gpu.util, reason="x")', "gpu.util has no label 'reason' (labels: none)"),
        ("last(collector.success)", 'collector.success needs collector="NAME"'),
        ("nope and true", "unknown name 'nope' (not a macro, list or constant)"),
        ("gpu.util >", "syntax error: invalid syntax"),
        ("quantile(2, gpu.util, 5m)", "quantile must be between 0 and 1"),
    ],
)
def test_errors_at_load(text: str, message: str) -> None:
    with pytest.raises(ExprError) as err:
        compile_gpu(text)
    assert err.value.message == message


def test_scope_checked_at_load() -> None:
    with pytest.raises(ExprError, match="per-gpu signal, not usable in a serving rule"):
        Compiler(CATALOG, scope="serving").compile("gpu.util > 0")


def test_macros_and_cycles() -> None:
    comp = Compiler(CATALOG, macros={"busy": "gpu.util > 0.5", "a": "b", "b": "a"}, scope="gpu")
    assert comp.compile("busy and true").signals == {"gpu.util"}
    with pytest.raises(ExprError, match=r"macro cycle: a -> b -> a"):
        Compiler(CATALOG, macros={"a": "b", "b": "a"}, scope="gpu").compile("a")


def test_pci_normalisation() -> None:
    assert normalize_pci("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci("0000:3b:00") == "0000:3b:00.0"
    assert normalize_pci("3b:00.1") == "0000:3b:00.1"
    assert normalize_pci("gpu") is None


# --- property-based -------------------------------------------------------------------

_atoms = st.sampled_from(
    [
        "gpu.util",
        "gpu.temperature",
        "1",
        "2.5",
        "5m",
        "true",
        "false",
        "avg(gpu.util, 1m)",
        "count(kernel.xid, 10m, code in [79])",
        "'x'",
        "HW_SLOWDOWN",
        "rate(gpu.pcie_replays, 1m)",
    ]
)
_ops = st.sampled_from([" and ", " or ", " < ", " == ", " + ", " * ", " & ", " in "])


@st.composite
def expressions(draw: st.DrawFn) -> str:
    parts = [draw(_atoms)]
    for _ in range(draw(st.integers(0, 4))):
        parts.append(draw(_ops))
        parts.append(draw(_atoms))
    text = "".join(parts)
    return f"not ({text})" if draw(st.booleans()) else text


@settings(max_examples=300, deadline=None)
@given(expressions())
def test_generated_expressions_compile_or_fail_cleanly(text: str) -> None:
    store = SignalStore(clock=VirtualClock(0))
    b = Batch()
    b.add("gpu.util", "gpu:0", 0.5)
    store.ingest("nvml", b, t=0)
    try:
        ex = compile_gpu(text)
    except ExprError:
        return
    v = ex(Env(store, "gpu:0", 30.0))  # type: ignore[operator]
    assert v is None or isinstance(v, bool | float | int | str | list)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_never_escapes(text: str) -> None:
    problem: ExprError | None = None
    try:
        compile_gpu(text)
    except ExprError as e:
        problem = e
    if problem is not None:
        assert problem.message
        assert problem.col >= 0


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-1e6, 1e6, allow_nan=False), st.floats(-100, 100, allow_nan=False), st.integers(0, 50)
)
def test_series_notation(a: float, b: float, n: int) -> None:
    text = f"{a!r}-{-b!r}x{n}" if str(b).startswith("-") else f"{a!r}+{b!r}x{n}"
    vals = expand_values(text)
    assert len(vals) == n + 1
    assert vals[0] == a
    assert vals[-1] == pytest.approx(a + b * n, rel=1e-9, abs=1e-6)


def test_series_notation_examples() -> None:
    assert expand_values("1+2x3 _ 5x1") == [1, 3, 5, 7, None, 5, 5]
    assert expand_values("_x2 4-1x2") == [None, None, None, 4, 3, 2]
    with pytest.raises(ValueError, match="bad series value 'x'"):
        expand_values("x")


def test_latest_is_the_newest_matching_events_field(store: SignalStore) -> None:
    store.add_events(
        [
            Event(
                "kernel.xid", "gpu:0", 120.0, {"code": 154, "recovery_action": "GPU Reset Required"}
            ),
            Event("kernel.xid", "gpu:0", 130.0, {"code": 154, "recovery_action": "None"}),
            Event("kernel.xid", "gpu:1", 140.0, {"code": 154, "recovery_action": "Node Reboot"}),
        ]
    )
    assert run('latest(kernel.xid, 10m, "recovery_action", code == 154)', store) == "None"
    # before the later line, the earlier one is the newest; another GPU's line never counts
    assert (
        run('latest(kernel.xid, 10m, "recovery_action")', store, now=125.0) == "GPU Reset Required"
    )
    assert run('latest(kernel.xid, 10m, "code")', store) == 154.0
    # nothing in the window, or a field the line did not print: unknown
    assert run('latest(kernel.xid, 1m, "code", code == 13)', store) is None
    assert run('latest(kernel.xid, 10m, "link", code == 79)', store) is None
    assert run('latest(kernel.xid, 10m, "code")', store, missing=frozenset({"kernel"})) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("latest(kernel.xid, 5m)", 'latest(STREAM, WINDOW, "FIELD"[, CONDITION]) takes three'),
        ("latest(kernel.xid, 5m, code)", 'latest() names its field as a string, e.g. "link"'),
        ('latest(kernel.xid, 5m, "colour")', "kernel.xid has no field 'colour' (fields: code,"),
        ('latest(gpu.util, 5m, "code")', "gpu.util is a gauge"),
        ('latest(kernel.xid, 5m, "code", colour == 1)', "unknown event field 'colour'"),
    ],
)
def test_latest_errors_at_load(text: str, message: str) -> None:
    with pytest.raises(ExprError) as info:
        compile_gpu(text)
    assert info.value.message.startswith(message), info.value.message
