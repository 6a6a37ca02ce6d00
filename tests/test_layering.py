"""Diagnosis (replay included) and the findings service load no GPU binding, HTTP stack,
terminal UI or socket: checked in a fresh interpreter, where nothing else loaded them
first (import-linter checks the static imports; this checks what really gets loaded).

One stdlib exception, found and pinned here rather than allowed silently: the findings
service is an asyncio service, and ``import asyncio`` itself loads ``socket``
(asyncio.base_events imports it). The test requires that socket is then imported by
asyncio and by nothing of moptd.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("pynvml", "aiohttp", "rich", "socket")

_PROBE = r"""
import json, sys, traceback

importers = {}

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in %(forbidden)r and name not in importers:
            frames = [f for f in traceback.extract_stack() if "importlib" not in f.filename]
            importers[name] = frames[-2].filename if len(frames) > 1 else "?"
        return None

sys.meta_path.insert(0, Watch())
import %(module)s
print(json.dumps({n: importers.get(n, "") for n in %(forbidden)r if n in sys.modules}))
"""


def _loaded(module: str) -> dict[str, str]:
    """{forbidden module: the file that imported it} after importing ``module`` alone."""
    code = _PROBE % {"module": module, "forbidden": FORBIDDEN}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["moptd.diagnose.replay", "moptd.diagnose.testing"])
def test_diagnosis_loads_nothing_forbidden(module: str) -> None:
    assert _loaded(module) == {}


def test_findings_service_loads_socket_only_through_asyncio() -> None:
    loaded = _loaded("moptd.findings.service")
    assert set(loaded) <= {"socket"}, loaded
    if "socket" in loaded:
        assert f"{os.sep}asyncio{os.sep}" in loaded["socket"], loaded


def test_the_probe_sees_a_forbidden_import() -> None:
    """The probe is not blind: the daemon's API loads aiohttp."""
    assert "aiohttp" in _loaded("moptd.daemon.api")
