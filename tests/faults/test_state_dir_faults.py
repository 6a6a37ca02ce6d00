"""A state directory moptd cannot write (issue 18, item 5): the daemon serves and says so.

ext4 remounts itself read-only on errors (errors=remount-ro), exactly when a monitor is
needed; a packaging mistake can leave a file where the directory should be. Before, both
ended start-up with a traceback. Now the daemon serves /metrics and the API, keeps its
findings in memory, and /v1/health and the log say why.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.daemon_proc import DaemonProcess
from tests.faults.conftest import api_get, assert_serving, start_daemon, wait_for

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


# --- paths moptd did not create (issue 18, item 8) ------------------------------------------


def test_a_regular_file_at_the_socket_path_is_not_deleted(tmp_path):
    (tmp_path / "d").mkdir()
    d = DaemonProcess(tmp_path / "d", {"collectors": {"kernel": {"enabled": False}}})
    d.socket.write_text("someone's file\n")
    d.start()
    try:
        d.wait_metrics()  # the exporter serves without the socket API
    finally:
        assert d.stop() == 0
    assert d.socket.read_text() == "someone's file\n"
    assert "exists and is not a socket; not removed" in d.log()


def test_a_shared_socket_directory_keeps_its_mode(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a /tmp-like directory: sticky, everyone writes
    sock = shared / "moptd.sock"
    (tmp_path / "d").mkdir()
    d = DaemonProcess(
        tmp_path / "d", {"api": {"socket": str(sock)}, "collectors": {"kernel": {"enabled": False}}}
    )
    d.socket = sock
    d.start()
    try:
        d.wait_metrics()
        wait_for(sock.is_socket, timeout=10)
    finally:
        assert d.stop() == 0
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_a_state_directory_others_can_write_is_not_used(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state / "findings.db").symlink_to(victim)  # planted by the other user
    os.chown(state, 65534, 65534)  # nobody's directory, which nobody may write
    state.chmod(0o777)
    log = serves_degraded(tmp_path / "d", state)
    assert victim.read_text() == "precious\n"
    assert stat.S_IMODE(state.stat().st_mode) == 0o777  # not moptd's to change
    assert "belongs to uid 65534" in log
