"""The findings database on a real SQLite file: persistence, WAL, modes, corruption,
a full database, a full file system that frees up again, retention, and a SIGKILL between
commits."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moptd.findings.db import (
    SCHEMA_VERSION,
    FindingsDB,
    Retention,
    open_read_only,
    transition_record,
)
from moptd.observations import Event
from tests.api_helpers import wait_for
from tests.faults.test_state_db_faults import fill, small_tmpfs


def tr(t, new, old="inactive", rule="gpu-lost", subject="gpu:0", code="GPU_LOST", **finding):
    return transition_record(
        t, rule, subject, code, "critical", old, new, f"{subject} lost", finding or None
    )


def lifecycle(db, t0=1000.0, rule="gpu-lost", subject="gpu:0", resolve=True):
    db.record_transition(tr(t0, "pending", rule=rule, subject=subject))
    db.record_transition(
        tr(
            t0 + 1,
            "firing",
            "pending",
            rule=rule,
            subject=subject,
            evidence={"xids": 1},
            path=[f"{rule}/xid79"],
            actions=["reboot_node: systemctl reboot"],
            pci_bus_id="0000:3b:00.0",
        )
    )
    if resolve:
        db.record_transition(tr(t0 + 50, "resolved", "firing", rule=rule, subject=subject))


def test_a_finding_keeps_one_id_through_its_transitions_and_survives_reopening(tmp_path):
    path = tmp_path / "findings.db"
    with FindingsDB(path) as db:
        lifecycle(db)
        lifecycle(db, t0=2000.0, resolve=False)
        db.flush()
    with FindingsDB(path) as db:
        history = db.history()
        assert [(f["state"], f["first_seen"]) for f in history] == [
            ("firing", 2001.0),
            ("resolved", 1001.0),
        ]
        old = db.get(history[1]["id"])
        assert old is not None
        assert [(x["from"], x["to"]) for x in old["transitions"]] == [
            ("inactive", "pending"),
            ("pending", "firing"),
            ("firing", "resolved"),
        ]
        assert old["resolved_at"] == 1050.0
        assert old["evidence"] == {"xids": 1}
        assert old["pci_bus_id"] == "0000:3b:00.0"
        assert [f["id"] for f in db.active()] == [history[0]["id"]]
        assert db.get(12345) is None


def test_file_is_wal_with_schema_version_and_stated_mode_whatever_the_umask(tmp_path):
    path = tmp_path / "findings.db"
    old = os.umask(0)
    try:
        with FindingsDB(path, file_mode=0o640) as db:
            lifecycle(db)
            db.flush()
            assert db.call(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
            for side in ("-wal", "-shm"):
                assert stat.S_IMODE(Path(f"{path}{side}").stat().st_mode) == 0o640
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_statements_run_on_the_database_thread_not_the_callers(tmp_path):
    with FindingsDB(tmp_path / "f.db") as db:
        name = db.call(lambda _c: threading.current_thread().name)
    assert name == "findings-db"
    assert name != threading.current_thread().name


def test_events_round_trip(tmp_path):
    ev = Event(
        "kernel.xid",
        "gpu:0",
        1234.5,
        {"code": 79, "pid": 42},
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=42, GPU has fallen off the bus.",
    )
    with FindingsDB(tmp_path / "f.db") as db:
        db.record_events([ev, Event("gpu.xid_event", "gpu:1", 1300.0, {"code": 48})])
        got = db.events(since=1200.0, stream="kernel.xid")
    assert got == [
        {
            "t": 1234.5,
            "stream": "kernel.xid",
            "subject": "gpu:0",
            "text": ev.text,
            "fields": {"code": 79, "pid": 42},
        }
    ]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.text(max_size=200),
    fields=st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=20), max_size=5),
    t=st.floats(min_value=0, max_value=4e9, allow_nan=False),
)
def test_any_event_text_and_fields_round_trip(tmp_path_factory, text, fields, t):
    with FindingsDB(None) as db:
        db.record_events([Event("kernel.xid", "gpu:0", t, fields, text)])
        (got,) = db.events()
    assert (got["t"], got["text"], got["fields"]) == (t, text, fields)


def test_filters(tmp_path):
    with FindingsDB(tmp_path / "f.db") as db:
        lifecycle(db)
        lifecycle(db, t0=3000.0, rule="host-swap", subject="node", resolve=False)
        db.flush()
        assert [f["subject"] for f in db.history(subject="node")] == ["node"]
        assert [f["rule"] for f in db.history(since=2500.0)] == ["host-swap"]
        assert db.history(code="ECC_UNCORRECTABLE") == []
        assert [f["state"] for f in db.history(state="resolved")] == ["resolved"]


def test_a_corrupt_file_is_moved_aside_and_a_new_one_started(tmp_path):
    path = tmp_path / "findings.db"
    path.write_bytes(b"this is not an SQLite database at all" * 100)
    with FindingsDB(path) as db:
        lifecycle(db)
        db.flush()
        assert len(db.history()) == 1
        health = db.health.as_dict()
    assert health["quarantined"], health
    moved = health["quarantined"][0]
    assert Path(moved).read_bytes().startswith(b"this is not")
    assert "corrupt" in health["reason"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_old_corrupt_copies_are_pruned_to_the_newest_three(tmp_path):
    path = tmp_path / "findings.db"
    for stamp in ("20261101T000000", "20261102T000000", "20261103T000000", "20261104T000000"):
        (tmp_path / f"findings.db.corrupt-{stamp}").write_bytes(b"old copy")
        (tmp_path / f"findings.db.corrupt-{stamp}-wal").write_bytes(b"old wal")
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    path.write_bytes(b"this is not an SQLite database at all" * 100)
    with FindingsDB(path) as db:
        db.flush()
        moved = db.health.as_dict()["quarantined"][0]
    left = sorted(p.name for p in tmp_path.glob("findings.db.corrupt-*") if "-wal" not in p.name)
    assert left == [
        "findings.db.corrupt-20261103T000000",
        "findings.db.corrupt-20261104T000000",
        Path(moved).name,
    ]
    assert not (tmp_path / "findings.db.corrupt-20261101T000000-wal").exists()
    assert victim.read_text() == "keep\n"


def test_a_full_database_keeps_running_in_memory_and_reports_failing(tmp_path):
    path = tmp_path / "findings.db"
    with FindingsDB(path) as db:
        lifecycle(db)
        db.flush()
        pages = db.call(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        db.call(lambda c: c.execute(f"PRAGMA max_page_count={pages}"))
        big = "x" * 20000
        db.record_events([Event("kernel.xid", "gpu:0", 1100.0 + i, {}, big) for i in range(50)])
        lifecycle(db, t0=5000.0, rule="host-swap", subject="node", resolve=False)
        db.flush()
        assert db.health.state == "failing"
        assert "full" in db.health.reason
        # what was on disk came along, and new writes still land
        assert {f["rule"] for f in db.history()} == {"gpu-lost", "host-swap"}
        assert len(db.events()) == 50
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT count(*) FROM findings").fetchone()[0] == 1
        conn.close()
    # max_page_count held only for the connection that failed: the last try at close opens
    # the file afresh, and what was kept in memory is written back
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM findings").fetchone()[0] == 2
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 50
    conn.close()


def fail_next_write(db):
    """Make the connection in use refuse to grow (SQLITE_FULL) and write until it does."""
    pages = db.call(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
    db.call(lambda c: c.execute(f"PRAGMA max_page_count={pages}"))
    db.record_events([Event("kernel.fill", "node", 9500.0 + i, {}, "x" * 20000) for i in range(5)])
    db.flush()
    assert db.health.state == "failing"


def test_rows_pruned_in_memory_are_pruned_in_the_file_when_it_comes_back(tmp_path):
    path = tmp_path / "findings.db"
    with FindingsDB(path, Retention(max_age=3600), retry=(1.0, 1.0)) as db:
        lifecycle(db, t0=1000.0)  # resolved long ago
        lifecycle(db, t0=9000.0, rule="host-swap", subject="node", resolve=False)
        db.record_events(
            [Event("kernel.xid", "gpu:0", 1000.0), Event("kernel.xid", "gpu:0", 9000.0)]
        )
        db.flush()
        fail_next_write(db)  # max_page_count holds for that connection only: the retry works
        assert db.prune(now=10000.0).result() == {"findings": 1, "events": 1}
        wait_for(lambda: db.health.state == "ok", timeout=10)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT rule, state FROM findings").fetchall() == [("host-swap", "firing")]
    assert conn.execute("SELECT count(*) FROM transitions").fetchone()[0] == 2
    assert [r[0] for r in conn.execute("SELECT t FROM events ORDER BY t")] == [
        9000.0,
        *(9500.0 + i for i in range(5)),
    ]
    conn.close()


def test_failing_again_soon_after_coming_back_goes_on_with_the_backoff(tmp_path):
    with FindingsDB(tmp_path / "findings.db", retry=(0.5, 5.0)) as db:
        lifecycle(db, resolve=False)
        db.flush()
        fail_next_write(db)
        wait_for(lambda: db.health.state == "ok", timeout=10)
        fail_next_write(db)  # on the reopened file, at once
        t0 = time.monotonic()
        wait_for(lambda: db.health.state == "ok", timeout=10)
        # twice the first wait, not the first wait again
        assert time.monotonic() - t0 >= 0.8


def test_a_file_replaced_while_failing_is_rewritten_from_memory(tmp_path, caplog):
    path = tmp_path / "findings.db"
    with FindingsDB(path, retry=(1.0, 1.0)) as db:
        lifecycle(db, resolve=False)
        db.flush()
        fail_next_write(db)
        # someone clears the state directory while the database is in memory
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        wait_for(lambda: db.health.state == "ok", timeout=10)
    assert any("all of it was rewritten" in r.getMessage() for r in caplog.records)
    with FindingsDB(path) as db:
        assert [(f["rule"], f["state"]) for f in db.history()] == [("gpu-lost", "firing")]
        assert len(db.events()) == 5


def test_a_full_file_system_that_frees_up_loses_and_duplicates_nothing(tmp_path, caplog):
    """ok -> failing -> ok -> restart on a real full disk: a 1 MiB tmpfs filled with a file
    until SQLite's writes fail with SQLITE_FULL, then the file deleted."""
    caplog.set_level(logging.INFO, logger="moptd.findings.db")
    with small_tmpfs(tmp_path / "state", "1m") as state:
        path = state / "findings.db"
        with FindingsDB(path, retry=(0.2, 0.5)) as db:
            lifecycle(db, t0=1000.0, rule="before", subject="gpu:0", resolve=False)
            db.record_events(
                [Event("kernel.xid", "gpu:0", 1000.0 + i, {}, "before") for i in range(5)]
            )
            db.flush()
            assert db.health.state == "ok"

            filler = fill(state)
            # the WAL may still have room of its own: write until SQLite refuses
            filling = 0
            while db.health.state == "ok":
                assert filling < 500, "a full file system never refused a write"
                db.record_events([Event("kernel.fill", "node", 2000.0 + filling, {}, "f" * 4000)])
                db.flush()
                filling += 1
            assert "full" in db.health.reason, db.health.reason

            # while failing: a finding recorded before the disk filled resolves (a row that is
            # on disk changes), a new one fires, events arrive
            db.record_transition(tr(3000.0, "resolved", "firing", rule="before", subject="gpu:0"))
            lifecycle(db, t0=3100.0, rule="during", subject="gpu:1", resolve=False)
            db.record_events(
                [Event("kernel.xid", "gpu:1", 3100.0 + i, {}, "during") for i in range(5)]
            )
            db.flush()
            time.sleep(1.0)  # several tries, each refused while the filler is there
            assert db.health.state == "failing"

            filler.unlink()
            wait_for(lambda: db.health.state == "ok", timeout=10)
            assert db.health.reason == ""
            lifecycle(db, t0=4000.0, rule="after", subject="gpu:2", resolve=False)
            db.flush()
        carried = [
            r.getMessage() for r in caplog.records if "written to disk again" in r.getMessage()
        ]
        assert len(carried) == 1, carried
        assert "records kept in memory while it was failing carried back" in carried[0]
        assert "rewritten" not in carried[0], "the file was the one copied to memory"

        # the restart: a new FindingsDB on the same file
        with FindingsDB(path) as db:
            assert db.health.state == "ok"
            history = {f["rule"]: f for f in db.history()}
            assert len(db.history()) == 3
            assert {r: f["state"] for r, f in history.items()} == {
                "before": "resolved",
                "during": "firing",
                "after": "firing",
            }
            before = db.get(history["before"]["id"])
            assert before is not None
            assert [x["to"] for x in before["transitions"]] == ["pending", "firing", "resolved"]
            during = db.get(history["during"]["id"])
            assert during is not None
            assert [x["to"] for x in during["transitions"]] == ["pending", "firing"]
            events = db.events(limit=10000)
            assert [e["t"] for e in events] == sorted(
                [1000.0 + i for i in range(5)]
                + [2000.0 + i for i in range(filling)]
                + [3100.0 + i for i in range(5)]
            )
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM transitions").fetchone()[0] == 3 + 2 + 2
        conn.close()


def test_a_file_from_a_newer_moptd_is_left_alone(tmp_path):
    path = tmp_path / "findings.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with FindingsDB(path) as db:
        lifecycle(db)
        db.flush()
        assert db.health.state == "failing"
        assert "newer" in db.health.reason
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    conn.close()


def test_retention_by_age_keeps_open_findings(tmp_path):
    with FindingsDB(tmp_path / "f.db", Retention(max_age=3600)) as db:
        lifecycle(db, t0=1000.0)
        lifecycle(db, t0=1000.0, rule="host-swap", subject="node", resolve=False)
        db.record_events(
            [Event("kernel.xid", "gpu:0", 1000.0), Event("kernel.xid", "gpu:0", 9000.0)]
        )
        removed = db.prune(now=10000.0).result()
        assert removed == {"findings": 1, "events": 1}
        assert [f["rule"] for f in db.history()] == ["host-swap"]


def test_retention_by_size(tmp_path):
    limit = 200_000
    with FindingsDB(tmp_path / "f.db", Retention(max_bytes=limit)) as db:
        for batch in range(10):
            db.record_events(
                [
                    Event("kernel.xid", "gpu:0", batch * 100.0 + i, {}, "y" * 1000)
                    for i in range(100)
                ]
            )
        lifecycle(db, resolve=False)
        db.flush()
        assert db.size() > limit
        db.prune(now=2000.0).result()
        assert db.size() <= limit
        kept = db.events(limit=10000)
        assert kept, "pruning by size drops the oldest, not everything"
        assert kept[-1]["t"] == 999.0
        assert len(db.active()) == 1


def test_read_only_reader_sees_what_the_writer_committed(tmp_path):
    path = tmp_path / "f.db"
    assert open_read_only(path) is None
    with FindingsDB(path) as db:
        lifecycle(db, resolve=False)
        db.flush()
        conn = open_read_only(path)
        assert conn is not None
        assert conn.execute("SELECT state FROM findings").fetchone()[0] == "firing"
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("DELETE FROM findings")
        conn.close()


def test_sigkill_loses_no_committed_transition(tmp_path):
    path = tmp_path / "f.db"
    script = textwrap.dedent(f"""
        import os, signal, sys
        from moptd.findings.db import FindingsDB, transition_record
        db = FindingsDB(__import__("pathlib").Path({str(path)!r})).open()
        for i in range(200):
            fut = db.record_transition(transition_record(
                1000.0 + i, "r", f"gpu:{{i}}", "GPU_LOST", "critical", "inactive", "pending"))
        fut.result()
        print("committed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.strip() == "committed"
    with FindingsDB(path) as db:
        assert len(db.history(limit=1000)) == 200
