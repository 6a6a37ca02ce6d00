"""The engine: per-subject evaluation, ordered branches, recorded paths, unknown != healthy."""

from __future__ import annotations

from pathlib import Path

import pytest

from moptd.clock import VirtualClock
from moptd.diagnose.engine import evaluate, gpu_subjects
from moptd.diagnose.loader import load_rules
from moptd.diagnose.model import RuleSet
from moptd.observations import Batch, Event
from moptd.store import SignalStore

RULES = """\
schema: moptd.rules/v1
lists:
  bad: [79]
rules:
  - id: t
    title: test
    layer: hardware
    scope: gpu
    status: experimental
    evidence:
      temp: gpu.temperature
    decide:
      - id: lost
        if: count(kernel.xid, 10m, code in bad) > 0
        verdict: &v
          code: GPU_LOST
          summary: "{{subject}} lost at {{temp}} C"
          actions: [{kind: reboot_node, command: "nvidia-smi -i {{index}}"}]
          runbook: https://example.invalid
      - id: hot
        if: gpu.temperature > 90
        decide:
          - id: throttled
            if: gpu.clock_event_reasons & HW_THERMAL_SLOWDOWN != 0
            verdict: {code: THERMAL_THROTTLE, summary: "hot and throttled",
                      actions: [], runbook: https://example.invalid}
          - id: fine
            else: true
            ok: hot but not throttled yet
"""


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    f = tmp_path / "t.rules.yaml"
    f.write_text(RULES)
    loaded = load_rules([f])
    assert loaded.errors == []
    return loaded.ruleset


def store_with(**values: float) -> SignalStore:
    s = SignalStore(clock=VirtualClock(0))
    b = Batch()
    for name, v in values.items():
        b.add(f"gpu.{name}", "gpu:0", v)
    b.describe("gpu:0", pci_bus_id="00000000:3B:00.0")
    s.ingest("nvml", b, t=0)
    return s


def test_nested_branch_path_and_trace(rules: RuleSet) -> None:
    s = store_with(temperature=95, clock_event_reasons=0x40)
    s.add_events([Event("kernel.xid", "gpu:0", 0, {"code": 13})])
    (res,) = evaluate(rules, s, 10)
    assert res.status == "match"
    assert res.verdict is not None
    assert res.verdict.code == "THERMAL_THROTTLE"
    assert res.path == ["t/hot", "t/hot/throttled"]
    assert [(st.node, st.value) for st in res.steps] == [
        ("t/lost", False),
        ("t/hot", True),
        ("t/hot/throttled", True),
    ]
    assert res.steps[1].seen == [("gpu.temperature", 95.0)]
    assert res.pci_bus_id == "0000:3b:00.0"


def test_ok_leaf_is_healthy(rules: RuleSet) -> None:
    s = store_with(temperature=95, clock_event_reasons=0)
    (res,) = evaluate(rules, s, 10)
    assert (res.status, res.path) == ("ok", ["t/hot", "t/hot/fine"])


def test_missing_evidence_is_unknown_not_healthy(rules: RuleSet) -> None:
    s = store_with(util=0.5)
    (res,) = evaluate(rules, s, 10, missing=frozenset({"kernel"}))
    assert res.status == "unknown"
    assert res.unknown == [
        "t/lost: count(kernel.xid, 10m, code in bad) > 0",
        "t/hot: gpu.temperature > 90",
    ]


def test_summary_and_actions_are_rendered(rules: RuleSet) -> None:
    s = store_with(temperature=40)
    s.add_events([Event("kernel.xid", "gpu:0", 5, {"code": 79})])
    (res,) = evaluate(rules, s, 10)
    assert res.summary == "gpu:0 lost at 40 C"
    assert res.actions == ["reboot_node: nvidia-smi -i 0"]
    assert res.evidence == {"temp": 40}


def test_kernel_only_gpu_is_a_pci_subject_unless_an_index_carries_it() -> None:
    s = SignalStore(clock=VirtualClock(0))
    s.add_events([Event("kernel.xid", "gpu:0000:9b:00.0", 0, {"code": 119})])
    assert gpu_subjects(s) == [("gpu:0000:9b:00.0", "0000:9b:00.0")]
    b = Batch()
    b.add("gpu.util", "gpu:4", 0.0)
    b.describe("gpu:4", pci_bus_id="00000000:9B:00.0")
    s.ingest("nvml", b, t=0)
    assert gpu_subjects(s) == [("gpu:4", "0000:9b:00.0")]


def test_disabled_rules_do_not_run(rules: RuleSet) -> None:
    from dataclasses import replace

    off = RuleSet(tuple(replace(r, enabled=False) for r in rules.rules))
    assert evaluate(off, store_with(temperature=99), 1) == []
