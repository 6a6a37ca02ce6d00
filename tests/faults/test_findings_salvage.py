"""A findings database found corrupt at start keeps what still reads (issue 18, item 11).

The database is a real file that moptd's FindingsDB wrote (a firing GPU_LOST finding, the
Xid 79 events behind it with their kernel-log positions), closed and then damaged on disk
the way a failing disk or a stray write damages it: pages overwritten in place. On the next
open it is moved aside as before, and now the rows that still read are in the new file:
the firing finding comes back. Where events were lost the kernel-log position is not
carried over, so the kernel collector reads the ring from its start and the Xid lines it
still holds are diagnosed again; where they all read, the position is kept.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from moptd.findings.db import FILE_NAME, FindingsDB, transition_record
from moptd.findings.salvage import TABLES, salvage
from moptd.kernel.kmsg import POSITION_FIELD
from moptd.observations import Event

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kmsg-restart" / "xid79.txt"
XID79 = FIXTURE.read_text().strip()
BOOT = "5e1e4c1a-2b7f-4c39-9d4e-0a8b1f3c2d11"
EVENTS = 600


def tr(t: float, new: str, old: str) -> dict[str, object]:
    return transition_record(
        t,
        "gpu-lost",
        "gpu:0",
        "GPU_LOST",
        "critical",
        old,
        new,
        "gpu:0 fell off the bus",
        {"path": ["gpu-lost/xid79"], "evidence": {"xids": 1}},
    )


def written_db(state: Path) -> Path:
    """A database as the daemon leaves it: a firing finding and the events before it."""
    state.mkdir()
    path = state / FILE_NAME
    with FindingsDB(path) as db:
        db.record_events(
            Event(
                "kernel.xid",
                "gpu:0",
                1000.0 + i,
                {"xid": 79, POSITION_FIELD: {"source": "kmsg", "boot_id": BOOT, "seq": 100 + i}},
                XID79,
            )
            for i in range(EVENTS)
        )
        db.record_transition(tr(2000.0, "pending", "inactive"))
        db.record_transition(tr(2001.0, "firing", "pending"))
        db.flush()
        assert db.load_position("kmsg") is not None
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    return path


def pages(path: Path) -> list[tuple[int, bytes]]:
    data = path.read_bytes()
    size = int.from_bytes(data[16:18], "big") or 65536
    return [(n, data[n * size : (n + 1) * size]) for n in range(len(data) // size)]


def overwrite_page(path: Path, number: int) -> None:
    size = len(pages(path)[0][1])
    with path.open("r+b") as fh:
        fh.seek(number * size)
        fh.write(b"\xa5" * size)


def event_leaf_pages(path: Path) -> list[int]:
    # a table b-tree leaf (type 0x0d) that holds the events' text
    return [n for n, p in pages(path) if n > 0 and p[0] == 0x0D and b"GPU has fallen" in p]


def event_index_pages(path: Path) -> list[int]:
    # an index b-tree leaf (0x0a) of events(stream, t): the stream names, no text
    return [
        n
        for n, p in pages(path)
        if n > 0 and p[0] == 0x0A and b"kernel.xid" in p and b"GPU has fallen" not in p
    ]


def reopened(path: Path) -> tuple[list[dict[str, object]], int, object, dict[str, object]]:
    with FindingsDB(path) as db:
        active = db.call(
            lambda c: [dict(r) for r in c.execute("SELECT * FROM findings WHERE state='firing'")]
        )
        events = db.call(lambda c: c.execute("SELECT count(*) FROM events").fetchone()[0])
        return active, int(events), db.load_position("kmsg"), db.health.as_dict()


def test_lost_events_keep_the_firing_finding_and_read_the_kernel_ring_again(tmp_path):
    path = written_db(tmp_path / "state")
    leaves = event_leaf_pages(path)
    assert len(leaves) > 4, leaves
    overwrite_page(path, leaves[len(leaves) // 2])
    active, events, position, health = reopened(path)
    assert [(f["rule"], f["subject"], f["code"]) for f in active] == [
        ("gpu-lost", "gpu:0", "GPU_LOST")
    ]
    assert 0 < events < EVENTS
    # events were lost: the kernel collector reads the ring from its start again
    assert position is None
    assert health["quarantined"], health
    assert "salvaged 1 findings" in str(health["reason"]), health
    assert "read again from its start" in str(health["reason"]), health


def test_a_damaged_index_loses_nothing_and_keeps_the_position(tmp_path):
    path = written_db(tmp_path / "state")
    index = event_index_pages(path)
    assert index, "no index page of events(stream, t)"
    overwrite_page(path, index[0])
    assert sqlite3.connect(path).execute("PRAGMA quick_check").fetchone()[0] != "ok"
    active, events, position, health = reopened(path)
    assert len(active) == 1
    assert events == EVENTS
    assert position is not None
    assert position.seq == 100 + EVENTS - 1
    assert "log positions kept" in str(health["reason"]), health


def test_a_file_that_is_no_database_salvages_nothing_and_reads_the_ring_again(tmp_path):
    path = written_db(tmp_path / "state")
    overwrite_page(path, 0)
    active, events, position, health = reopened(path)
    assert (active, events, position) == ([], 0, None)
    assert "nothing salvaged" in str(health["reason"]), health


def test_every_page_overwritten_in_turn_never_raises(tmp_path):
    """Whatever page is hit, salvage copies what reads and raises nothing."""
    path = written_db(tmp_path / "state")
    original = path.read_bytes()
    for number, _ in pages(path):
        path.write_bytes(original)
        overwrite_page(path, number)
        new = sqlite3.connect(":memory:", isolation_level=None)
        with FindingsDB(None) as mem:
            schema = mem.call(
                lambda c: [r[0] for r in c.execute("SELECT sql FROM sqlite_master") if r[0]]
            )
        for sql in schema:
            new.execute(sql)
        new.execute("PRAGMA foreign_keys=ON")
        out = salvage(path, new)
        copied = new.execute("SELECT count(*) FROM events").fetchone()[0]
        assert copied == out.copied.get("events", 0)
        assert copied <= EVENTS
        new.close()


def test_a_new_file_that_refuses_writes_gets_nothing_and_nothing_raises(tmp_path):
    path = written_db(tmp_path / "state")
    overwrite_page(path, event_leaf_pages(path)[1])
    target = tmp_path / "new.db"
    with FindingsDB(target):
        pass  # a migrated, empty database
    new = sqlite3.connect(f"file:{target}?mode=ro", uri=True, isolation_level=None)
    out = salvage(path, new)
    assert out.copied == dict.fromkeys(TABLES, 0)
    assert out.skipped["findings"] >= 1
    assert not out.positions_kept
    new.close()
