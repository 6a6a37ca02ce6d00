"""One daemon per state directory, and no socket left behind (issue 30, item 8).

A second `moptd run` on the state directory of a running one used to start beside it: both
stored the same Xid and one could open the other's database. Now the second refuses to start
(exit 1) and names the first's pid; the first serves on. A stopped daemon's API socket used
to stay behind; now the socket file goes with the daemon.
"""

from __future__ import annotations

import pytest

from tests.daemon_proc import DaemonProcess
from tests.faults.conftest import assert_serving, start_daemon

pytestmark = pytest.mark.slow

CONFIG = {"collectors": {"kernel": {"enabled": False}}}


def test_a_second_daemon_on_the_same_state_dir_refuses_and_the_first_serves_on(tmp_path):
    first = start_daemon(tmp_path / "a", CONFIG)
    try:
        (tmp_path / "b").mkdir()
        second = DaemonProcess(
            tmp_path / "b", {**CONFIG, "state_dir": str(first.state_dir)}
        ).start()
        try:
            rc = second.proc.wait(20)  # type: ignore[union-attr]
        finally:
            second.stop()
        log = second.log()
        assert rc == 1, log[-3000:]
        assert f"is in use by another moptd (pid {first.proc.pid})" in log, log[-3000:]  # type: ignore[union-attr]
        assert not second.socket.exists()
        assert_serving(first)
    finally:
        assert first.stop() == 0, first.log()[-3000:]
    assert not first.socket.exists(), "the API socket stayed after the daemon stopped"

    # the lock went with the first daemon: a new one starts on the same state directory
    again = start_daemon(tmp_path / "c", {**CONFIG, "state_dir": str(first.state_dir)})
    try:
        assert_serving(again)
    finally:
        assert again.stop() == 0
