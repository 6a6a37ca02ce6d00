"""Commands that read never start the managed serving process; only `moptd run` does.

The managed command is a real child that leaves a mark when it starts. Every read-only
command runs as a real `python -m moptd` subprocess with the same configuration file and
no daemon: the mark must never appear. Then the daemon runs and the mark must appear, `moptd
serving restart` (through the daemon) must start it again, and the daemon's SIGTERM must
take it down with it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.daemon_proc import DaemonProcess, free_port

SETTLE = 1.0  # a process that was started writes its mark well within this


def managed(marker: Path) -> dict[str, object]:
    return {
        "name": "marked",
        "device": "cpu",  # no GPU gates: nothing stands between a start and the mark
        "port": free_port(),
        # `exec` keeps the shell's pid, so the pid in the mark is the process to look for
        "command": ["sh", "-c", f"echo $$ >> {marker}; exec sleep 60"],
        "backoff_initial": "1s",
        "stop_grace": "5s",
    }


def daemon(tmp_path: Path, marker: Path) -> DaemonProcess:
    return DaemonProcess(tmp_path, {"collectors": {"serving": {"managed": managed(marker)}}})


def moptd(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )


READ_ONLY = {
    "status --offline": (["status", "--offline"], {0}),
    "status --offline --json": (["status", "--offline", "--json"], {0}),
    "status, no daemon": (["status"], {0}),
    "explain, no daemon": (["explain"], {0}),
    "explain --offline": (["explain", "--offline"], {0}),
    # doctor's verdict is about this host (disk space, swappiness); any verdict will do
    "doctor": (["doctor", "--json"], {0, 1, 2}),
    "serving status, no daemon": (["serving", "status"], {1}),  # the endpoint is down
    "serving logs, no daemon": (["serving", "logs"], {1}),  # no log yet
    "config": (["config"], {0}),
}


@pytest.mark.parametrize("command", READ_ONLY)
def test_a_read_only_command_starts_nothing(tmp_path: Path, command: str) -> None:
    marker = tmp_path / "started"
    d = daemon(tmp_path, marker)  # configured, never started: no API socket to reach
    args, codes = READ_ONLY[command]
    out = moptd(d.config_path, *args)
    assert out.returncode in codes, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    time.sleep(SETTLE)
    assert not marker.exists(), f"`moptd {command}` started the managed process"


def test_record_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    d = daemon(tmp_path, marker)
    bundle = tmp_path / "b"
    out = moptd(d.config_path, "record", "--duration", "1s", "--out", str(bundle), "--quiet")
    assert out.returncode == 0, out.stdout + out.stderr
    assert (bundle / "bundle.yaml").is_file()
    time.sleep(SETTLE)
    assert not marker.exists(), "`moptd record` started the managed process"


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent (gone the moment the parent is)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_the_daemon_starts_it_and_its_sigterm_stops_it(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    d = daemon(tmp_path, marker).start()
    try:
        d.wait_metrics(timeout=20)
        deadline = time.monotonic() + 20
        while not (marker.exists() and marker.read_text().strip()):
            assert time.monotonic() < deadline, f"the daemon never started it: {d.log()}"
            time.sleep(0.1)
        (first,) = (int(line) for line in marker.read_text().split())
        assert alive(first)
        up = 'moptd_serving_process_up{serving="marked"} 1.0'
        while up not in (text := d.scrape()):  # the collector reports what the daemon runs
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
        # the one command that acts asks the daemon, which holds the supervisor
        out = moptd(d.config_path, "serving", "restart")
        assert out.returncode == 0, out.stdout + out.stderr + d.log()
        deadline = time.monotonic() + 20
        while len(pids := [int(line) for line in marker.read_text().split()]) < 2:
            assert time.monotonic() < deadline, f"no second start: {d.log()}"
            time.sleep(0.1)
        assert not alive(first)
        pid = pids[-1]
        assert alive(pid)
    finally:
        code = d.stop()
    assert code == 0, d.log()
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} outlived the daemon"
        time.sleep(0.1)
    assert "Traceback" not in d.log()
