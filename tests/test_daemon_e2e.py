"""A real `moptd run` on this (GPU-less) machine: /metrics, the API, clean shutdown."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from tests.conftest import require_tool
from tests.daemon_proc import DaemonProcess


def test_serves_metrics_within_5s_with_host_metrics_and_nvml_unavailable(tmp_path):
    d = DaemonProcess(tmp_path)
    t0 = time.monotonic()
    with d:
        text = d.wait_metrics(timeout=5.0)
        assert time.monotonic() - t0 < 5.0
        # host metrics arrive with the first collection; give it a moment if the
        # scrape raced the first pass
        for _ in range(50):
            if "moptd_node_memory_total_bytes" in text:
                break
            time.sleep(0.1)
            text = d.scrape()
        assert "moptd_node_memory_total_bytes" in text
        assert 'moptd_collector_success{collector="host"} 1.0' in text
        assert 'moptd_collector_unavailable{collector="nvml"} 1.0' in text
        samples = [line for line in text.splitlines() if not line.startswith("#")]
        assert not any(line.startswith("moptd_gpu_") for line in samples), "no GPU here"
    assert d.proc is not None
    assert d.proc.returncode == 0, d.log()


def test_promtool_accepts_a_live_scrape(tmp_path):
    promtool = require_tool("promtool")
    with DaemonProcess(tmp_path) as d:
        d.wait_metrics()
        time.sleep(1.2)  # a second host pass gives the CPU ratio too
        text = d.scrape()
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_status_talks_to_the_running_daemon(tmp_path):
    with DaemonProcess(tmp_path) as d:
        d.wait_metrics()
        out = subprocess.run(
            [sys.executable, "-m", "moptd", "status", "--json", "--config", str(d.config_path)],
            capture_output=True, text=True, timeout=30,
        )
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["note"] == ""
    assert {c["name"] for c in view["collectors"]} >= {"host", "nvml"}
    assert view["node"]["memory_total"] > 0


def test_status_without_a_daemon_collects_once_and_says_so(tmp_path):
    d = DaemonProcess(tmp_path)  # configured but never started
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "status", "--config", str(d.config_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "daemon not reachable" in out.stdout
    assert "host" in out.stdout


def test_sigint_stops_cleanly_and_removes_nothing_it_should_keep(tmp_path):
    d = DaemonProcess(tmp_path).start()
    d.wait_metrics()
    assert d.stop(signal.SIGINT) == 0
    assert d.state_dir.is_dir()
    assert "Traceback" not in d.log()


def test_api_socket_mode_is_explicit_whatever_the_umask(tmp_path):
    import os
    import stat

    old = os.umask(0o000)
    try:
        with DaemonProcess(tmp_path) as d:
            d.wait_metrics()
            mode = stat.S_IMODE(os.stat(d.socket).st_mode)
            state_mode = stat.S_IMODE(os.stat(d.state_dir).st_mode)
    finally:
        os.umask(old)
    assert mode == 0o660
    assert state_mode == 0o750


def test_port_in_use_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        d = DaemonProcess(tmp_path, {"exporter": {"listen": f"127.0.0.1:{port}"}}).start()
        assert d.proc is not None
        rc = d.proc.wait(timeout=30)
        d.stop()
    assert rc == 1
    assert "cannot listen" in d.log()
    assert "Traceback" not in d.log()
