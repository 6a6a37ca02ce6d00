"""Hostile clients against a real daemon's three listeners: the API's Unix socket, the API
over loopback TCP and the /metrics exporter.

Oversized, malformed and binary requests are refused with a 4xx (and no traceback in the
log); slowloris clients (a byte a second), silent ones and a trickled request body are cut
off after the idle timeout; more connections than the cap leave room for a well-behaved
client; clients that never read their responses do not stall anyone. Meanwhile /metrics and
the API answer within a deadline (worst latency measured), and the daemon's open file count
returns to its baseline once the abusers are gone.

Limits (moptd/daemon/http.py, docs/api/README.md): IDLE_TIMEOUT without a complete request,
MAX_CONNECTIONS per listener, 64 KiB per body, aiohttp's 8190-byte line and header caps.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from moptd.daemon.http import IDLE_TIMEOUT, MAX_CONNECTIONS
from tests.daemon_proc import DaemonProcess, free_port
from tests.faults.conftest import (
    api_get,
    assert_serving,
    open_fds,
    start_daemon,
    wait_for,
)

pytestmark = pytest.mark.slow

Address = tuple[int, object]  # (socket family, address)
FD_SLACK = 3  # files the collectors open and close while we count


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("abuse")
    api_port = free_port()
    d = start_daemon(tmp, {"api": {"listen": f"127.0.0.1:{api_port}"},
                           # the host's kernel log is shared with tests writing to it
                           "collectors": {"kernel": {"enabled": False}}})
    d.api_port = api_port  # type: ignore[attr-defined]
    yield d
    d.stop()


def listeners(d: DaemonProcess) -> dict[str, Address]:
    return {
        "api-unix": (socket.AF_UNIX, str(d.socket)),
        "api-tcp": (socket.AF_INET, ("127.0.0.1", d.api_port)),
        "exporter": (socket.AF_INET, ("127.0.0.1", d.port)),
    }


def connect(addr: Address, timeout: float = 5.0) -> socket.socket:
    """A connection, retried while the listen backlog is full (a Unix socket refuses with
    EAGAIN then) for up to `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(addr[0], socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(addr[1])
            return s
        except (BlockingIOError, ConnectionRefusedError, TimeoutError):
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def exchange(addr: Address, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data`, return the first response's status line (b'' if the server just closed)."""
    with connect(addr) as s:
        s.settimeout(timeout)
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading it all
        buf = b""
        try:
            while b"\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except ConnectionResetError:
            pass
        return buf.split(b"\r\n", 1)[0]


def status_code(status_line: bytes) -> int | None:
    parts = status_line.split(b" ")
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        return None
    return int(parts[1])


def closed_by_server(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def fd_baseline(d: DaemonProcess) -> int:
    # collectors open files briefly; the smallest of a few looks is the resting count
    counts = []
    for _ in range(5):
        counts.append(open_fds(d))
        time.sleep(0.1)
    return min(counts)


def assert_fds_back(d: DaemonProcess, baseline: int) -> None:
    try:
        wait_for(lambda: open_fds(d) <= baseline + FD_SLACK, timeout=15, step=0.2)
    except AssertionError:
        raise AssertionError(
            f"fds {open_fds(d)} (baseline {baseline}): {os.listdir(f'/proc/{d.proc.pid}/fd')}"
        ) from None


REQ = b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n"
MALFORMED = {
    "request line of 100 kB": b"GET /v1/health?" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
    "header of 100 kB": REQ + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n",
    "1000 headers": REQ + b"".join(b"X-%d: a\r\n" % i for i in range(1000)) + b"\r\n",
    "not HTTP": b"HELLO THERE\r\n\r\n",
    "HTTP/9.9": b"GET /v1/health HTTP/9.9\r\nHost: x\r\n\r\n",
    "NUL bytes": b"\x00" * 1000 + b"\r\n\r\n",
    "bad chunk size": b"POST /v1/rules/reload HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n0\r\n\r\n",
    "Content-Length and chunked": b"POST /v1/rules/reload HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "negative Content-Length": b"POST /v1/rules/reload HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: -1\r\n\r\n",
}


def test_oversized_malformed_and_binary_requests_get_a_400(daemon):
    baseline = fd_baseline(daemon)
    garbage = [os.urandom(4096) for _ in range(5)]
    for where, addr in listeners(daemon).items():
        for what, data in MALFORMED.items():
            status = exchange(addr, data)
            assert status_code(status) == 400, (where, what, status)
        for data in garbage:
            # random bytes: a 400, or a plain close when no request line can be made out
            status = exchange(addr, data)
            assert status == b"" or status_code(status) == 400, (where, status)
        assert_serving(daemon)
    # a body over 64 KiB, to an endpoint that takes one (root over the Unix socket may
    # call it): 413, nothing applied
    unix = listeners(daemon)["api-unix"]
    big = b"POST /v1/rules/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n"
    assert status_code(exchange(unix, big + b"x" * 200_000)) == 413
    rules = api_get(daemon, "/v1/rules")
    assert rules["rules"], "the rule set is still in force"
    assert_serving(daemon)
    assert_fds_back(daemon, baseline)
    log = daemon.log()
    assert "Traceback" not in log, log[-3000:]
    assert "ERROR" not in log, log[-3000:]


def test_slow_silent_and_deaf_clients_do_not_stall_the_daemon(daemon):
    baseline = fd_baseline(daemon)
    addrs = listeners(daemon)
    request = b"GET /v1/status HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"p" * 200 + b"\r\n\r\n"
    slowloris = [connect(addr) for addr in addrs.values() for _ in range(30)]
    silent = [connect(addr) for addr in addrs.values() for _ in range(30)]
    # a POST whose 1000-byte body comes a byte a second
    trickle = connect(addrs["api-unix"])
    trickle.sendall(b"POST /v1/rules/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
    # deaf: 300 pipelined requests each, never reading a byte of the answers
    deaf = []
    for addr in addrs.values():
        s = connect(addr)
        s.setblocking(False)
        path = b"/metrics" if addr == addrs["exporter"] else b"/v1/status"
        burst = (b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n") * 300
        try:
            s.send(burst)
        except BlockingIOError:
            pass
        deaf.append(s)

    worst = 0.0
    cut_at: dict[int, float] = {}
    t0 = time.monotonic()
    step = 0
    while time.monotonic() - t0 < IDLE_TIMEOUT + 5 and len(cut_at) < len(slowloris):
        for i, s in enumerate(slowloris):
            if i in cut_at:
                continue
            try:
                s.send(request[step : step + 1])
            except OSError:
                cut_at[i] = time.monotonic() - t0
        try:
            trickle.send(b"x")
        except OSError:
            pass
        started = time.monotonic()
        assert_serving(daemon, within=5.0)
        worst = max(worst, time.monotonic() - started)
        step += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))

    # every slowloris was cut off once the idle timeout ran out, though it kept sending
    assert len(cut_at) == len(slowloris), f"{len(slowloris) - len(cut_at)} still open"
    assert min(cut_at.values()) >= IDLE_TIMEOUT - 2, cut_at
    assert max(cut_at.values()) <= IDLE_TIMEOUT + 5, cut_at
    assert all(closed_by_server(s) for s in silent), "silent clients are closed too"
    trickle.setblocking(True)
    trickle.settimeout(5)
    answer = trickle.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    # the well-behaved client never waited long (the deadline is generous on a shared CI
    # machine; a stalled daemon answers in never)
    assert worst < 3.0, f"worst /metrics + /v1/health round trip {worst:.2f}s"

    for s in slowloris + silent + deaf + [trickle]:
        s.close()
    assert_serving(daemon)
    assert_fds_back(daemon, baseline)


def test_more_connections_than_the_cap_leave_room_for_a_good_client(daemon):
    baseline = fd_baseline(daemon)
    addrs = listeners(daemon)
    per_listener = MAX_CONNECTIONS + 150
    crowd = [connect(addrs[name]) for name in ("api-unix", "exporter")
             for _ in range(per_listener)]
    # many well-behaved clients at once, while the idle crowd holds the caps
    statuses: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(5):
            body = api_get(daemon, "/v1/status", timeout=10)
            with lock:
                statuses.append(200 if "collectors" in body else 0)

    threads = [threading.Thread(target=client) for _ in range(20)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    took = time.monotonic() - started
    assert statuses == [200] * 100
    assert took < 30
    text = assert_serving(daemon, within=5.0)
    assert "moptd_" in text
    # the caps bound the daemon's sockets: without them it would hold every one
    held = open_fds(daemon) - baseline
    assert held <= 2 * MAX_CONNECTIONS + 20, f"{held} fds for {len(crowd)} connections"
    evicted = sum(closed_by_server(s) for s in crowd)
    assert evicted >= len(crowd) - 2 * MAX_CONNECTIONS
    assert "connections to one listener (the cap)" in daemon.log()
    for s in crowd:
        s.close()
    assert_fds_back(daemon, baseline)
    assert_serving(daemon)
