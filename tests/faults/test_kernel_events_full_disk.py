"""A full state file system loses no kernel event (issue 30, item 7).

While the disk was full the findings database ran in memory, where every write after the
first that moved the kernel-log position failed ("UNIQUE constraint failed: changed.tbl,
changed.id": the change log's INSERT OR IGNORE trigger, overridden by the position's
upsert). The Xid events of the outage were rolled back with it while the kernel follower
read on past them, so they were gone for good: the rules saw them, the database never did.

Here real Xid 79 lines go to /dev/kmsg, several while the state tmpfs is full, with
other records between them so that the position moves on its own too. Once the disk frees
up, every one of them is in the file, once, and still once after a restart.
"""

from __future__ import annotations

import pytest

from moptd.findings.db import FILE_NAME, FindingsDB, LogPosition
from moptd.kernel.kmsg import POSITION_FIELD
from moptd.observations import Event
from tests.api_helpers import kmsg_writable
from tests.faults.conftest import api_get, assert_serving, metric_value, start_daemon, wait_for
from tests.faults.test_state_db_faults import CONFIG, db_rows, fill, gpu_lost, small_tmpfs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(not kmsg_writable(), reason="needs a writable /dev/kmsg (root)"),
]

DURING = 6  # Xids written while the disk is full


def xid_events(db_path, subject: str) -> int:
    rows = db_rows(
        db_path, "SELECT count(*) FROM events WHERE stream = 'kernel.xid' AND subject = ?", subject
    )
    return int(rows[0][0])  # type: ignore[call-overload]


def test_kernel_events_written_while_the_disk_is_full_are_all_kept(tmp_path):
    with small_tmpfs(tmp_path / "d" / "state", "2m") as state:
        db_path = state / FILE_NAME
        d = start_daemon(tmp_path / "d", CONFIG)
        try:
            wait_for(lambda: api_get(d, "/v1/health")["collectors"]["kernel"]["runs"] > 0)
            before = gpu_lost(d)
            wait_for(lambda: xid_events(db_path, before) == 1, timeout=10)

            filler = fill(state)
            during = []
            for _ in range(DURING):
                during.append(gpu_lost(d))  # each diagnosed, from the store
                runs = api_get(d, "/v1/health")["collectors"]["kernel"]["runs"]
                # a pass after the Xid: the position is saved on its own, too
                wait_for(
                    lambda r=runs: api_get(d, "/v1/health")["collectors"]["kernel"]["runs"] > r,
                    timeout=10,
                )
            assert api_get(d, "/v1/health")["findings_store"]["state"] == "failing"

            filler.unlink()
            wait_for(
                lambda: metric_value(assert_serving(d), "moptd_findings_store_ok") == 1.0,
                timeout=45,
                step=0.5,
            )
            kept = {s: xid_events(db_path, s) for s in [before, *during]}
            assert kept == dict.fromkeys(kept, 1), kept
        finally:
            rc = d.stop()
        assert rc == 0, d.log()[-3000:]
        log = d.log()
        assert "UNIQUE constraint" not in log, log[-3000:]
        assert "could not be stored" not in log, log[-3000:]

        # a restart resumes after the last of them: none read (and stored) again
        d2 = start_daemon(tmp_path / "d", CONFIG)
        try:
            wait_for(lambda: api_get(d2, "/v1/health")["collectors"]["kernel"]["runs"] > 0)
            assert_serving(d2)
        finally:
            assert d2.stop() == 0, d2.log()[-3000:]
        kept = {s: xid_events(db_path, s) for s in [before, *during]}
        assert kept == dict.fromkeys(kept, 1), kept


def test_a_position_never_passes_events_the_database_refused(tmp_path):
    """Whatever else refuses an event write (here SQLite itself, through a trigger that
    aborts it), the log's position stays at the last stored event for the rest of the run,
    and a position saved later alone does not pass it either."""

    def event(seq: int) -> Event:
        where = {"source": "kmsg", "boot_id": "b", "seq": seq, "cursor": ""}
        return Event("kernel.xid", "gpu:0000:01:00.0", 1.0, {POSITION_FIELD: where})

    # the trigger is in the file, so the copy in memory the database falls back to refuses
    # the write as well
    with FindingsDB(tmp_path / FILE_NAME, retry=(3600, 3600)) as db:
        db.record_events([event(10)]).result(10)
        assert db.load_position("kmsg") == LogPosition("kmsg", "b", 10, "")
        db.call(
            lambda c: c.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON events "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        )
        db.record_events([event(11)]).result(10)
        db.save_position("kmsg", "b", 12).result(10)
        assert db.load_position("kmsg") == LogPosition("kmsg", "b", 10, "")
        db.call(lambda c: c.execute("DROP TRIGGER refuse"))
        db.record_events([event(13)]).result(10)  # stored, but the position stays
        assert db.load_position("kmsg") == LogPosition("kmsg", "b", 10, "")
        assert db.call(lambda c: c.execute("SELECT count(*) FROM events").fetchone()[0]) == 2
