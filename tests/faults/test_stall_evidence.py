"""A remedy's own restart is no engine death, and a stall needs evidence over its window
(issue 30, item 2), against a real `moptd run` managing the stand-in of
tests/faults/test_remediation_restart.py (a captured vLLM /metrics page, and on SIGTERM
/health 503 while /metrics still answers, as vLLM's API server does while its engine core
goes down first).

- The remedy restarts the engine: the 503s moptd's probes read while it stops are its own
  doing, and ENGINE_DEAD (health-503) stays quiet (on main it fired at every restart).
- moptd starts with an engine whose page is frozen under load (8 running, 12 waiting,
  counters standing still): one sample is no minute without a step, so SCHEDULER_STALL does
  not fire at once (on main it fired on the first sample). That it fires once the window is
  covered is the scaled rule of the first test, and rules/serving/serving.test.yaml (a
  minute from the first sample, and a forward clock jump) with the shipped windows.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.daemon_proc import DaemonProcess
from tests.faults.conftest import api_get, metric_value, scrape
from tests.faults.test_remediation_restart import (
    NAME,
    SUBJECT,
    Engine,
    daemon_config,
    daemons,  # noqa: F401 - the fixture
    engine_pid,
    launch,
    outcomes,
    stall_policy,
    wait_for,
)

pytestmark = pytest.mark.slow


def findings(d: DaemonProcess, code: str) -> list[dict[str, object]]:
    """Every finding of the code on the engine, open or closed, pending ones too."""
    body = api_get(d, f"/v1/findings?code={code}")
    got = [*body["active"], *body.get("pending", []), *body["history"]]
    return [f for f in got if f["subject"] == SUBJECT]


def test_a_remedy_restart_is_not_read_as_an_engine_death(
    tmp_path: Path,
    daemons: list[DaemonProcess],  # noqa: F811
) -> None:
    engine = Engine(tmp_path / "engine")
    d = launch(tmp_path, daemon_config(tmp_path, engine, stall_policy()), daemons)
    before = wait_for(d, "the engine runs", lambda: engine_pid(d))
    wait_for(d, "the remedy", lambda: outcomes(d) == ["verifying"])
    wait_for(d, "the restart", lambda: engine_pid(d) not in (None, before))
    # moptd's probes read the stop: /health 503 while /metrics answered
    assert engine.health_503s() > 0
    time.sleep(3)  # ticks over what the probes read in the restart window
    assert findings(d, "ENGINE_DEAD") == []
    assert "ENGINE_DEAD" not in d.log()


def test_a_frozen_page_at_start_is_not_yet_a_stall(
    tmp_path: Path,
    daemons: list[DaemonProcess],  # noqa: F811
) -> None:
    engine = Engine(tmp_path / "engine")  # serves the frozen page from its start
    d = launch(tmp_path, daemon_config(tmp_path, engine, None, scaled=False), daemons)

    def running() -> float | None:
        return metric_value(scrape(d), "moptd_serving_requests_running", serving=NAME)

    wait_for(d, "the page read", lambda: running() == 8.0)
    steps = metric_value(scrape(d), "moptd_serving_engine_steps_total", serving=NAME)
    assert steps is not None
    time.sleep(8)  # 16 scrapes, 16 ticks: no step, but not a minute of it
    assert findings(d, "SCHEDULER_STALL") == []
    assert "SCHEDULER_STALL" not in d.log()
