"""One rule that raises never switches the diagnosis off (issue 18): the rule is "error" on
that subject, every other rule and subject runs, the failure is a RULE_EVALUATION_FAILED
finding of moptd's own and a metric, and the same holds in `moptd rules test`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from moptd.cli import main
from moptd.clock import VirtualClock
from moptd.diagnose.engine import Result, Reuse, evaluate
from moptd.diagnose.lifecycle import FAILED, FAILED_PREFIX, Lifecycle
from moptd.diagnose.lint import lint
from moptd.diagnose.loader import load_rules
from moptd.diagnose.model import RuleSet
from moptd.diagnose.service import RuleService
from moptd.diagnose.testing import run_tests
from moptd.observations import Batch, labels_of
from moptd.store import SignalStore

# A rule that passes `rules check` and the load, then raises OverflowError on every tick.
# (Issue 18's own rule, `(node.load1 + 1e999) & 1 == 1`, is now refused at load: 1e999 is
# no float, tests/test_rule_limits.py. A product that overflows cannot be seen at load.)
ISSUE_RULE = "(node.load1 + 1e999) & 1 == 1"
OVERFLOW = "((node.load1 + 1) * 1e300 * 1e300) & 1 == 1"
VERDICT = "verdict: {code: %s, summary: s, actions: [], runbook: https://example.invalid}"

RULES = f"""\
schema: moptd.rules/v1
rules:
  - id: overflows
    title: overflows
    layer: host
    scope: node
    status: experimental
    decide:
      - id: bad
        if: {OVERFLOW}
        {VERDICT % "SWAP_ACTIVE"}
  - id: loaded
    title: loaded
    layer: host
    scope: node
    status: experimental
    decide:
      - id: high
        if: node.load1 > 4
        {VERDICT % "HOST_MEMORY_LOW"}
  - id: hot-overflows
    title: raises on a hot GPU only
    layer: hardware
    scope: gpu
    status: experimental
    decide:
      - id: hot
        if: gpu.temperature > 90 and (gpu.temperature * 1e300 * 1e300) & 1 == 1
        {VERDICT % "THERMAL_THROTTLE"}
      - id: warm
        if: gpu.temperature > 60
        {VERDICT % "THERMAL_THROTTLE"}
"""


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    f = tmp_path / "t.rules.yaml"
    f.write_text(RULES)
    loaded = load_rules([f])
    assert loaded.errors == []  # the load does not catch it: the run time must
    return loaded.ruleset


def feed(store: SignalStore, t: float, load1: float, temps: dict[str, float]) -> None:
    b = Batch()
    b.add("node.load1", "node", load1)
    for subject, temp in temps.items():
        b.add("gpu.temperature", subject, temp)
    store.ingest("test", b, t=t)


def by_key(results: list[Result]) -> dict[tuple[str, str], Result]:
    return {(r.rule.id, r.subject): r for r in results}


def test_a_raising_rule_is_error_and_the_others_run(rules: RuleSet) -> None:
    store = SignalStore(clock=VirtualClock(0))
    feed(store, 0, 8.0, {"gpu:0": 95.0, "gpu:1": 70.0})
    got = by_key(evaluate(rules, store, 1))
    bad = got[("overflows", "node")]
    assert bad.status == "error"
    assert bad.error == "OverflowError: cannot convert float infinity to integer"
    assert bad.verdict is None
    assert bad.path == []
    assert got[("loaded", "node")].status == "match"
    # the same rule raises on one subject and matches on another
    assert got[("hot-overflows", "gpu:0")].status == "error"
    hot1 = got[("hot-overflows", "gpu:1")]
    assert hot1.status == "match"
    assert hot1.path == ["hot-overflows/warm"]


def test_an_error_is_the_same_with_and_without_reuse(rules: RuleSet) -> None:
    plain_store = SignalStore(clock=VirtualClock(0))
    reused_store = SignalStore(clock=VirtualClock(0))
    reuse = Reuse()
    steps = [(95.0, 8.0), (95.0, 8.0), (95.0, 8.0), (50.0, 1.0), (50.0, 1.0), (95.0, 1.0)]
    for i, (temp, load) in enumerate(steps):
        for s in (plain_store, reused_store):
            feed(s, float(i), load, {"gpu:0": temp})
        plain = evaluate(rules, plain_store, float(i))
        reused = evaluate(rules, reused_store, float(i), reuse=reuse)
        assert [(r.rule.id, r.subject, r.status, r.error) for r in plain] == [
            (r.rule.id, r.subject, r.status, r.error) for r in reused
        ]


def test_an_error_is_never_reused_and_a_recovery_shows_at_once(rules: RuleSet) -> None:
    store = SignalStore(clock=VirtualClock(0))
    reuse = Reuse()

    def hot_status(t: float, temp: float) -> str:
        feed(store, t, 1.0, {"gpu:0": temp})
        return by_key(evaluate(rules, store, t, reuse=reuse))[("hot-overflows", "gpu:0")].status

    assert hot_status(1, 95.0) == "error"
    kept = {(k.result.rule.id, k.result.subject) for k in reuse.kept.values()}
    assert ("hot-overflows", "gpu:0") not in kept
    assert ("overflows", "node") not in kept
    assert ("loaded", "node") in kept  # an ok result is kept as before
    assert hot_status(2, 95.0) == "error"
    assert hot_status(3, 50.0) == "ok"  # recovered: no stale error handed on
    assert hot_status(4, 50.0) == "ok"
    assert hot_status(5, 95.0) == "error"


def test_an_open_finding_whose_rule_now_raises_is_held_not_resolved(rules: RuleSet) -> None:
    store = SignalStore(clock=VirtualClock(0))
    life = Lifecycle()
    feed(store, 0, 1.0, {"gpu:0": 70.0})
    life.update(evaluate(rules, store, 0), 0)
    assert ("hot-overflows", "gpu:0") in life.findings
    feed(store, 10, 1.0, {"gpu:0": 95.0})
    # the traced re-walk of an open finding raises too: still an error result, no exception
    results = evaluate(rules, store, 10, traced=lambda r, s: (r, s) in life.findings)
    assert by_key(results)[("hot-overflows", "gpu:0")].status == "error"
    life.update(results, 10)
    f = life.findings[("hot-overflows", "gpu:0")]
    assert f.state == "firing"  # like unknown: an error is no recovery


def test_the_failure_is_a_finding_that_resolves_on_recovery(rules: RuleSet) -> None:
    store = SignalStore(clock=VirtualClock(0))
    life = Lifecycle()
    feed(store, 0, 1.0, {"gpu:0": 95.0, "gpu:1": 95.0})
    transitions = life.update(evaluate(rules, store, 0), 0)
    failed = {f.rule: f for f in life.active() if f.code == FAILED}
    assert set(failed) == {FAILED_PREFIX + "overflows", FAILED_PREFIX + "hot-overflows"}
    f = failed[FAILED_PREFIX + "hot-overflows"]
    assert (f.subject, f.severity, f.state) == ("node", "warning", "firing")
    assert f.evidence == {
        "rule": "hot-overflows",
        "subject": "gpu:0, gpu:1",
        "error": "OverflowError: cannot convert float infinity to integer",
    }
    assert f.runbook == "docs/runbooks/RULE_EVALUATION_FAILED.md"
    assert "rule hot-overflows raised on gpu:0, gpu:1" in f.summary
    assert {(t.rule, t.new) for t in transitions} >= {(FAILED_PREFIX + "hot-overflows", "firing")}
    feed(store, 10, 1.0, {"gpu:0": 50.0, "gpu:1": 50.0})
    transitions = life.update(evaluate(rules, store, 10), 10)
    assert [(t.rule, t.old, t.new) for t in transitions] == [
        (FAILED_PREFIX + "hot-overflows", "firing", "resolved")
    ]
    assert [f.rule for f in life.failing()] == [FAILED_PREFIX + "overflows"]


def test_the_service_logs_once_and_exports_the_failing_rule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "t.rules.yaml"
    f.write_text(RULES)
    clock = VirtualClock(0)
    store = SignalStore(clock=clock)
    svc = RuleService(store, clock, [f])
    assert svc.errors == []
    with caplog.at_level(logging.ERROR, logger="moptd.diagnose.service"):
        for _ in range(3):
            feed(store, clock.now(), 8.0, {"gpu:0": 50.0})
            svc.tick()
            clock.advance(10)
    failures = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 1, failures  # the first failure, not every tick
    assert failures[0].startswith(f"rule overflows ({f}:3) failed on node: OverflowError")
    assert svc.failing() == ["overflows"]
    samples = {(s.signal, s.labels): s.value for s in svc.findings_batch().samples}
    assert samples[("rules.failing", labels_of(rule="overflows"))] == 1.0
    assert samples[("rules.evaluation_errors", labels_of(rule="overflows"))] == 3.0
    active = labels_of(
        rule=FAILED_PREFIX + "overflows", code=FAILED, severity="warning", subject="node"
    )
    assert samples[("finding.active", active)] == 1.0
    # the good rule still diagnoses
    assert ("loaded", "node") in {(f.rule, f.subject) for f in svc.active()}

    f.write_text(RULES.replace(OVERFLOW, "node.load1 > 100"))
    svc.put_in_force(load_rules([f]))
    feed(store, clock.now(), 8.0, {"gpu:0": 50.0})
    svc.tick()
    assert svc.failing() == []
    signals = {s.signal for s in svc.findings_batch().samples}
    assert "rules.failing" not in signals
    assert "rules.evaluation_errors" in signals  # a counter stays
    assert not svc.lifecycle.failing()


TEST_FILE = """\
rule_files: [t.rules.yaml]
tests:
  - name: loaded and raising
    series:
      'node.load1': '8x4'
    eval_at: 1m
    expect:
      - {rule: loaded, code: HOST_MEMORY_LOW, subject: node}
  - name: idle
    series:
      'node.load1': '1x4'
    eval_at: 1m
    expect: []
"""


def test_rules_test_reports_the_raising_rule_and_tests_the_others(tmp_path: Path) -> None:
    (tmp_path / "t.rules.yaml").write_text(RULES)
    (tmp_path / "t.test.yaml").write_text(TEST_FILE)
    report = run_tests([tmp_path], require_coverage=False)
    assert report.tests == 2
    assert report.failures == []  # the other rules' tests ran and passed
    assert [str(e) for e in report.errors] == [
        f"{tmp_path / 't.rules.yaml'}:3: rule overflows raised on node "
        f"(in {tmp_path / 't.test.yaml'}): "
        "OverflowError: cannot convert float infinity to integer"
    ]
    assert not report.ok


def test_rules_test_command_fails_on_the_raising_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.rules.yaml").write_text(RULES)
    (tmp_path / "t.test.yaml").write_text(TEST_FILE)
    assert main(["rules", "test", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "rule overflows raised on node" in captured.err + captured.out
    assert "2 tests in 1 files: 0 failed, 1 errors" in captured.out + captured.err


def one_rule(tmp_path: Path, condition: str) -> Path:
    f = tmp_path / "one.rules.yaml"
    f.write_text(
        "schema: moptd.rules/v1\nrules:\n"
        "  - id: one\n    title: one\n    layer: host\n    scope: node\n"
        "    status: experimental\n    decide:\n"
        f"      - id: b\n        if: '{condition}'\n        {VERDICT % 'SWAP_ACTIVE'}\n"
    )
    return f


def test_the_issue_rule_is_refused_and_an_overflowing_product_is_not(tmp_path: Path) -> None:
    """What a load can see it refuses; what only the values show, the run time isolates."""
    errors, _ = lint([one_rule(tmp_path, ISSUE_RULE)])
    assert errors
    assert "1e999" in errors[0].message
    errors, _ = lint([one_rule(tmp_path, OVERFLOW)])
    assert errors == []
