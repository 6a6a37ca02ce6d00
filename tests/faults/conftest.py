"""Shared helpers for the fault-injection suite: a daemon factory and the checks every fault
test makes — the daemon is alive, /metrics answers and the API answers, each within a
deadline.

Stable API (other fault test files import these):
  start_daemon(tmp, extra=None, env=None, *args) -> DaemonProcess   started, API up, /metrics up
  daemon_factory (fixture)                        same, stopped at teardown
  assert_alive(daemon)                            fails with the daemon's log if it exited
  assert_serving(daemon, within=5.0) -> str       /metrics text; also GET /v1/health == 200
  scrape(daemon, timeout=5.0) -> str              one /metrics scrape
  api_get(daemon, path, timeout=5.0) -> dict      GET over the Unix socket, asserts 200
  api_request(daemon, method, path, body=None, timeout=5.0) -> (status, json)
  metric_value(text, name, **labels) -> float | None
  open_fds(daemon) -> int                         entries in /proc/PID/fd
  is_root() -> bool, needs_root                   skip marker for tests that need root
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from moptd.cli import client
from tests.api_helpers import wait_for, wait_socket
from tests.daemon_proc import DaemonProcess


def is_root() -> bool:
    return os.geteuid() == 0


needs_root = pytest.mark.skipif(not is_root(), reason="needs root")


def assert_alive(daemon: DaemonProcess) -> None:
    assert daemon.proc is not None, "daemon never started"
    rc = daemon.proc.poll()
    assert rc is None, f"moptd exited with {rc}:\n{daemon.log()[-4000:]}"


def start_daemon(
    tmp: Path,
    extra: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    *args: str,
    timeout: float = 20.0,
) -> DaemonProcess:
    """A started `moptd run` whose API socket and /metrics both answer."""
    tmp.mkdir(parents=True, exist_ok=True)
    d = DaemonProcess(tmp, extra, env).start(*args)
    try:
        wait_socket(d.socket, d.proc, timeout)
        d.wait_metrics(timeout)
    except BaseException:
        d.stop()
        raise
    return d


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """start(extra=None, env=None, *args) -> a running daemon in its own directory under
    tmp_path; every daemon started is stopped at teardown."""
    started: list[DaemonProcess] = []

    def start(
        extra: dict[str, Any] | None = None, env: dict[str, str] | None = None, *args: str
    ) -> DaemonProcess:
        d = start_daemon(tmp_path / f"daemon{len(started)}", extra, env, *args)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def scrape(daemon: DaemonProcess, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=timeout) as resp:
        assert resp.status == 200
        return str(resp.read().decode())


def api_request(
    daemon: DaemonProcess,
    method: str,
    path: str,
    body: bytes | None = None,
    timeout: float = 5.0,
) -> tuple[int, Any]:
    return client.request(daemon.socket, method, path, timeout, body)


def api_get(daemon: DaemonProcess, path: str, timeout: float = 5.0) -> dict[str, Any]:
    status, body = api_request(daemon, "GET", path, timeout=timeout)
    assert status == 200, f"GET {path}: HTTP {status}: {body}"
    assert isinstance(body, dict), f"GET {path}: not a JSON object: {body!r}"
    return body


def assert_serving(daemon: DaemonProcess, within: float = 5.0) -> str:
    """The daemon is alive, /metrics answers and GET /v1/health answers 200, each within
    `within` seconds (the client timeouts enforce it; the elapsed times are checked too, so a
    slow-but-successful answer still fails). Returns the /metrics text."""
    assert_alive(daemon)
    t0 = time.monotonic()
    try:
        text = scrape(daemon, timeout=within)
    except OSError as exc:
        assert_alive(daemon)
        raise AssertionError(f"/metrics did not answer within {within}s: {exc}") from exc
    took = time.monotonic() - t0
    assert took <= within, f"/metrics took {took:.2f}s (deadline {within}s)"
    assert "moptd_" in text, "/metrics answered without moptd metrics"
    t0 = time.monotonic()
    try:
        health = api_get(daemon, "/v1/health", timeout=within)
    except client.DaemonUnreachable as exc:
        assert_alive(daemon)
        raise AssertionError(f"/v1/health did not answer within {within}s: {exc}") from exc
    took = time.monotonic() - t0
    assert took <= within, f"/v1/health took {took:.2f}s (deadline {within}s)"
    assert health.get("status") in ("ok", "degraded"), health
    assert_alive(daemon)
    return text


_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample of `name` whose labels include `labels`; None if none."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group("name") != name:
            continue
        have = dict(_LABEL.findall(m.group("labels") or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group("value"))
    return None


def open_fds(daemon: DaemonProcess) -> int:
    assert daemon.proc is not None
    return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))


__all__ = [
    "api_get",
    "api_request",
    "assert_alive",
    "assert_serving",
    "daemon_factory",
    "is_root",
    "metric_value",
    "needs_root",
    "open_fds",
    "scrape",
    "start_daemon",
    "wait_for",
]
