"""Shared test helpers, and the guard that keeps every test off the host's own moptd."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
