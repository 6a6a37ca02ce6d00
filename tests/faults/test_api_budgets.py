"""Connection budgets per listener and per peer (issue 18, item 6).

300 event streams over TCP (with the token, as a local user holding it could open them)
used to take the one cap both API listeners shared, so root's rule reload on the Unix
socket got 503. Each listener now has its own budget and one peer at most MAX_PEER_BUSY
requests in handlers.
"""

from __future__ import annotations

import os
import socket

import pytest

from moptd.daemon.http import MAX_PEER_BUSY
from tests.daemon_proc import free_port
from tests.faults.conftest import api_request, assert_serving, start_daemon

pytestmark = pytest.mark.slow

TOKEN = "budget-token"


def open_stream(port: int) -> tuple[socket.socket, bytes]:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(
        b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    return s, s.recv(64)


def test_event_streams_over_tcp_leave_the_socket_its_room(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o600)
    port = free_port()
    d = start_daemon(
        tmp_path / "d",
        {
            "api": {"listen": f"127.0.0.1:{port}", "token_file": str(token_file)},
            "collectors": {"kernel": {"enabled": False}},
        },
    )
    streams: list[socket.socket] = []
    try:
        answers = []
        for _ in range(300):
            s, first = open_stream(port)
            streams.append(s)
            answers.append(first.split(b" ", 2)[1] if first.startswith(b"HTTP/1.1") else b"")
        opened = answers.count(b"200")
        assert opened == MAX_PEER_BUSY, answers[:5]
        assert answers.count(b"503") == 300 - MAX_PEER_BUSY
        # root, on the socket, while the TCP peer holds everything it may
        status, body = api_request(d, "POST", "/v1/rules/reload", b"", timeout=10)
        assert status == 200, body
        assert api_request(d, "GET", "/v1/status", timeout=10)[0] == 200
        assert_serving(d)
    finally:
        for s in streams:
            s.close()
        assert d.stop() == 0
