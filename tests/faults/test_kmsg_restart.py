"""A daemon SIGKILLed at random moments neither misses nor stores twice a kernel event.

Each of the KILLS rounds starts `moptd run`, writes real Xid lines (a public gpud line
moved to PCI 0000:fe:00, each with a tag and a number of its own) to the real /dev/kmsg
before it starts, while it starts, and while it runs, and kills it with SIGKILL at a
random moment, often within a second of a write. A last daemon catches up and stops
cleanly; then the findings database must hold every line written, each exactly once
(the kernel-log position is committed in the transaction of the events it covers).

A first start reads this boot's whole ring, which holds other tests' records: the daemon
here starts at the newest record (tests/daemon_proc.py) and every check matches the tag.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.api_helpers import kmsg_writable
from tests.daemon_proc import DaemonProcess, seed_kernel_position

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(not kmsg_writable(), reason="needs a writable /dev/kmsg (root)"),
]

KILLS = 50
FIXTURE = Path(__file__).parent.parent / "fixtures" / "kmsg-restart" / "xid79.txt"
XID79 = FIXTURE.read_text().strip().replace("PCI:0000:05:00", "PCI:0000:fe:00")
# Only the kernel collector: the others only slow each start (the test is about restarts).
CONFIG = {
    "collectors": {
        "kernel": {"interval": 0.5},
        **{name: {"enabled": False} for name in ("container", "driver", "host", "nvml", "serving")},
    }
}


def _write(line: str) -> None:
    # one open per write: the kernel rate-limits writes per open file (printk.devkmsg)
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _stored(db: Path, tag: str) -> Counter[str]:
    """How many times each tagged line is in the events table (read-only, WAL)."""
    if not db.exists():
        return Counter()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    try:
        rows = conn.execute(
            "SELECT text FROM events WHERE stream = 'kernel.xid' AND text LIKE ?", (f"%{tag}-%",)
        ).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return Counter()
    finally:
        conn.close()
    return Counter(str(r[0]).rsplit("-", 1)[-1] for r in rows)


def test_sigkill_at_random_moments_neither_misses_nor_duplicates_an_event(tmp_path):
    seed = int(os.environ.get("MOPTD_KILL_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    print(f"seed {seed} (MOPTD_KILL_SEED to repeat)")
    tag = f"moptd-test-{uuid.uuid4()}"
    db = tmp_path / "state" / "findings.db"
    written: list[str] = []

    def write() -> None:
        n = str(len(written))
        _write(f"<3>{XID79} {tag}-{n}\n")
        written.append(n)

    d = DaemonProcess(tmp_path, CONFIG)
    seed_kernel_position(d.state_dir)  # before the first line: a start must find that one
    near_an_xid = 0
    started = time.monotonic()
    for _ in range(KILLS):
        if rng.random() < 0.5:
            write()  # while no daemon runs: the restart must find it
        d.start()
        assert d.proc is not None
        if rng.random() < 0.4:
            # let it get going (the socket is up once collection has started)
            deadline = time.monotonic() + 10
            while not d.socket.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        else:
            time.sleep(rng.uniform(0.0, 1.2))  # somewhere in its start
        last_write = None
        for _ in range(rng.randint(0, 3)):
            time.sleep(rng.uniform(0.0, 0.2))
            write()
            last_write = time.monotonic()
        time.sleep(rng.uniform(0.0, 0.8))
        if last_write is not None and time.monotonic() - last_write < 1.0:
            near_an_xid += 1
        d.stop(signal.SIGKILL)
        assert d.proc.returncode == -9, d.log()[-3000:]
    kills_took = time.monotonic() - started

    write()  # and one more while it is down
    d.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if set(_stored(db, tag)) >= set(written):
                break
            time.sleep(0.1)
    finally:
        assert d.stop() == 0, d.log()[-3000:]
    counts = _stored(db, tag)
    missed = [n for n in written if counts[n] == 0]
    twice = {n: c for n, c in counts.items() if c > 1}
    print(
        f"{KILLS} SIGKILLs in {kills_took:.1f}s, {near_an_xid} within a second of an Xid; "
        f"{len(written)} Xid lines written, {len(missed)} missed, {len(twice)} stored twice"
    )
    assert near_an_xid >= 10  # the random schedule did hit the moments that matter
    assert missed == []
    assert twice == {}
    others = sorted(set(counts) - set(written))
    assert others == [], f"stored, never written: {others}; stored {dict(counts)}"


@pytest.mark.skipif(
    not os.environ.get("MOPTD_KMSG_OVERRUN"),
    reason="overwrites this host's whole kernel log; set MOPTD_KMSG_OVERRUN=1 (sandbox/CI VM)",
)
def test_a_ring_that_wrapped_while_the_daemon_was_down_is_counted_as_lost(tmp_path):
    from tests.faults.conftest import api_get, metric_value, start_daemon
    from tests.faults.test_kmsg_flood import flood, newest_seq, oldest_seq

    tag = f"moptd-test-{uuid.uuid4()}"
    d = start_daemon(tmp_path / "d", CONFIG)
    try:
        _write(f"<3>{XID79} {tag}-0\n")
        db = tmp_path / "d" / "state" / "findings.db"
        deadline = time.monotonic() + 20
        while not _stored(db, tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _stored(db, tag) == Counter({"0": 1})
    finally:
        assert d.proc is not None
        d.stop(signal.SIGKILL)
    mark = newest_seq()
    # more than the ring holds, while no daemon runs
    while oldest_seq() <= mark + 10:
        writer = flood(5_000, tag, "0000:fe:00")
        assert writer.wait(300) == 0
    d = start_daemon(tmp_path / "d", CONFIG)
    try:
        deadline = time.monotonic() + 30
        lost = 0.0
        while time.monotonic() < deadline:
            lost = metric_value(d.scrape(), "moptd_kernel_records_lost_total") or 0.0
            if lost:
                break
            time.sleep(0.2)
        health = api_get(d, "/v1/health")
    finally:
        assert d.stop() == 0, d.log()[-3000:]
    # the flood went at least 10 records past the committed position before a new daemon
    # could read it: those are counted lost
    assert lost >= 10
    assert health["collectors"]["kernel"]["state"] == "ok"
