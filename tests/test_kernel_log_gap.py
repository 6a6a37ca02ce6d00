"""Kernel-log records overwritten before moptd read them are a finding, not only a counter
(issue 31, item 3): KERNEL_LOG_RECORDS_LOST on node, through the real API.

The real /dev/kmsg: a daemon whose committed position lies a few records before the oldest
record the ring still holds (this boot's ring has wrapped) finds those records gone at
start, exactly as after a stop longer than the ring holds. Its kernel collector publishes a
kernel.log_gap event, the shipped rule raises the finding, and the event is kept in the
findings database. The same path through a SOCK_SEQPACKET pair (one record per read, as
/dev/kmsg) runs everywhere, a wrapped ring or not.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from moptd.collector import CollectorContext
from moptd.collectors.kernel_log import KernelLogCollector
from moptd.findings.db import FILE_NAME, FindingsDB
from moptd.kernel.kmsg import KmsgFollower, read_boot_id
from moptd.observations import Event
from tests.api_helpers import get, wait_for, wait_socket
from tests.conftest import REPO
from tests.daemon_proc import DaemonProcess

XID79 = (REPO / "tests/fixtures/kmsg-restart/xid79.txt").read_text().strip()


def _oldest_kmsg_seq() -> int | None:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while True:
            try:
                return int(os.read(fd, 8192).split(b",", 2)[1])
            except BrokenPipeError:
                continue  # overwritten as we read: the next one is the oldest
            except BlockingIOError:
                return None
    finally:
        os.close(fd)


def test_records_lost_at_start_are_a_finding_through_the_api(tmp_path: Path) -> None:
    oldest = _oldest_kmsg_seq()
    if oldest is None:
        pytest.skip("/dev/kmsg is not readable here")
    if oldest < 6:
        pytest.skip(f"this boot's kernel ring has not wrapped (oldest record {oldest})")
    state = tmp_path / "state"
    state.mkdir()
    with FindingsDB(state / FILE_NAME) as db:  # stopped five records before the oldest
        db.save_position("kmsg", read_boot_id(), oldest - 5).result(30)
    d = DaemonProcess(tmp_path, kernel_from_now=False).start()
    try:
        wait_socket(d.socket, d.proc, timeout=30)

        def lost() -> list[dict]:
            status, body = get(d.socket, "/v1/findings?code=KERNEL_LOG_RECORDS_LOST")
            assert status == 200
            return [f for f in body["active"] if f["subject"] == "node"]

        (finding,) = wait_for(lost, timeout=30)
        assert finding["severity"] == "warning"
        assert finding["rule"] == "kernel-log-records-lost"
        # at least the four between the position and the oldest; more if it wrapped since
        assert int(finding["evidence"]["lost"]) >= 4
        assert "kernel-log records were overwritten before moptd read them" in finding["summary"]
        scraped = d.wait_metrics()
        counter = "moptd_kernel_records_lost_total"
        (line,) = [x for x in scraped.splitlines() if x.startswith(counter)]
        assert float(line.split()[-1]) >= 4
    finally:
        d.stop()
    with FindingsDB(state / FILE_NAME) as db:  # the gap is evidence kept for later
        kept = db.events(stream="kernel.log_gap", limit=10)
    assert kept
    assert int(kept[0]["fields"]["lost"]) >= 4


def test_a_sequence_gap_becomes_one_event_with_the_count(tmp_path: Path) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.setblocking(False)
    published: list[Event] = []
    collector = KernelLogCollector(CollectorContext(state_dir=tmp_path, publish=published.extend))
    follower = KmsgFollower(tmp_path / "dev", collector._on_records, boot_id="b")
    follower.adopt(os.dup(b.fileno()))
    collector.follower = follower
    try:
        for seq in (10, 11, 15):  # 12, 13, 14 were overwritten
            a.send(f"3,{seq},1000,-;{XID79}\n".encode())
        while follower.read_slice():
            pass
        gaps = [e for e in published if e.stream == "kernel.log_gap"]
        assert [(e.subject, e.fields["lost"], e.fields["total"]) for e in gaps] == [("node", 3, 3)]
        assert len([e for e in published if e.stream == "kernel.xid"]) == 3
        a.send(f"3,16,1000,-;{XID79}\n".encode())  # no gap: no new event
        while follower.read_slice():
            pass
        assert len([e for e in published if e.stream == "kernel.log_gap"]) == 1
    finally:
        follower.close()
        a.close()
        b.close()
