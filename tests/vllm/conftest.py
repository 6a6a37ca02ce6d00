"""The real-vLLM tests run on the side lane of scripts/test.sh (tests/conftest.py,
SIDE_LANE), beside the rest of the suite, which keeps a core busy. There a vLLM server 10
below the main lane is starved: its /metrics answers late or not at all, scrapes miss the
load and the one-minute stall window never fills (two CI runs of 2026-12-06 failed so). So
the servers run at the main lane's priority, and this lane's own process, whose event loop
must stay ahead of its server's busy loops, 5 above it where that is allowed (root, as in CI);
elsewhere the servers go 5 below."""

from __future__ import annotations

import os

import pytest

from tests.vllm import harness

LANE_RAISE = 5


@pytest.fixture(autouse=True, scope="session")
def _share_the_cpu_with_the_main_lane() -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # run alone (-n 0), it has the machine
        return
    base = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, base - LANE_RAISE)
        harness.SERVER_PRIORITY = base
    except PermissionError:
        harness.SERVER_PRIORITY = min(19, base + LANE_RAISE)
