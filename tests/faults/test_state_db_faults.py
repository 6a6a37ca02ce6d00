"""The state directory's faults under a running daemon: a full file system and a findings
database corrupted while the daemon has it open. (A database corrupt at start is
tests/test_api.py::test_a_corrupt_database_is_moved_aside_and_the_daemon_runs_on.)

Findings come from real Xid 79 lines written to /dev/kmsg (each on a PCI address no real GPU
has), so these tests need root.

Full disk: state_dir is a small tmpfs of its own, filled once a first finding is committed.
The daemon keeps serving and diagnosing (a second GPU_LOST appears in the API and /metrics),
says the store is failing (moptd_findings_store_ok 0, /v1/health "degraded"), the kernel
collector keeps working though it cannot save its position, and the finding committed
before the disk filled is still in the database afterwards, where a restarted daemon finds
it. When the disk frees up while the daemon runs, the database goes back to its file within
its retry backoff (first try 10 s after the failure) with what it recorded in memory, and a
restarted daemon finds every finding and event once.

Corrupted while running: the database file is overwritten with garbage under the daemon.
It keeps serving and diagnosing in memory and reports the store failing; on restart the
corrupt file is moved aside (kept for a post-mortem) and a new one started.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from moptd.findings.db import FILE_NAME
from tests.api_helpers import kmsg_writable, write_xid79
from tests.daemon_proc import DaemonProcess
from tests.faults.conftest import (
    api_get,
    assert_serving,
    metric_value,
    start_daemon,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(not kmsg_writable(), reason="needs a writable /dev/kmsg (root)"),
]

CONFIG = {"rules": {"interval": 0.2}, "collectors": {"kernel": {"interval": 0.5}}}


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted on `path` (made here), unmounted afterwards; skips when not
    root (mount needs it; CI runs as root) or when the mount is refused (no CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    path.mkdir(parents=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0750", "tmpfs", str(path)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the file system is full."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def gpu_lost(d: DaemonProcess) -> str:
    """Write an Xid 79 and wait for its GPU_LOST finding in /metrics; its subject."""
    _, bus = write_xid79()
    subject = f"gpu:{bus}"
    wait_for(
        lambda: metric_value(assert_serving(d), "moptd_finding_active",
                             code="GPU_LOST", subject=subject) == 1.0,
        timeout=15, step=0.1,
    )
    return subject


def db_subjects(path: Path) -> set[str]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        return {r[0] for r in db.execute("SELECT subject FROM findings WHERE code = 'GPU_LOST'")}


def history_subjects(d: DaemonProcess) -> set[str]:
    body = api_get(d, "/v1/findings?code=GPU_LOST")
    return {f["subject"] for f in body["history"]}


def test_a_full_state_filesystem_keeps_findings_flowing_and_loses_nothing_committed(tmp_path):
    with small_tmpfs(tmp_path / "d" / "state", "2m") as state:
        d = start_daemon(tmp_path / "d", CONFIG)
        try:
            wait_for(lambda: api_get(d, "/v1/health")["collectors"]["kernel"]["runs"] > 0)
            before = gpu_lost(d)
            # committed: on disk, read by a separate connection
            wait_for(lambda: before in db_subjects(state / FILE_NAME), timeout=10)

            filler = fill(state)
            after = gpu_lost(d)  # diagnosed while the disk is full
            text = wait_for(
                lambda: (t := assert_serving(d))
                and metric_value(t, "moptd_findings_store_ok") == 0.0 and t,
                timeout=10,
            )
            # a few kernel passes, each with new records, so each tries to save the
            # kernel-log position
            for _ in range(3):
                runs = api_get(d, "/v1/health")["collectors"]["kernel"]["runs"]
                with open("/dev/kmsg", "w") as kmsg:
                    kmsg.write("<6>moptd-test: a record to move the kernel-log position\n")
                wait_for(
                    lambda r=runs: api_get(d, "/v1/health")["collectors"]["kernel"]["runs"] > r,
                    timeout=10,
                )
            text = assert_serving(d)
            health = api_get(d, "/v1/health")
            assert health["status"] == "degraded"
            assert health["findings_store"]["state"] == "failing"
            assert "full" in health["findings_store"]["reason"].lower()
            # both findings in the API, the later one from the in-memory store
            assert {before, after} <= history_subjects(d)
            assert metric_value(text, "moptd_finding_active", subject=before) == 1.0
            # the kernel collector keeps working though it cannot save its position
            assert health["collectors"]["kernel"]["state"] == "ok", health["collectors"]
            assert metric_value(text, "moptd_collector_success", collector="kernel") == 1.0
        finally:
            rc = d.stop()
        assert rc == 0, d.log()[-3000:]
        log = d.log()
        assert "Traceback" not in log, log[-3000:]
        # the kernel-log position is in the findings database now, committed with its
        # events: it fails (and is kept in memory) with the database, no file of its own
        assert "findings database failing, keeping findings in memory" in log

        filler.unlink()
        assert before in db_subjects(state / FILE_NAME), "committed before the disk filled"

        # a new daemon on the same state finds it
        d2 = start_daemon(tmp_path / "d", CONFIG)
        try:
            assert before in history_subjects(d2)
            assert api_get(d2, "/v1/health")["findings_store"]["state"] == "ok"
        finally:
            d2.stop()


def db_rows(path: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return [tuple(r) for r in db.execute(sql, args)]


def test_a_full_state_filesystem_that_frees_up_gets_back_what_was_kept_in_memory(tmp_path):
    with small_tmpfs(tmp_path / "d" / "state", "2m") as state:
        db_path = state / FILE_NAME
        d = start_daemon(tmp_path / "d", CONFIG)
        try:
            wait_for(lambda: api_get(d, "/v1/health")["collectors"]["kernel"]["runs"] > 0)
            before = gpu_lost(d)
            wait_for(lambda: before in db_subjects(db_path), timeout=10)

            filler = fill(state)
            during = gpu_lost(d)  # diagnosed while the disk is full, kept in memory
            wait_for(
                lambda: metric_value(assert_serving(d), "moptd_findings_store_ok") == 0.0,
                timeout=10,
            )
            assert api_get(d, "/v1/health")["status"] == "degraded"
            assert during not in db_subjects(db_path)

            filler.unlink()
            # the first try is 10 s after the failed write, the next 20 s after that
            wait_for(
                lambda: metric_value(assert_serving(d), "moptd_findings_store_ok") == 1.0,
                timeout=45,
                step=0.5,
            )
            health = api_get(d, "/v1/health")
            assert health["status"] == "ok", health
            assert health["findings_store"]["state"] == "ok", health["findings_store"]
            assert {before, during} <= db_subjects(db_path)
            after = gpu_lost(d)  # on the file again
            wait_for(lambda: after in db_subjects(db_path), timeout=10)
        finally:
            rc = d.stop()
        assert rc == 0, d.log()[-3000:]
        log = d.log()
        assert "Traceback" not in log, log[-3000:]
        assert "findings database failing, keeping findings in memory" in log
        assert log.count("is written to disk again") == 1, log[-3000:]

        subjects = (before, during, after)
        for subject in subjects:
            assert db_rows(
                db_path,
                "SELECT state FROM findings WHERE code = 'GPU_LOST' AND subject = ?",
                subject,
            ) == [("firing",)], subject
            assert db_rows(
                db_path,
                "SELECT count(*) FROM events WHERE stream = 'kernel.xid' AND subject = ?",
                subject,
            ) == [(1,)], subject

        # the restart: a new daemon on the same state finds all three, once each
        d2 = start_daemon(tmp_path / "d", CONFIG)
        try:
            assert api_get(d2, "/v1/health")["findings_store"]["state"] == "ok"
            history = api_get(d2, "/v1/findings?code=GPU_LOST")["history"]
            seen = [f["subject"] for f in history if f["subject"] in subjects]
            assert sorted(seen) == sorted(subjects), history
            for subject in subjects:
                # restored at start; /metrics shows them once the first rule tick has run
                wait_for(
                    lambda s=subject: metric_value(
                        assert_serving(d2), "moptd_finding_active", subject=s
                    )
                    == 1.0,
                    timeout=10,
                )
        finally:
            assert d2.stop() == 0, d2.log()[-3000:]
        for subject in subjects:
            assert db_rows(
                db_path,
                "SELECT count(*) FROM events WHERE stream = 'kernel.xid' AND subject = ?",
                subject,
            ) == [(1,)], f"{subject}: the restarted daemon read its Xid again"


def test_a_database_corrupted_under_the_running_daemon(tmp_path):
    d = start_daemon(tmp_path / "d", CONFIG)
    db_path = d.state_dir / FILE_NAME
    try:
        wait_for(lambda: api_get(d, "/v1/health")["collectors"]["kernel"]["runs"] > 0)
        first = gpu_lost(d)
        wait_for(lambda: first in db_subjects(db_path), timeout=10)

        # garbage over the whole file, header included, as a broken disk or a stray
        # `dd` would leave it; the WAL goes too
        size = db_path.stat().st_size
        with db_path.open("r+b") as fh:
            fh.write(os.urandom(size))
            fh.flush()
            os.fsync(fh.fileno())
        for side in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError), open(f"{db_path}{side}", "r+b") as fh:
                fh.write(os.urandom(4096))

        second = gpu_lost(d)  # still diagnosed
        wait_for(
            lambda: metric_value(assert_serving(d), "moptd_findings_store_ok") == 0.0,
            timeout=10,
        )
        health = api_get(d, "/v1/health")
        assert health["status"] == "degraded"
        assert health["findings_store"]["state"] == "failing"
        assert second in history_subjects(d)
        assert_serving(d)
    finally:
        rc = d.stop()
    assert rc == 0, d.log()[-3000:]
    assert "findings database failing, keeping findings in memory" in d.log()

    # a restart moves the corrupt file aside, keeps it, and starts a new database
    d2 = start_daemon(tmp_path / "d", CONFIG)
    try:
        health = api_get(d2, "/v1/health")["findings_store"]
        assert health["state"] == "ok", health
        assert health["quarantined"], health
        assert Path(health["quarantined"][0]).exists()
        third = gpu_lost(d2)
        wait_for(lambda: third in db_subjects(db_path), timeout=10)
    finally:
        d2.stop()
