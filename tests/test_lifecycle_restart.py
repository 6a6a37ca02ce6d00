"""Verdicts that stay right across a restart and over time (issue 31, item 2), on the real
/dev/kmsg through a real daemon and its API.

The lines are public: the Xid 79 of tests/fixtures/kmsg-restart/xid79.txt and the Xid 13 of
tests/fixtures/kernel-drill/xid13.log (vllm-project/vllm#5901), both moved to a PCI domain
of their own (no GPU has it, and runs sharing the host's ring do not see each other's).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from moptd.findings.db import FILE_NAME, FindingsDB
from moptd.kernel.kmsg import read_boot_id
from tests.api_helpers import get, kmsg_writable, wait_for, wait_socket
from tests.conftest import REPO
from tests.daemon_proc import DaemonProcess, newest_kmsg_seq

pytestmark = pytest.mark.skipif(not kmsg_writable(), reason="needs a writable /dev/kmsg (root)")

XID79 = (REPO / "tests/fixtures/kmsg-restart/xid79.txt").read_text().strip()
XID13 = (REPO / "tests/fixtures/kernel-drill/xid13.log").read_text().strip()


def _write(line: str) -> None:
    with open("/dev/kmsg", "w") as fh:
        fh.write(line + "\n")


def _active(d: DaemonProcess, subject: str) -> list[dict]:
    status, body = get(d.socket, "/v1/findings")
    assert status == 200
    return [f for f in body["active"] if f["subject"] == subject]


def test_lost_gpu_takes_no_application_fault_after_a_restart(tmp_path: Path) -> None:
    domain = f"{random.randint(0x1000, 0xFFFE):04x}"
    subject = f"gpu:{domain}:05:00.0"
    d = DaemonProcess(tmp_path).start()
    try:
        wait_socket(d.socket, d.proc, timeout=30)
        _write(XID79.replace("PCI:0000:05:00", f"PCI:{domain}:05:00"))
        wait_for(lambda: [f for f in _active(d, subject) if f["code"] == "GPU_LOST"], 20)
        d.stop()
        d.start()
        wait_socket(d.socket, d.proc, timeout=30)
        _write(
            XID13.split("NVRM:", 1)[0]
            + "NVRM:"
            + XID13.split("NVRM:", 1)[1].replace("PCI:0000:43:00", f"PCI:{domain}:05:00")
        )
        # the Xid 13 arrives and is evaluated (within milliseconds); give it a second
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            codes = {f["code"] for f in _active(d, subject)}
            assert "XID_APPLICATION_FAULT" not in codes, codes
            time.sleep(0.2)
        assert "GPU_LOST" in {f["code"] for f in _active(d, subject)}
    finally:
        d.stop()


def test_an_xid_read_at_start_fires_since_its_own_time(tmp_path: Path) -> None:
    domain = f"{random.randint(0x1000, 0xFFFE):04x}"
    subject = f"gpu:{domain}:05:00.0"
    state = tmp_path / "state"
    state.mkdir()
    seq = newest_kmsg_seq()
    assert seq is not None
    with FindingsDB(state / FILE_NAME) as db:
        db.save_position("kmsg", read_boot_id(), seq).result(30)
    _write(XID79.replace("PCI:0000:05:00", f"PCI:{domain}:05:00"))
    written = time.time()
    time.sleep(3)  # the daemon starts well after the line
    d = DaemonProcess(tmp_path, kernel_from_now=False).start()
    try:
        wait_socket(d.socket, d.proc, timeout=30)
        (lost,) = wait_for(lambda: _active(d, subject), 20)
        # the kernel's clock drifts from the wall clock a little; 3 s apart is plain
        assert abs(float(lost["first_seen"]) - written) < 2.0, (lost["first_seen"], written)
    finally:
        d.stop()


def test_explain_of_a_gpu_the_host_lacks_says_so(tmp_path: Path) -> None:
    import subprocess
    import sys

    d = DaemonProcess(tmp_path).start()
    try:
        wait_socket(d.socket, d.proc, timeout=30)
        out = subprocess.run(
            [sys.executable, "-m", "moptd", "explain", "gpu:7", "--config", str(d.config_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        d.stop()
    assert out.returncode == 2, out.stdout + out.stderr
    assert "No active findings" not in out.stdout
    assert out.stderr.startswith("moptd explain: No GPU gpu:7 on this host (GPUs: ")
