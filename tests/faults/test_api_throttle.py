"""The TCP API's wrong-token throttle cannot be turned against the token's holder (issue 30,
item 3).

On loopback every local user is 127.0.0.1. The throttle used to refuse a *source*, so an
unprivileged user's five wrong guesses a minute made root's requests with the right token
answer 429, the balancer's readiness probe included, while the guesser escaped the throttle
by sending from 127.0.0.2, 127.0.0.3, ... Now a correct token always passes, and all of
loopback is one source for the wrong-guess budget.
"""

from __future__ import annotations

import http.client
import json
import os
import signal

import pytest

from moptd.daemon.auth import FAILED_TOKEN_BURST
from tests.daemon_proc import free_port
from tests.faults.conftest import assert_serving, start_daemon, wait_for

pytestmark = pytest.mark.slow

TOKEN = "the-right-token-0123456789"


def call(port: int, path: str, token: str, source: str = "127.0.0.1") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        body = json.loads(resp.read() or b"{}")
        if resp.status >= 400:
            assert body.get("status") == resp.status, body
        return int(resp.status)
    finally:
        conn.close()


def test_wrong_guesses_from_loopback_neither_lock_out_the_token_nor_escape_by_address(tmp_path):
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
    try:
        ready_before = call(port, "/v1/serving/engine/ready", TOKEN)
        assert call(port, "/v1/health", TOKEN) == 200
        # the attacker: wrong guesses from 127.0.0.1 until the throttle answers
        guesses = [call(port, "/v1/health", "guess") for _ in range(FAILED_TOKEN_BURST + 3)]
        assert guesses == [401] * FAILED_TOKEN_BURST + [429] * 3
        # root, same source address, right token: served, the readiness probe too
        for _ in range(3):
            assert call(port, "/v1/health", TOKEN) == 200
            assert call(port, "/v1/status", TOKEN) == 200
            assert call(port, "/v1/serving/engine/ready", TOKEN) == ready_before
        # rotating the loopback source address buys no more guesses
        rotated = [call(port, "/v1/health", "guess", f"127.0.0.{i}") for i in range(2, 41)]
        assert rotated == [429] * 39
        # ... and from any of them, the right token still passes
        assert call(port, "/v1/health", TOKEN, "127.0.0.7") == 200
        assert "wrong token from 127.0.0.1 (source loopback" in d.log()
        assert_serving(d)
    finally:
        d.stop()


def test_sighup_reads_the_token_file_again(tmp_path):
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
    try:
        assert call(port, "/v1/health", TOKEN) == 200
        token_file.write_text("the-rotated-token-9876543210")
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: call(port, "/v1/health", "the-rotated-token-9876543210") == 200)
        # the old token is a wrong one now (429 once the tries above used the budget)
        assert call(port, "/v1/health", TOKEN) in (401, 429)
        assert_serving(d)
    finally:
        d.stop()
