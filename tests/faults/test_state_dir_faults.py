"""A state directory moptd cannot write (issue 18, item 5): the daemon serves and says so.

ext4 remounts itself read-only on errors (errors=remount-ro), exactly when a monitor is
needed; a packaging mistake can leave a file where the directory should be. Before, both
ended start-up with a traceback. Now the daemon serves /metrics and the API, keeps its
findings in memory, and /v1/health and the log say why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.faults.conftest import api_get, assert_serving, start_daemon

pytestmark = pytest.mark.slow


@contextmanager
def read_only_tmpfs(path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    path.mkdir(parents=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m,mode=0750", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def serves_degraded(tmp: Path, state_dir: Path) -> str:
    d = start_daemon(
        tmp, {"state_dir": str(state_dir), "collectors": {"kernel": {"enabled": False}}}
    )
    try:
        assert_serving(d)
        health = api_get(d, "/v1/health")
        assert health["status"] == "degraded", health
        assert api_get(d, "/v1/findings") is not None
    finally:
        assert d.stop() == 0
    log = d.log()
    assert "state directory" in log
    assert "Traceback" not in log
    return log


def test_a_read_only_state_directory_serves_and_says_so(tmp_path):
    with read_only_tmpfs(tmp_path / "ro") as state:
        log = serves_degraded(tmp_path / "d", state)
    assert "Read-only file system" in log


def test_a_file_where_the_state_directory_should_be_is_left_alone(tmp_path):
    state = tmp_path / "state-is-a-file"
    state.write_text("not a directory\n")
    log = serves_degraded(tmp_path / "d", state)
    assert state.read_text() == "not a directory\n"
    assert "File exists" in log or "Not a directory" in log
