"""A rule that raises on every tick, beside the shipped rules, under a running daemon
(issue 18): the other rules keep diagnosing (a real Xid 79 written to /dev/kmsg still gives
GPU_LOST), and moptd says that it is not whole: /metrics has moptd_rule_failing for the rule,
/v1/health says "degraded" and names it, a RULE_EVALUATION_FAILED finding on node carries the
rule, the subject and the error, and the log has the failure once, not once a tick.

The rule is the issue's with its constant made finite: `((node.load1 + 1) * 1e300 * 1e300)
& 1 == 1` passes `moptd rules check` and the load (the issue's own `1e999` is now refused at
load), and then raises OverflowError every time it runs: what only the values show, only
the run time can hold. Needs root (a writable /dev/kmsg)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moptd.cli import main
from moptd.diagnose.loader import default_rules_dir
from tests.api_helpers import kmsg_writable, write_xid79
from tests.faults.conftest import api_get, assert_serving, metric_value, start_daemon, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(not kmsg_writable(), reason="needs a writable /dev/kmsg (root)"),
]

BAD_RULE = """\
schema: moptd.rules/v1
rules:
  - id: local-load-parity
    title: a local rule that overflows on every tick
    layer: host
    scope: node
    status: experimental
    decide:
      - id: odd
        if: ((node.load1 + 1) * 1e300 * 1e300) & 1 == 1
        verdict:
          code: HOST_MEMORY_LOW
          summary: "never reached"
          actions: []
          runbook: https://example.invalid
"""
ERROR = "OverflowError: cannot convert float infinity to integer"


def test_a_raising_rule_leaves_the_diagnosis_on_and_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules_d = tmp_path / "rules.d"
    rules_d.mkdir()
    (rules_d / "local.rules.yaml").write_text(BAD_RULE)
    # nothing at load can tell: `rules check` passes it, and the run time must hold
    assert main(["rules", "check", str(default_rules_dir()), str(rules_d)]) == 0
    capsys.readouterr()

    config = {
        "rules": {"interval": 0.2, "paths": [str(default_rules_dir()), str(rules_d)]},
        "collectors": {"kernel": {"interval": 0.5}},
    }
    d = start_daemon(tmp_path / "d", config)
    try:
        wait_for(lambda: api_get(d, "/v1/health")["collectors"]["kernel"]["runs"] > 0)
        _, bus = write_xid79()
        subject = f"gpu:{bus}"
        text = wait_for(
            lambda: (
                (t := assert_serving(d))
                and metric_value(t, "moptd_finding_active", code="GPU_LOST", subject=subject) == 1.0
                and t
            ),
            timeout=15,
            step=0.1,
        )
        assert metric_value(text, "moptd_rule_failing", rule="local-load-parity") == 1.0
        errors = metric_value(text, "moptd_rule_evaluation_errors_total", rule="local-load-parity")
        assert errors is not None
        assert errors >= 1.0
        assert (
            metric_value(
                text, "moptd_finding_active", code="RULE_EVALUATION_FAILED", subject="node"
            )
            == 1.0
        )

        health = api_get(d, "/v1/health")
        assert health["status"] == "degraded"
        assert health["findings_store"]["state"] == "ok"  # the rule alone degrades it
        assert health["diagnosis"]["rules_failing"] == ["local-load-parity"]

        body = api_get(d, "/v1/findings?code=RULE_EVALUATION_FAILED")
        (finding,) = [f for f in body["active"] if f["rule"] == "rule-evaluation:local-load-parity"]
        assert finding["subject"] == "node"
        assert finding["evidence"] == {
            "rule": "local-load-parity",
            "subject": "node",
            "error": ERROR,
        }
        lost = api_get(d, "/v1/findings?code=GPU_LOST")
        assert subject in {f["subject"] for f in lost["active"]}
        ticks = api_get(d, "/v1/health")["diagnosis"]["ticks"]
        wait_for(lambda: api_get(d, "/v1/health")["diagnosis"]["ticks"] >= ticks + 5)
    finally:
        rc = d.stop()
    assert rc == 0, d.log()[-3000:]
    log = d.log()
    assert "Traceback" not in log, log[-3000:]
    failed = [line for line in log.splitlines() if "rule local-load-parity (" in line]
    assert len(failed) == 1, failed  # once, though it failed on every tick
    assert f"failed on node: {ERROR}" in failed[0]
