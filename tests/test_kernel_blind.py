"""A kernel log moptd may not read is said, never taken for an all-clear (issue 31, item 3).

Under kernel.dmesg_restrict=1 a user without CAP_SYSLOG gets EPERM opening /dev/kmsg. The
ring here holds an Xid 79 (a public line, tests/fixtures/kmsg-restart/SOURCE.md, moved to
a PCI address no GPU has) when `explain --offline`, `status --offline` and a daemon run as
user nobody: each must say "kernel log not readable: Xids unknown" first and exit 4, and
the daemon's /v1/health must be degraded. Root, on the same ring, finds the Xid (the
control: the line is there to be missed).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.api_helpers import get, wait_for, wait_socket
from tests.conftest import REPO
from tests.daemon_proc import DaemonProcess

KMSG = Path("/dev/kmsg")
XID79 = (REPO / "tests/fixtures/kmsg-restart/xid79.txt").read_text().strip()
BLIND = "kernel log not readable: Xids unknown (cannot read /dev/kmsg: Operation not permitted)"
AS_NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--")


def _restricted() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to write /dev/kmsg) and setpriv (to run as nobody)")
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("kernel.dmesg_restrict is 0: any user may read the kernel log here")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory user nobody may write (pytest's tmp_path is root's alone)."""
    tmp = Path(tempfile.mkdtemp(prefix="moptd-blind-"))
    os.chmod(tmp, 0o777)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _write_xid79() -> str:
    """The public Xid 79 line at a PCI domain of its own; the subject it becomes."""
    domain = f"{random.randint(0x1000, 0xFFFE):04x}"
    with KMSG.open("w") as fh:
        fh.write(XID79.replace("PCI:0000:05:00", f"PCI:{domain}:05:00") + "\n")
    return f"gpu:{domain}:05:00.0"


def _config(tmp: Path) -> Path:
    path = tmp / "moptd.yaml"
    config = {"state_dir": str(tmp / "state"), "api": {"socket": str(tmp / "api.sock")}}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)
    return path


def _moptd(tmp: Path, *args: str, nobody: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [*(AS_NOBODY if nobody else ()), sys.executable, "-m", "moptd", *args]
    return subprocess.run(
        [*cmd, "--config", str(_config(tmp))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
        env={**os.environ, "HOME": str(tmp), "COLUMNS": "200"},
    )


def test_explain_offline_as_nobody_says_the_kernel_log_is_unread(shared_dir: Path) -> None:
    _restricted()
    subject = _write_xid79()
    out = _moptd(shared_dir, "explain", "--offline")
    assert out.returncode == 4, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == BLIND
    assert "No active findings" not in out.stdout
    assert "not an all-clear" in out.stdout
    # the control: root reads the same ring and finds the GPU lost
    seen = _moptd(shared_dir, "explain", "--offline", "--json", subject, nobody=False)
    assert '"GPU_LOST"' in seen.stdout, seen.stdout + seen.stderr


def test_status_offline_as_nobody_says_it_first_and_exits_4(shared_dir: Path) -> None:
    _restricted()
    out = _moptd(shared_dir, "status", "--offline")
    assert out.returncode == 4, out.stdout + out.stderr
    assert out.stdout.splitlines()[0] == BLIND


def test_daemon_as_nobody_is_degraded_and_says_why(shared_dir: Path) -> None:
    _restricted()
    _write_xid79()
    d = DaemonProcess(shared_dir, wrap=AS_NOBODY, kernel_from_now=False)
    d.start()
    try:
        wait_socket(d.socket, d.proc, timeout=30)

        def kernel_started() -> dict[str, Any] | None:
            # The API listens before the collectors start (the first scrape names them all,
            # "pending"): what the kernel log could be is known once its collector has tried.
            status, health = get(d.socket, "/v1/health")
            assert status == 200
            started = health["collectors"]["kernel"]["state"] != "pending"
            return health if started else None

        health = wait_for(kernel_started, timeout=30)
        assert health["status"] == "degraded"
        assert health["blind"] == [BLIND]
        assert health["collectors"]["kernel"]["state"] == "unavailable"
        _, view = get(d.socket, "/v1/explain")
        assert view["blind"] == [BLIND]
        # the CLI, as root, against that daemon: the header, then no all-clear
        out = _moptd(shared_dir, "explain", nobody=False)
        assert out.returncode == 4, out.stdout + out.stderr
        assert out.stdout.splitlines()[0] == BLIND
        assert "No active findings" not in out.stdout
        out = _moptd(shared_dir, "status", nobody=False)
        assert out.returncode == 4, out.stdout + out.stderr
        assert out.stdout.splitlines()[0] == BLIND
    finally:
        d.stop()
