"""A taken exporter port: the message names the key, where it was set, and the holder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.proc.listeners import listening_inodes, port_holders
from tests.daemon_proc import DaemonProcess

pytestmark = pytest.mark.slow


def _wait(d: DaemonProcess, timeout: float = 30) -> int:
    assert d.proc is not None
    return d.proc.wait(timeout)


def test_a_port_held_by_another_program_names_key_file_and_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen();"
            "print(s.getsockname()[1], flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        d = DaemonProcess(tmp_path, {"exporter": {"listen": f"127.0.0.1:{port}"}})
        d.port = port
        d.start()
        assert _wait(d) == 1
        d.stop()
        log = d.log()
        assert f"cannot listen on 127.0.0.1:{port} (exporter.listen, set in {d.config_path})" in log
        assert f"held by pid {holder.pid} (" in log, log
        assert "another moptd" not in log
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def test_a_port_held_by_another_moptd_says_so(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with DaemonProcess(tmp_path / "a") as first:
        first.wait_metrics(30)
        second = DaemonProcess(tmp_path / "b", {"exporter": {"listen": f"127.0.0.1:{first.port}"}})
        second.start()
        assert _wait(second) == 1
        second.stop()
        assert first.proc is not None
        log = second.log()
        assert f"held by pid {first.proc.pid} (" in log, log
        assert "another moptd is running" in log


def test_listening_inodes_on_this_hosts_real_table() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        inodes = listening_inodes(Path("/proc/net/tcp").read_text(), port)
        assert len(inodes) == 1
        assert [h.pid for h in port_holders(port)] == [os.getpid()]
    assert listening_inodes(Path("/proc/net/tcp").read_text(), port) == set()


@given(st.text(max_size=2000), st.integers(0, 65535))
@settings(max_examples=300, deadline=None)
def test_any_text_gives_a_set(text: str, port: int) -> None:
    assert isinstance(listening_inodes(text, port), set)
