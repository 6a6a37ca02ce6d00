"""Finding lifecycle: pending -> firing -> resolved, for/keep_firing_for, flap damping, reload."""

from __future__ import annotations

from pathlib import Path

from moptd.clock import VirtualClock
from moptd.diagnose.lifecycle import Damping
from moptd.diagnose.loader import load_rules
from moptd.diagnose.service import RuleService
from moptd.observations import Batch, Sample
from moptd.store import SignalStore

RULE = """\
schema: moptd.rules/v1
rules:
  - id: hot
    title: hot
    layer: hardware
    scope: gpu
    status: experimental
    for: {for_}
    keep_firing_for: {keep}
    decide:
      - id: hot
        if: gpu.temperature > 90
        verdict: {{code: THERMAL_THROTTLE, summary: hot, actions: [], runbook: https://x.invalid}}
"""


def setup(
    tmp_path: Path, for_: str = "30s", keep: str = "0s", damping: Damping | None = None
) -> tuple[RuleService, SignalStore, VirtualClock, Path]:
    f = tmp_path / "hot.rules.yaml"
    f.write_text(RULE.format(for_=for_, keep=keep))
    clock = VirtualClock(0)
    store = SignalStore(clock=clock)
    svc = RuleService(store, clock, [f], damping=damping)
    assert svc.errors == []
    return svc, store, clock, f


def feed(
    svc: RuleService,
    store: SignalStore,
    clock: VirtualClock,
    temps: list[float | None],
    step: float = 10,
) -> list[tuple[float, str, str]]:
    out = []
    for temp in temps:
        if temp is not None:
            b = Batch()
            b.add("gpu.temperature", "gpu:0", temp)
            store.ingest("nvml", b, clock.now())
        out += [(tr.t, tr.old, tr.new) for tr in svc.tick()]
        clock.advance(step)
    return out


def test_pending_then_firing_then_resolved(tmp_path: Path) -> None:
    svc, store, clock, _ = setup(tmp_path)
    trs = feed(svc, store, clock, [95, 95, 95, 95, 50])
    assert trs == [
        (0, "inactive", "pending"),
        (30, "pending", "firing"),
        (40, "firing", "resolved"),
    ]
    assert svc.active() == []
    (done,) = svc.history()
    assert (done.first_seen, done.last_seen, done.resolved_at) == (30, 30, 40)


def test_pending_that_clears_never_fires(tmp_path: Path) -> None:
    svc, store, clock, _ = setup(tmp_path)
    assert feed(svc, store, clock, [95, 95, 50]) == [
        (0, "inactive", "pending"),
        (20, "pending", "inactive"),
    ]


def test_keep_firing_for_and_unknown_hold(tmp_path: Path) -> None:
    svc, store, clock, _ = setup(tmp_path, for_="0s", keep="30s")
    trs = feed(svc, store, clock, [95, 50, 50, 50, 50])
    assert trs == [(0, "inactive", "pending"), (0, "pending", "firing"), (30, "firing", "resolved")]
    # Unknown (the value went stale) neither resolves nor promotes.
    (tmp_path / "b").mkdir()
    svc2, store2, clock2, _ = setup(tmp_path / "b", for_="0s", keep="0s")
    trs2 = feed(svc2, store2, clock2, [95] + [None] * 40, step=10)
    assert trs2 == [(0, "inactive", "pending"), (0, "pending", "firing")]
    assert len(svc2.active()) == 1


def test_flap_damping_holds_a_flapping_finding(tmp_path: Path) -> None:
    damping = Damping(flap_window=600, flap_threshold=3, flap_hold=120)
    svc, store, clock, _ = setup(tmp_path, for_="0s", keep="0s", damping=damping)
    trs = feed(svc, store, clock, [95, 50, 95, 50, 95, 50, 50, 50])
    fired = [t for t, _, new in trs if new == "firing"]
    resolved = [t for t, _, new in trs if new == "resolved"]
    assert fired == [0, 20, 40]
    assert resolved == [10, 30]  # the third fire is held: 3 fires in the window


def test_findings_batch_for_the_exporter(tmp_path: Path) -> None:
    svc, store, clock, _ = setup(tmp_path, for_="10s")

    def findings_samples() -> list[Sample]:
        # the batch also carries moptd_rules_loaded / moptd_rules_load_errors
        return [s for s in svc.findings_batch().samples if s.signal.startswith("finding.")]

    feed(svc, store, clock, [95])
    (pending,) = findings_samples()
    assert pending.signal == "finding.pending"
    feed(svc, store, clock, [95])
    (firing,) = findings_samples()
    assert (firing.signal, firing.subject, dict(firing.labels)) == (
        "finding.active",
        "node",
        {"rule": "hot", "code": "THERMAL_THROTTLE", "severity": "warning", "subject": "gpu:0"},
    )


def test_reload_refuses_a_bad_set_and_keeps_the_last_good(tmp_path: Path) -> None:
    svc, _store, _clock, f = setup(tmp_path)
    f.write_text(f.read_text().replace("gpu.temperature", "gpu.nope"))
    assert svc.put_in_force(load_rules([f])) == []
    assert [str(e) for e in svc.errors] == [
        f"{f}:12: rule hot: branch hot: unknown signal 'gpu.nope'"
    ]
    assert [r.id for r in svc.ruleset.rules] == ["hot"]
    f.write_text(
        f.read_text()
        .replace("gpu.nope", "gpu.temperature")
        .replace("id: hot\n    title", "id: warm\n    title")
    )
    svc.put_in_force(load_rules([f]))
    assert svc.errors == []
    assert [r.id for r in svc.ruleset.rules] == ["warm"]
