"""The whole path on a real daemon: a kernel record in /dev/kmsg becomes a firing
finding in /metrics, and SIGHUP reloads rules without losing the last good set."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.daemon_proc import DaemonProcess

KMSG = Path("/dev/kmsg")


def write_kmsg(line: str) -> None:
    if not os.access(KMSG, os.W_OK):
        reason = f"{KMSG} is not writable here (uid {os.getuid()})"
        print(reason)
        pytest.skip(reason)
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def wait_for(d: DaemonProcess, needle: str, within: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        if needle in d.scrape():
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def active_findings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("moptd_finding_active{")]


@pytest.mark.slow
def test_xid_79_in_the_kernel_log_fires_gpu_lost_within_two_seconds(tmp_path):
    tag = f"moptd-test-{uuid.uuid4().hex[:8]}"
    with DaemonProcess(tmp_path) as d:
        d.wait_metrics()
        wait_for(d, 'moptd_collector_success{collector="kernel"} 1.0', 10)
        # A PCI domain of this run's own: a first start reads this boot's whole kernel log,
        # where other runs' Xid 79 on 0000:fe:00 already are.
        bus = f"{random.randint(0x1000, 0xFFFE):04x}:fe:00"
        write_kmsg(f"NVRM: Xid (PCI:{bus}): 79, pid=0, GPU has fallen off the bus. {tag}\n")
        took = wait_for(d, f'subject="gpu:{bus}.0"', 5)
        text = d.scrape()
    assert took is not None, d.log()
    assert took < 2.0
    lost = [f for f in active_findings(text) if f'subject="gpu:{bus}.0"' in f]
    assert lost == [
        'moptd_finding_active{code="GPU_LOST",rule="gpu-lost",severity="critical",'
        f'subject="gpu:{bus}.0"}} 1.0'
    ]


@pytest.mark.slow
def test_sighup_refuses_a_broken_rule_set_and_keeps_the_last_good_one(tmp_path):
    local = tmp_path / "rules.d"
    local.mkdir()
    from moptd.diagnose.loader import default_rules_dir

    extra = {"rules": {"paths": [str(default_rules_dir()), str(local)]}}
    with DaemonProcess(tmp_path, extra) as d:
        d.wait_metrics()
        assert d.proc is not None
        (local / "broken.rules.yaml").write_text("schema: moptd.rules/v1\nrules:\n  - id: x\n")
        for _ in range(5):  # a storm of reloads
            d.proc.send_signal(signal.SIGHUP)
            time.sleep(0.1)
        time.sleep(0.5)
        assert d.proc.poll() is None, "the daemon survives"
        assert "rules not reloaded" in d.log()
        assert f"{local / 'broken.rules.yaml'}:3" in d.log()
        write_kmsg(f"NVRM: Xid (PCI:0000:fe:00): 79, pid=0, GPU has fallen off the bus. "
                   f"moptd-test-{uuid.uuid4().hex[:8]}\n")
        assert wait_for(d, 'code="GPU_LOST"', 5) is not None, "the last good rules still run"
