"""The very first scrape after a start (issue 34): every enabled collector is in it, with
its state so far (moptd_collector_success NaN while it has not run: no `== 0` alert matches
it), from a real `moptd run` scraped as soon as its port accepts a connection. Before the
fix the exporter listened before the collectors were registered, and the first scrape
named 0 to 2 of them: an absent series reads like a broken exporter."""

from __future__ import annotations

import socket
import time

import pytest

from moptd.collectors import registry
from moptd.config import load_config
from tests.daemon_proc import DaemonProcess


def _first_answer(d: DaemonProcess, timeout: float = 30.0) -> str:
    """The body of the first /metrics answer, asked as soon as the port takes a
    connection (no sleep between tries: the window is the start-up's first moments)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert d.proc is not None
        assert d.proc.poll() is None, d.log()
        try:
            with socket.create_connection((d.host, d.port), timeout=5) as s:
                s.sendall(b"GET /metrics HTTP/1.0\r\nHost: moptd\r\n\r\n")
                data = b"".join(iter(lambda: s.recv(65536), b""))
        except OSError:
            continue
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.split()[1] == b"200", head
        return body.decode()
    pytest.fail(f"no /metrics answer within {timeout:.0f} s: {d.log()}")


@pytest.mark.slow
@pytest.mark.parametrize("run", range(3))  # the window is a race: ask three starts
def test_the_first_scrape_names_every_collector(tmp_path, run):
    d = DaemonProcess(tmp_path)
    enabled = {
        name
        for name, cc in load_config(d.config_path, registry()).collectors.items()
        if cc.enabled
    }
    assert len(enabled) >= 5
    d.start()
    try:
        text = _first_answer(d)
    finally:
        d.stop()
    states = {
        line.split('collector="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
        for line in text.splitlines()
        if line.startswith("moptd_collector_success{")
    }
    assert set(states) == enabled, (sorted(states), sorted(enabled))
    for name, value in states.items():
        assert value in ("NaN", "0.0", "1.0"), (name, value)
