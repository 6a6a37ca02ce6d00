"""Shared test helpers, and the guard that keeps every test off the host's own moptd."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import settings

from moptd.config import default_api_socket, default_state_dir
from tests.hostguard import sitecustomize as hostguard

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def year_free(text: str) -> str:
    """moptd's output for a golden file, without the year it gave year-less lines (syslog,
    vLLM) where nothing in the paste said it: this year, which its note names. The dates
    become YYYY-MM-DD, so a golden reads the same in any year (and CI is not red on the
    calendar); a year the evidence holds itself stays."""
    m = re.search(r"their dates are read as (\d{4}), this year\.", text)
    if m is None:
        return text
    return re.sub(rf"\b{m.group(1)}(?=-\d\d-\d\d|, this year\.)", "YYYY", text)


def require_tool(name: str) -> str:
    """The tool's path; skip (or fail in CI, where MOPTD_REQUIRE_TOOLS=1) when absent."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("MOPTD_REQUIRE_TOOLS"):
            pytest.fail(f"{name} is required in CI but not installed")
        pytest.skip(f"{name} not installed")
    return path


# --- the host's own moptd is out of bounds (tests/hostguard/sitecustomize.py says why) --
# The defaults are read once, before any test moves HOME. The log lives beside nothing a
# test cleans up; a subprocess that outlives its test reports into the next one.
DEFAULT_PORT = 9477
_PLACES = tuple(
    sorted({str(default_api_socket().parent), str(default_state_dir()), "/run/moptd",
            "/var/lib/moptd"})
)  # fmt: skip
_GUARD_DIR = Path(__file__).parent / "hostguard"
_GUARD_LOG = Path(tempfile.mkdtemp(prefix="moptd-test-guard-")) / "reached.log"
os.environ[hostguard.ENV_LOG] = str(_GUARD_LOG)
os.environ[hostguard.ENV_PLACES] = json.dumps(_PLACES)
os.environ[hostguard.ENV_PORT] = str(DEFAULT_PORT)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(_GUARD_DIR), os.environ.get("PYTHONPATH")) if p
)
hostguard.install(_PLACES, DEFAULT_PORT, str(_GUARD_LOG))
# `moptd explain` keeps a cache of the rules under $XDG_CACHE_HOME (moptd/cli/rules_cache.py):
# the tests' own, never the user's ~/.cache
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="moptd-test-cache-")


@pytest.fixture(autouse=True)
def _keep_off_the_hosts_moptd() -> Iterator[None]:
    _GUARD_LOG.unlink(missing_ok=True)
    yield
    try:
        reached = _GUARD_LOG.read_text().splitlines()
    except FileNotFoundError:
        return
    _GUARD_LOG.unlink(missing_ok=True)
    pytest.fail(
        "this test reached the host's own moptd (its default socket, state dir or port "
        f"{DEFAULT_PORT}): name a socket, state dir and port of the test's own. "
        + "; ".join(reached[:5]),
        pytrace=False,
    )


# --- two lanes (issue 32: CI at most 30 minutes) -------------------------------------
# scripts/test.sh runs two pytest-xdist workers. The real-vLLM tests spend most of their
# minutes waiting on the server (its start, a minute of standing counters, a restart), and
# they share nothing with the rest of the suite: no kernel log, no daemon, no fixed port.
# They run on one worker; everything else runs on the other, in its usual order, exactly
# as it does alone: its daemons read this host's kernel log, which other tests write to,
# so those tests must never run beside each other. Hence a scheduler of our own for any
# -n: xdist's loadgroup would do, but its marks are lost under pytest 9 (xdist 3.8 renames
# Node._nodeid, which pytest 9 no longer reads).
SIDE_LANE = ("tests/vllm/",)
# A vLLM starting on the side lane takes CPU from the main lane for a while: an example that
# takes 100 ms alone can pass Hypothesis's default deadline of 200 ms there, and Hypothesis
# then fails the test for unreliable timings, with nothing wrong in the code. Under xdist
# the deadline is 1 s.
if os.environ.get("PYTEST_XDIST_WORKER"):
    settings.register_profile("two-lanes", deadline=timedelta(seconds=1))
    settings.load_profile("two-lanes")


# optional: without pytest-xdist (a GPU host's bare python3, `-p no:xdist`) the suite runs
# in one process instead of failing on a hook nobody declared
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class TwoLanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "side" if nodeid.startswith(SIDE_LANE) else "main"

    return TwoLanes(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test's node id is its own. The lanes' scheduler (above) files tests by node id,
    so two tests with one id would run once: schemathesis 4 names its 14 API operations
    `test_api_conforms_to_its_openapi_document[GET /v1/health]` and so on, but sets their
    ids through `Node._nodeid`, which pytest 9 no longer reads, so all 14 had the bare
    function's id and a two-lane run tested one operation of 14. Such an item takes its
    own name as its id; an id still shared stops the run."""
    counts = Counter(item.nodeid for item in items)
    for item in items:
        if counts[item.nodeid] > 1 and item.parent is not None:
            item._id = item.parent.id.child(item.name)  # pytest 9: the id behind .nodeid
    shared = [nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1]
    if shared:
        raise pytest.UsageError(f"tests sharing a node id would run once each: {shared[:5]}")
