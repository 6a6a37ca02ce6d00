"""systemd notify protocol against a real notify socket and a real `moptd run`."""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moptd.daemon import sdnotify

from .conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp_path: Path, port: int) -> Path:
    config = tmp_path / "moptd.yaml"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"api:\n  socket: {tmp_path / 'run' / 'api.sock'}\n"
        f"exporter:\n  listen: 127.0.0.1:{port}\n",
        encoding="utf-8",
    )
    return config


def metrics_answer(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.path = path

    def receive(self, timeout: float) -> tuple[str, float] | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return None
        return data.decode(), time.monotonic()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


@pytest.mark.slow
def test_ready_watchdog_stopping_with_a_real_daemon(tmp_path, notify_socket, monkeypatch):
    port = free_port()
    config = write_config(tmp_path, port)
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(notify_socket.path),
        "WATCHDOG_USEC": "1000000",  # pings every 0.5 s while collection progresses
    }
    env.pop("WATCHDOG_PID", None)
    # The log goes to a file: a pipe nobody reads fills (64 KiB) once a first start logs the
    # findings of the whole boot's kernel ring, and the daemon then blocks in its logging.
    log = (tmp_path / "moptd.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moptd", "run", "--config", str(config)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        first = notify_socket.receive(timeout=40)
        assert first is not None, "no notification within 40 s"
        assert first[0].splitlines()[0] == "READY=1", f"first message was {first[0]!r}"
        # READY=1 promised that the exporter listens and a full collection is in: the
        # first scrape after it must already carry every collector's outcome.
        body = metrics_answer(port)
        assert body is not None, "READY=1 arrived but /metrics does not answer"
        assert 'moptd_collector_duration_seconds{collector="host"}' in body
        assert (tmp_path / "run" / "api.sock").is_socket()

        pings = []
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and len(pings) < 4:
            msg = notify_socket.receive(timeout=3)
            assert msg is not None, f"watchdog went silent after {len(pings)} pings"
            assert msg[0] == "WATCHDOG=1", msg[0]
            pings.append(msg[1])
        assert len(pings) >= 3
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert all(0.2 < g < 2.5 for g in gaps), gaps

        proc.send_signal(signal.SIGTERM)
        seen = []
        while True:
            msg = notify_socket.receive(timeout=15)
            assert msg is not None, f"no STOPPING=1 after SIGTERM; saw {seen}"
            seen.append(msg[0])
            if msg[0] == "STOPPING=1":
                break
            assert msg[0] == "WATCHDOG=1", msg[0]
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.slow
def test_watchdog_stops_when_collection_stops_progressing(tmp_path, notify_socket):
    # Only the host collector, every hour: after the first pass nothing progresses, so
    # systemd must stop hearing WATCHDOG=1 (and would restart a wedged daemon). Runs sit on
    # the interval's grid (clock.next_on_grid), so a second run can fall inside the window
    # when the daemon starts just before a grid point; with an hour that is rare, and it
    # adds one ping at most. A watchdog that pings on every tick would send about 8.
    from moptd.collectors import registry

    port = free_port()
    config = write_config(tmp_path, port)
    lines = ["collectors:"]
    for name in sorted(registry()):
        lines.append(f"  {name}:")
        lines.append("    interval: 3600" if name == "host" else "    enabled: false")
    config.write_text(config.read_text() + "\n".join(lines) + "\n")
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "1000000"}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moptd", "run", "--config", str(config)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        first = notify_socket.receive(timeout=40)
        assert first is not None
        assert first[0].startswith("READY=1")
        seen = []
        deadline = time.monotonic() + 4
        while msg := notify_socket.receive(timeout=max(0.01, deadline - time.monotonic())):
            seen.append(msg[0])
            if time.monotonic() >= deadline:
                break
        # At most one ping per collector run (the first pass, perhaps one grid run); else silence.
        assert set(seen) <= {"WATCHDOG=1"}, seen
        assert len(seen) <= 2, seen
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_notify_reaches_a_bound_socket(tmp_path, notify_socket, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_socket.path))
    assert sdnotify.notify("READY=1\nSTATUS=testing")
    msg = notify_socket.receive(timeout=2)
    assert msg is not None
    assert msg[0] == "READY=1\nSTATUS=testing"


def test_stdlib_sender_reaches_an_abstract_socket(monkeypatch):
    name = f"moptd-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify_stdlib("WATCHDOG=1")
        assert sock.recv(100) == b"WATCHDOG=1"


def test_no_socket_means_no_notification(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not sdnotify.notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert not sdnotify.notify_stdlib("READY=1")
    assert not sdnotify.notify("READY=1")  # whichever sender is in use


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("30000000", None, 15.0),
        ("30000000", "self", 15.0),
        ("30000000", "1", None),  # the watchdog is meant for another process
        ("0", None, None),
        ("soon", None, None),
        (None, None, None),
    ],
)
def test_watchdog_interval(monkeypatch, usec, pid, expected):
    for key, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, str(os.getpid()) if value == "self" else value)
    assert sdnotify.watchdog_interval() == expected


@pytest.mark.parametrize(
    ("level", "priority"),
    [
        (logging.CRITICAL, 2),
        (logging.ERROR, 3),
        (logging.WARNING, 4),
        (logging.INFO, 6),
        (logging.DEBUG, 7),
        (5, 7),
    ],
)
def test_log_levels_map_to_syslog_priorities(level, priority):
    assert sdnotify.priority_of(level) == priority


def test_journal_formatter_prefixes_every_line():
    # a message is one journal record: a newline in it (a quoted kernel record) is shown
    # escaped (issue 30, item 4); a traceback's lines each carry the priority
    record = logging.LogRecord("moptd.x", logging.ERROR, __file__, 1, "a\nb", None, None)
    fmt = sdnotify.JournalPrefixFormatter("%(levelname)s %(name)s: %(message)s")
    assert fmt.format(record) == "<3>ERROR moptd.x: a\\x0ab"
    try:
        raise ValueError("c")
    except ValueError:
        record.exc_info = sys.exc_info()
    lines = fmt.format(record).splitlines()
    assert lines[0] == "<3>ERROR moptd.x: a\\x0ab"
    assert lines[1] == "<3>Traceback (most recent call last):"
    assert lines[-1] == "<3>ValueError: c"


def test_journal_prefix_only_on_the_journal_stream(tmp_path, monkeypatch):
    path = tmp_path / "stream"
    with path.open("w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert isinstance(
            sdnotify.log_formatter("%(message)s", stream), sdnotify.JournalPrefixFormatter
        )
        monkeypatch.setenv("JOURNAL_STREAM", "1:2")
        assert not isinstance(
            sdnotify.log_formatter("%(message)s", stream), sdnotify.JournalPrefixFormatter
        )
    assert not sdnotify.stream_is_journal(io.StringIO())


def test_systemd_python_backend_when_installed(tmp_path, notify_socket, monkeypatch):
    pytest.importorskip("systemd.daemon", reason="the systemd extra is not installed")
    assert sdnotify.backend() == "systemd-python"
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_socket.path))
    assert sdnotify.notify("READY=1")
    msg = notify_socket.receive(timeout=2)
    assert msg is not None
    assert msg[0] == "READY=1"


ENV_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=30
)


@given(usec=ENV_TEXT, pid=st.one_of(st.none(), ENV_TEXT))
def test_watchdog_interval_never_raises(usec, pid):
    env = {"WATCHDOG_USEC": usec}
    if pid is not None:
        env["WATCHDOG_PID"] = pid
    with _environ(env):
        value = sdnotify.watchdog_interval()
    assert value is None or value > 0


@given(ENV_TEXT)
def test_journal_stream_never_raises(value):
    with _environ({"JOURNAL_STREAM": value}):
        assert sdnotify.stream_is_journal(sys.stderr) in (True, False)


@given(st.integers(min_value=1, max_value=10**12))
def test_watchdog_interval_is_half_the_period(usec):
    with _environ({"WATCHDOG_USEC": str(usec)}):
        assert sdnotify.watchdog_interval() == usec / 2e6


@contextlib.contextmanager
def _environ(values):
    # hypothesis runs many examples per test: monkeypatch (function-scoped) would not reset.
    keys = ("WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM")
    saved = {k: os.environ.get(k) for k in keys}
    try:
        for k in keys:
            os.environ.pop(k, None)
        os.environ.update(values)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
