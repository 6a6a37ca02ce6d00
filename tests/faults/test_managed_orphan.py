"""A moptd SIGKILLed outside systemd leaves no second managed server behind (issue 18, item
11): the server dies with its parent (PR_SET_PDEATHSIG), and a worker it forked, which the
parent-death signal does not reach, is found from the record in the state directory and
stopped with its group before the restarted moptd starts another. A record whose pid came
round again names someone else's process, which is never signalled.

Real processes throughout: a real `moptd run` managing `python -m http.server` (directly,
and under a shell that forks it, the shape of vLLM's API server and its engine core).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moptd.serving import managed_record, orphan
from tests.daemon_proc import DaemonProcess
from tests.faults.conftest import api_get, start_daemon
from tests.faults.test_serving_faults import daemon_config, managed

pytestmark = pytest.mark.slow


def servers(port: int) -> list[int]:
    """Live `http.server` processes on this port (zombies excluded)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            state = managed_record.stat_fields(int(name))
        except OSError:
            continue
        if state is None or state[0] == "Z":
            continue
        if b"http.server" in argv and str(port).encode() in argv and b"-c" not in argv:
            found.append(int(name))
    return found


def wait_for_servers(port: int, n: int, within: float = 20.0) -> list[int]:
    deadline = time.monotonic() + within
    while True:
        pids = servers(port)
        if len(pids) == n:
            return pids
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(pids)} servers on port {port}, want {n}: {pids}")
        time.sleep(0.1)


def http_server_spec(tmp: Path, forked: bool) -> dict[str, Any]:
    spec = managed(tmp, "serve")
    port = spec["port"]
    serve = [
        sys.executable,
        "-m",
        "http.server",
        "--bind",
        "127.0.0.1",
        "--directory",
        str(tmp),
        str(port),
    ]
    if forked:
        # the leader forks the server and waits: the parent-death signal reaches the leader
        # only. The server's output goes elsewhere than moptd's pipe, or its first log line
        # after moptd died would end it with EPIPE before the restart could find it.
        spec["command"] = ["/bin/sh", "-c", '"$@" >/dev/null 2>&1 & wait', "sh", *serve]
    else:
        spec["command"] = serve
    return spec


def start(tmp: Path, config: dict[str, Any]) -> DaemonProcess:
    # the same state directory for both daemons: the second is the first restarted
    return start_daemon(tmp / "daemon", config)


def managed_pid(d: DaemonProcess, within: float = 20.0) -> int:
    deadline = time.monotonic() + within
    while True:
        sup = api_get(d, "/v1/serving")["managed"]
        if sup.get("pid") and sup.get("state") == "running":
            return int(sup["pid"])
        if time.monotonic() > deadline:
            raise AssertionError(f"managed server not running: {sup}\n{d.log()[-3000:]}")
        time.sleep(0.1)


@pytest.mark.parametrize("forked", [False, True], ids=["server", "server-forked-by-a-shell"])
def test_a_restart_after_sigkill_leaves_one_managed_server(tmp_path, forked):
    spec = http_server_spec(tmp_path, forked)
    port = spec["port"]
    config = daemon_config(tmp_path, managed=spec)
    first = start(tmp_path, config)
    try:
        managed_pid(first)
        (old,) = wait_for_servers(port, 1)
        record = json.loads((first.state_dir / "serving" / "tiny" / "managed.json").read_text())
        assert record["pgid"] == record["pid"], record
        assert record["start_ticks"] > 0, record
        first.stop(signal.SIGKILL)
        if not forked:
            # the parent-death signal: gone with moptd, before any restart
            wait_for_servers(port, 0, within=5.0)
        else:
            # the shell died with moptd; its forked server still holds the port
            time.sleep(1.0)
            assert servers(port) == [old]
        second = start(tmp_path, config)
        try:
            managed_pid(second)
            (new,) = wait_for_servers(port, 1)
            assert new != old
            time.sleep(1.0)  # and no second one appears later
            assert servers(port) == [new]
            if forked:
                assert "an earlier moptd still runs" in second.log(), second.log()[-3000:]
        finally:
            second.stop()
        wait_for_servers(port, 0, within=10.0)
    finally:
        first.stop()
        for pid in servers(port):
            os.kill(pid, signal.SIGKILL)


def own_group_sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def write(state_dir: Path, pid: int, ticks: int, pgid: int) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    body = {"pid": pid, "start_ticks": ticks, "pgid": pgid, "boot_id": managed_record.boot_id()}
    (state_dir / managed_record.RECORD_NAME).write_text(json.dumps(body))


def test_a_reused_pid_is_never_signalled(tmp_path):
    other = own_group_sleeper()
    try:
        ticks = managed_record.start_ticks(other.pid)
        assert ticks is not None
        # the record's process started earlier than the one that has its pid now
        write(tmp_path, other.pid, ticks - 1, other.pid)
        assert orphan.stop_orphan(tmp_path, grace=1.0) == ""
        time.sleep(0.2)
        assert other.poll() is None, "a process that merely reused the pid was signalled"
        assert not (tmp_path / managed_record.RECORD_NAME).exists()
    finally:
        other.kill()
        other.wait()


def test_a_recorded_orphan_is_stopped_with_its_group(tmp_path):
    leader = own_group_sleeper()
    try:
        rec = orphan.write_record(tmp_path, leader.pid)
        assert rec is not None
        assert rec.pgid == leader.pid
        assert managed_record.group_members(rec) == [leader.pid]
        assert orphan.stop_orphan(tmp_path, grace=2.0) == ""
        assert leader.wait(5) == -signal.SIGTERM
        assert not (tmp_path / managed_record.RECORD_NAME).exists()
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()


def test_a_record_from_another_boot_or_unreadable_is_not_trusted(tmp_path):
    other = own_group_sleeper()
    try:
        ticks = managed_record.start_ticks(other.pid)
        assert ticks is not None
        (tmp_path / managed_record.RECORD_NAME).write_text(
            json.dumps(
                {
                    "pid": other.pid,
                    "start_ticks": ticks,
                    "pgid": other.pid,
                    "boot_id": "00000000-0000-0000-0000-000000000000",
                }
            )
        )
        assert orphan.stop_orphan(tmp_path, grace=1.0) == ""
        (tmp_path / managed_record.RECORD_NAME).write_text("{not json")
        assert orphan.stop_orphan(tmp_path, grace=1.0) == ""
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(max_size=600))
def test_any_proc_stat_text_parses_or_is_refused(tmp_path, raw):
    """/proc/PID/stat from a hostile command name (spaces, parentheses, bytes): the parser
    never raises and never reads a field from the name."""
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True, exist_ok=True)
    (proc / "7" / "stat").write_bytes(raw)
    fields = managed_record.stat_fields(7, proc)
    ticks = managed_record.start_ticks(7, proc)
    assert fields is None or b")" in raw
    assert ticks is None or isinstance(ticks, int)


def test_a_command_name_with_parentheses_does_not_shift_the_fields(tmp_path):
    proc = tmp_path / "proc"
    (proc / "9").mkdir(parents=True)
    # the layout of a real /proc/PID/stat (proc(5)), with a command name built to mislead
    rest = "S 1 9 9 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123456 1000 10"
    (proc / "9" / "stat").write_text(f"9 (a) 1 2 3 (b) {rest}")
    assert managed_record.start_ticks(9, proc) == 123456
    assert managed_record.stat_fields(9, proc)[:4] == ["S", "1", "9", "9"]


def test_an_orphan_that_cannot_be_signalled_refuses_the_start(tmp_path, monkeypatch):
    """EPERM (an orphan another user's moptd left, a hardened kernel): the start is refused
    as a PORT_CONFLICT gate naming the pid, and the record stays for the next try."""
    leader = own_group_sleeper()
    try:
        assert orphan.write_record(tmp_path, leader.pid) is not None

        def refused(_pgid: int, _sig: int) -> None:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(orphan.os, "killpg", refused)
        (gate,) = orphan.orphan_gate(tmp_path, grace=0.5)
        assert (gate.check, gate.ok, gate.code) == ("orphan", False, "PORT_CONFLICT")
        assert f"pid {leader.pid}" in gate.reason
        assert "cannot be stopped" in gate.reason
        assert leader.poll() is None
        assert (tmp_path / managed_record.RECORD_NAME).exists()
    finally:
        leader.kill()
        leader.wait()
