"""The findings database: SQLite in WAL mode in the state directory.

One *finding* row per incident of a (rule, subject) pair, from its first pending step until
it resolves (or goes inactive), with the finding's latest decision path, evidence and
actions; one *transition* row per state change; one *event* row per kernel/NVML event;
one *position* row per followed log (the kernel log's boot id and sequence number, or the
journal's cursor), written in the same transaction as the events it covers (an event
carries its record's position in ``fields["log_position"]``), so that after a SIGKILL the
log is read again from exactly where the stored events end.

Every statement runs on one dedicated thread: the event loop only queues work, and a slow
or full disk never stalls collection. Each transition is its own transaction, so a
SIGKILL loses none that was committed. A corrupt file is moved aside and a new one
started; when the disk refuses writes the database carries on in memory and reports itself
failing, so the daemon keeps diagnosing, and tries the file again on a backoff: once the
file takes writes, what was recorded in memory is written back to it (see `_recover`) and
the database runs on the file again.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import queue
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from moptd import safefs
from moptd.findings import boards
from moptd.findings.salvage import salvage
from moptd.kernel.kmsg import POSITION_FIELD
from moptd.observations import Event

log = logging.getLogger(__name__)

T = TypeVar("T")

FILE_NAME = "findings.db"
OPEN_STATES = ("pending", "firing")

# Migrations: MIGRATIONS[n] takes the schema from version n to n + 1. Append only.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE findings (
        id INTEGER PRIMARY KEY,
        rule TEXT NOT NULL,
        subject TEXT NOT NULL,
        code TEXT NOT NULL,
        severity TEXT NOT NULL,
        state TEXT NOT NULL,
        summary TEXT NOT NULL DEFAULT '',
        pending_since REAL,
        first_seen REAL,
        last_seen REAL,
        resolved_at REAL,
        updated_at REAL NOT NULL,
        pci_bus_id TEXT,
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX findings_open ON findings(state);
    CREATE INDEX findings_key ON findings(rule, subject);
    CREATE INDEX findings_updated ON findings(updated_at);
    CREATE TABLE transitions (
        id INTEGER PRIMARY KEY,
        finding_id INTEGER NOT NULL REFERENCES findings(id) ON DELETE CASCADE,
        t REAL NOT NULL,
        old TEXT NOT NULL,
        new TEXT NOT NULL,
        summary TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX transitions_finding ON transitions(finding_id);
    CREATE INDEX transitions_t ON transitions(t);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        t REAL NOT NULL,
        stream TEXT NOT NULL,
        subject TEXT NOT NULL,
        text TEXT NOT NULL DEFAULT '',
        fields TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_t ON events(t);
    CREATE INDEX events_stream ON events(stream, t);
    """,
    """
    CREATE TABLE positions (
        id INTEGER PRIMARY KEY,
        source TEXT NOT NULL UNIQUE,
        boot_id TEXT NOT NULL DEFAULT '',
        seq INTEGER,
        cursor TEXT NOT NULL DEFAULT '',
        updated_at REAL NOT NULL
    );
    """,
    # The remediation audit trail (moptd.daemon.remediation): one row per remedy the
    # policy chose, whatever came of it. finding_id is no foreign key: the audit outlives
    # a finding pruned by age.
    """
    CREATE TABLE remediations (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,
        t REAL NOT NULL,
        finished_at REAL,
        finding_id INTEGER,
        rule TEXT NOT NULL,
        subject TEXT NOT NULL,
        code TEXT NOT NULL,
        remedy TEXT NOT NULL,
        entry TEXT NOT NULL,
        actor TEXT NOT NULL,
        outcome TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX remediations_t ON remediations(t);
    CREATE INDEX remediations_finding ON remediations(finding_id);
    """,
    # The remediation guards' state that outlives a restart of moptd: per engine subject,
    # the open circuit breaker (JSON, NULL while closed) and when an operator last closed
    # it (remedies before that no longer count for the breaker or the rate limit). The
    # remedies that ran are the audit rows themselves.
    """
    CREATE TABLE remediation_state (
        id INTEGER PRIMARY KEY,
        subject TEXT NOT NULL UNIQUE,
        suspended TEXT,
        reset_at REAL,
        updated_at REAL NOT NULL
    );
    """,
    # Each board's hardware faults, by serial (moptd.findings.boards): written with the
    # transition that fired the finding; finding_id is no foreign key, the history outlives
    # findings pruned by age.
    boards.SCHEMA,
)
SCHEMA_VERSION = len(MIGRATIONS)
TABLES = (  # parents first
    "findings",
    "transitions",
    "events",
    "positions",
    "remediations",
    "remediation_state",
    "board_faults",
)


# While in memory after a failed write, the file is tried again after RETRY_FIRST seconds,
# then twice as long after each failure, up to RETRY_MAX. A full disk is usually freed by a
# person or a log rotation within minutes: 10 s returns quickly after that, and 5 min keeps
# a disk that stays full from costing an open, an integrity check and a failed transaction
# more than a few times an hour.
RETRY_FIRST = 10.0
RETRY_MAX = 300.0


SQLITE_INT_MAX = 2**63 - 1  # a larger seq cannot be stored (a kernel's never is)


@dataclass(frozen=True, slots=True)
class LogPosition:
    source: str  # kmsg | journal
    boot_id: str
    seq: int | None  # the last kmsg record covered; None: none of this boot yet
    cursor: str = ""  # the journal entry last covered


def log_position_of(ev: Event) -> LogPosition | None:
    """The position an event carries (see POSITION_FIELD); None when it carries none or
    one that is malformed (then the log is read again from the last good one)."""
    raw = ev.fields.get(POSITION_FIELD)
    if not isinstance(raw, Mapping):
        return None
    source, boot_id, seq, cursor = (raw.get(k) for k in ("source", "boot_id", "seq", "cursor"))
    if not isinstance(source, str) or not source or not isinstance(boot_id, str):
        return None
    if seq is not None and (
        not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= SQLITE_INT_MAX
    ):
        return None
    return LogPosition(source, boot_id, seq, cursor if isinstance(cursor, str) else "")


@dataclass(frozen=True, slots=True)
class RemediationState:
    """What the remediation guards of one engine resume from (FindingsDB.resume_remediation)."""

    suspended: dict[str, Any] | None  # the open circuit breaker: since, reason, code
    reset_at: float | None  # when an operator last closed it
    acted: list[float]  # when each remedy that ran was decided, oldest first
    interrupted: list[dict[str, Any]]  # audit rows reconciled from `verifying`: key, remedy,
    # code, subject, t


class SchemaTooNew(Exception):
    """The file was written by a newer moptd; it is left alone, not migrated down."""


@dataclass(frozen=True, slots=True)
class Retention:
    max_age: float = 30 * 86400.0
    max_bytes: int = 256 * 2**20


@dataclass(slots=True)
class StoreHealth:
    state: str = "ok"  # ok | failing (running in memory)
    reason: str = ""
    path: str = ""
    quarantined: list[str] | None = None
    writes: int = 0
    write_errors: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "path": self.path,
            "quarantined": list(self.quarantined or []),
            "writes": self.writes,
            "write_errors": self.write_errors,
        }


def transition_record(
    t: float,
    rule: str,
    subject: str,
    code: str,
    severity: str,
    old: str,
    new: str,
    summary: str = "",
    finding: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The plain form of a transition the database takes; `finding` is Finding.to_json()
    (or the subset known) at the time of the change."""
    return {
        "t": t,
        "rule": rule,
        "subject": subject,
        "code": code,
        "severity": severity,
        "old": old,
        "new": new,
        "summary": summary,
        "finding": dict(finding or {}),
    }


def _json(v: object) -> str:
    return json.dumps(v, default=str, sort_keys=True)


def _open(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _migrate(conn: sqlite3.Connection) -> None:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"schema version {version} is newer than this moptd's {SCHEMA_VERSION}")
    for n in range(version, SCHEMA_VERSION):
        conn.executescript(f"BEGIN;\n{MIGRATIONS[n]}\nPRAGMA user_version={n + 1};\nCOMMIT;")


class FindingsDB:
    def __init__(
        self,
        path: Path | None,
        retention: Retention | None = None,
        file_mode: int = 0o640,
        retry: tuple[float, float] = (RETRY_FIRST, RETRY_MAX),
    ) -> None:
        """`path` None: memory only (`moptd explain --offline`, tests). `retry`: the first
        and the longest wait before the file is tried again after a failed write."""
        self.path = path
        self.retention = retention or Retention()
        self.file_mode = file_mode
        self.retry_first, self.retry_max = retry
        # set while in memory with a faithful copy of the file and a log of what changed
        # since (see _fallback): when the file is tried again, and the next wait
        self._retry_at: float | None = None
        self._retry_wait = self.retry_first
        self._recovered_at: float | None = None
        # rows per table, and their largest id, in the file when it was copied to memory
        self._base: dict[str, tuple[int, int]] = {}
        self.health = StoreHealth(path=str(path) if path else ":memory:")
        # logs whose events failed to store: their positions are not moved on (_write)
        self._held: set[str] = set()
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._conn: sqlite3.Connection | None = None
        self._thread = threading.Thread(target=self._run, name="findings-db", daemon=True)
        self._started = False
        self._closed = False

    # --- lifecycle ---

    def open(self) -> FindingsDB:
        self._thread.start()
        self._started = True
        self._exec(self._connect).result(60)
        return self

    def close(self) -> None:
        if not self._started or self._closed:
            return
        self._closed = True
        self._exec(self._disconnect).result(30)
        self._queue.put(None)
        self._thread.join(10)

    def __enter__(self) -> FindingsDB:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            timeout = None
            if self._retry_at is not None:
                timeout = max(0.0, self._retry_at - time.monotonic())
            try:
                job = self._queue.get(timeout=timeout)
            except queue.Empty:
                job = _no_job
            if job is None:
                return
            job()
            # also under a steady stream of writes, which never leaves the queue empty
            if self._retry_at is not None and time.monotonic() >= self._retry_at:
                self._recover()

    def _exec(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def job() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

        self._queue.put(job)
        return fut

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise sqlite3.ProgrammingError("findings database is not open")
        return self._conn

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> concurrent.futures.Future[T]:
        """Run fn(connection) on the database thread."""
        return self._exec(lambda: fn(self._require()))

    def call(self, fn: Callable[[sqlite3.Connection], T], timeout: float = 30.0) -> T:
        return self.submit(fn).result(timeout)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued so far is written."""
        self.call(lambda _c: None, timeout)

    # --- on the database thread ---

    def _connect(self) -> None:
        if self.path is None:
            self._conn = self._memory()
            return
        try:
            self._conn = self._open_file(self.path)
        except (sqlite3.Error, SchemaTooNew, OSError) as exc:
            reason: Exception = exc
            if isinstance(exc, sqlite3.DatabaseError) and not isinstance(
                exc, sqlite3.OperationalError
            ):
                moved = self._quarantine(self.path, str(exc))
                try:
                    self._conn = self._open_file(self.path)
                    saved = salvage(Path(moved), self._conn).summary()
                    self.health.reason += f"; {saved}"
                    log.error(
                        "findings database %s was corrupt (%s); moved to %s; %s",
                        self.path,
                        exc,
                        moved,
                        saved,
                    )
                    return
                except (sqlite3.Error, OSError) as exc2:
                    reason = exc2
            self._fail(f"cannot open {self.path}: {reason}")
            self._conn = self._memory()

    def _open_file(self, path: Path) -> sqlite3.Connection:
        # a directory others can write could hold their links where SQLite opens by name
        safefs.ensure_private_dir(path.parent, 0o750)
        safefs.create_file(path, self.file_mode)  # the stated mode, whatever the umask
        safefs.set_mode(path, self.file_mode)
        conn = _open(str(path))
        try:
            # only takes effect on a new file, and only before journal_mode writes the header
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("findings database %s: journal mode %s, not WAL", path, mode)
            conn.execute("PRAGMA synchronous=NORMAL")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {check}")
            _migrate(conn)
        except BaseException:
            conn.close()
            raise
        for suffix in ("-wal", "-shm"):
            side = Path(f"{path}{suffix}")
            if side.exists():
                safefs.set_mode(side, self.file_mode)
        return conn

    def _memory(self) -> sqlite3.Connection:
        conn = _open(":memory:")
        _migrate(conn)
        return conn

    def _quarantine(self, path: Path, why: str) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = f"{path}.corrupt-{stamp}"
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{path}{suffix}")
            if src.exists():
                os.replace(src, f"{target}{suffix}")
        self.health.quarantined = [*(self.health.quarantined or []), target]
        self.health.reason = f"corrupt database moved to {target}: {why}"
        _prune_quarantine(path)
        return target

    def _fail(self, reason: str) -> None:
        if self.health.state != "failing":
            log.error("findings database failing, keeping findings in memory: %s", reason)
        self.health.state = "failing"
        self.health.reason = reason

    def _fallback(self, exc: sqlite3.Error) -> None:
        """Carry what is on disk over to memory and go on there; when the copy is whole,
        log every row changed from then on, so that the file can be brought up to date
        when it takes writes again."""
        self._fail(f"write failed: {exc}")
        old = self._conn
        mem = _open(":memory:")
        try:
            if old is not None:
                old.backup(mem)
                old.close()
            self._base = _table_sizes(mem)
            _log_changes(mem)
        except sqlite3.Error as copy_exc:
            # without a faithful copy the memory's row ids are not the file's: nothing can
            # be written back, and the file is left as it is (as when it cannot be opened)
            log.error("cannot copy the findings database to memory: %s", copy_exc)
            mem.close()
            mem = self._memory()
            self._conn = mem
            return
        self._conn = mem
        now = time.monotonic()
        if self._recovered_at is not None and now - self._recovered_at < self.retry_max:
            # failing again soon after coming back (a disk hovering at full): the backoff
            # goes on from where it was, so that it does not flap every RETRY_FIRST seconds,
            # each time with a copy of the whole file to memory
            self._retry_wait = min(self._retry_wait * 2, self.retry_max)
        else:
            self._retry_wait = self.retry_first
        self._retry_at = now + self._retry_wait

    def _recover(self) -> bool:
        """Try the file again: bring it up to date with the memory database in one
        transaction and go on with it; on failure try again later. True when recovered.

        The changed rows are written through SQLite into the file as it is, rather than a
        backup of the memory database into a new file renamed over it: the rename would pair
        the new file with the old file's -wal and -shm (whose frames SQLite would replay
        over it), leave a reader with the old file open on a stale copy, and need room for
        a whole copy on a disk that was just full. One transaction in WAL mode is atomic and
        survives a crash, and needs room only for what changed."""
        assert self.path is not None
        assert self._conn is not None
        mem = self._conn
        try:
            disk = self._open_file(self.path)
        except (sqlite3.Error, SchemaTooNew, OSError) as exc:
            self._retry_later(f"cannot open it: {exc}")
            return False
        try:
            whole = _table_sizes(disk) != self._base
            with _transaction(disk):
                counts = _copy_changes(mem, disk, whole)
        except sqlite3.Error as exc:
            if disk.in_transaction:
                disk.execute("ROLLBACK")
            disk.close()
            self._retry_later(f"cannot write it: {exc}")
            return False
        mem.close()
        self._conn = disk
        self._retry_at = None
        self._recovered_at = time.monotonic()
        self._base = {}
        self.health.state = "ok"
        self.health.reason = ""
        log.warning(
            "findings database %s is written to disk again: %d records kept in memory while "
            "it was failing carried back (%s)%s",
            self.path,
            sum(counts.values()),
            ", ".join(f"{n} {t}" for t, n in counts.items()),
            "; the file had changed, so all of it was rewritten" if whole else "",
        )
        return True

    def _retry_later(self, why: str) -> None:
        self._retry_wait = min(self._retry_wait * 2, self.retry_max)
        self._retry_at = time.monotonic() + self._retry_wait
        log.info(
            "findings database %s still failing (%s); next try in %g s",
            self.path,
            why,
            self._retry_wait,
        )

    def _disconnect(self) -> None:
        if self._retry_at is not None and not self._recover():
            # the last try, so that a disk freed since the one before keeps what is in memory
            log.error(
                "findings database %s closed while failing: what was recorded in memory since "
                "the disk refused writes is lost",
                self.path,
            )
            self._retry_at = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _write(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        """A write that never raises: on a disk error it is retried in memory."""
        self._stored(fn)

    def _stored(self, fn: Callable[[sqlite3.Connection], None]) -> bool:
        """_write, and whether it was stored (on disk or in memory)."""
        assert self._conn is not None
        try:
            with _transaction(self._conn):
                fn(self._conn)
            self.health.writes += 1
            return True
        except sqlite3.Error as exc:
            self.health.write_errors += 1
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            if self.health.state == "failing" and self.path is not None and self._conn_is_memory():
                log.error("findings database write failed in memory: %s", exc)
                return False
            self._fallback(exc)
        try:
            with _transaction(self._conn):
                fn(self._conn)
            self.health.writes += 1
            return True
        except sqlite3.Error as exc:
            if self._conn.in_transaction:  # else every later write fails to BEGIN
                self._conn.execute("ROLLBACK")
            log.error("findings database write failed in memory: %s", exc)
            return False

    def _hold_positions(self, sources: Iterable[str]) -> None:
        """Events of these logs were not stored: their positions stay where the last stored
        event left them, for the rest of this run, so that a restart reads them again (what
        is stored after this may then be stored twice; nothing the log still holds is lost)."""
        for source in sources:
            if source not in self._held:
                self._held.add(source)
                log.error(
                    "%s events could not be stored: its read position stays at the last "
                    "stored event until moptd restarts and reads the log again from there",
                    source,
                )

    def _conn_is_memory(self) -> bool:
        assert self._conn is not None
        row = self._conn.execute("PRAGMA database_list").fetchone()
        return not row["file"]

    # --- writing (from any thread; returns at once) ---

    def record_transition(self, tr: Mapping[str, Any]) -> concurrent.futures.Future[None]:
        rec = dict(tr)
        return self.submit(lambda _c: self._write(lambda c: _insert_transition(c, rec)))

    def record_events(self, events: Iterable[Event]) -> concurrent.futures.Future[None]:
        """The events, and the position of every log they came from, in one transaction."""
        rows = []
        positions: dict[str, LogPosition] = {}
        for ev in events:
            rows.append((ev.t, ev.stream, ev.subject, ev.text, _json(dict(ev.fields))))
            pos = log_position_of(ev)
            if pos is not None:
                positions[pos.source] = pos
        now = time.time()

        def write(c: sqlite3.Connection) -> None:
            _insert_events(c, rows)
            for pos in positions.values():
                if pos.source not in self._held:
                    _upsert_position(c, pos, now)

        def job(_c: sqlite3.Connection) -> None:
            # the position never passes an event that is not stored
            if not self._stored(write):
                self._hold_positions(positions)

        return self.submit(job)

    def save_position(
        self, source: str, boot_id: str, seq: int | None, cursor: str = ""
    ) -> concurrent.futures.Future[None]:
        """A log's position alone (at start, and when records brought no event). Queued
        after every write asked for before it, so it never runs ahead of their events."""
        pos = LogPosition(source, boot_id, seq, cursor)
        now = time.time()

        def write(c: sqlite3.Connection) -> None:
            if source not in self._held:
                _upsert_position(c, pos, now)

        return self.submit(lambda _c: self._write(write))

    def record_remediation(self, rec: Mapping[str, Any]) -> concurrent.futures.Future[None]:
        """One remedy's audit row, inserted or brought up to date by its `key`."""
        row = dict(rec)
        return self.submit(lambda _c: self._write(lambda c: _upsert_remediation(c, row)))

    def remediations(
        self, since: float | None = None, subject: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        return self.call(lambda c: query_remediations(c, since, subject, limit))

    def save_remediation_state(
        self, subject: str, suspended: Mapping[str, Any] | None, reset_at: float | None
    ) -> concurrent.futures.Future[None]:
        """The circuit breaker of one engine as it is now (moptd.daemon.remediation)."""
        state = (subject, None if suspended is None else _json(dict(suspended)), reset_at)
        now = time.time()
        return self.submit(
            lambda _c: self._write(lambda c: _upsert_remediation_state(c, *state, now))
        )

    def resume_remediation(
        self, subject: str, since: float, why: str, now: float
    ) -> concurrent.futures.Future[RemediationState]:
        """At start: the guards' state of one engine as the last moptd left it. Audit rows
        still `verifying` (moptd died while it waited for a remedy's finding to resolve)
        become `interrupted`, with `why`; they count as remedies that ran."""
        return self.submit(lambda c: self._resume(c, subject, since, why, now))

    def _resume(
        self, conn: sqlite3.Connection, subject: str, since: float, why: str, now: float
    ) -> RemediationState:
        interrupted: list[dict[str, Any]] = []

        def reconcile(c: sqlite3.Connection) -> None:
            rows = c.execute(
                "SELECT key, remedy, code, subject, t FROM remediations "
                "WHERE outcome = 'verifying' ORDER BY t, id"
            ).fetchall()
            interrupted.extend(dict(r) for r in rows)
            c.execute(
                "UPDATE remediations SET outcome = 'interrupted', reason = ?, finished_at = ? "
                "WHERE outcome = 'verifying'",
                (why, now),
            )

        self._write(reconcile)
        c = self._conn_or(conn)
        row = c.execute(
            "SELECT suspended, reset_at FROM remediation_state WHERE subject = ?", (subject,)
        ).fetchone()
        suspended = json.loads(row["suspended"]) if row is not None and row["suspended"] else None
        reset_at = row["reset_at"] if row is not None else None
        start = since if reset_at is None else max(since, float(reset_at))
        acted = [
            float(r[0])
            for r in c.execute(
                "SELECT t FROM remediations WHERE subject = ? AND t > ? AND outcome IN "
                "('verifying', 'done', 'dry-run', 'failed', 'interrupted') ORDER BY t",
                (subject, start),
            )
        ]
        return RemediationState(suspended, reset_at, acted, interrupted)

    def load_position(self, source: str) -> LogPosition | None:
        """The committed position of a log (blocking); None when none was committed."""
        return self.call(lambda c: _select_position(c, source))

    def prune(self, now: float | None = None) -> concurrent.futures.Future[dict[str, int]]:
        t = time.time() if now is None else now
        return self.submit(lambda c: self._prune(c, t))

    def _prune(self, conn: sqlite3.Connection, now: float) -> dict[str, int]:
        out = {"findings": 0, "events": 0}

        def by_age(c: sqlite3.Connection) -> None:
            horizon = now - self.retention.max_age
            out["events"] += c.execute("DELETE FROM events WHERE t < ?", (horizon,)).rowcount
            c.execute("DELETE FROM remediations WHERE t < ?", (horizon,))
            out["findings"] += c.execute(
                "DELETE FROM findings WHERE updated_at < ? AND state NOT IN (?, ?)",
                (horizon, *OPEN_STATES),
            ).rowcount

        self._write(by_age)
        # Over the size limit: drop the oldest quarter of events and closed findings until
        # under it (open findings are never dropped).
        for _ in range(40):
            if _size(self._conn_or(conn)) <= self.retention.max_bytes:
                break
            removed = 0

            def by_size(c: sqlite3.Connection) -> None:
                nonlocal removed
                n_ev = int(c.execute("SELECT count(*) FROM events").fetchone()[0])
                n_fi = int(
                    c.execute(
                        "SELECT count(*) FROM findings WHERE state NOT IN (?, ?)", OPEN_STATES
                    ).fetchone()[0]
                )
                d_ev = c.execute(
                    "DELETE FROM events WHERE id IN (SELECT id FROM events ORDER BY t LIMIT ?)",
                    (max(1, n_ev // 4),),
                ).rowcount
                d_fi = c.execute(
                    "DELETE FROM findings WHERE id IN (SELECT id FROM findings WHERE state "
                    "NOT IN (?, ?) ORDER BY updated_at LIMIT ?)",
                    (*OPEN_STATES, max(1, n_fi // 4)),
                ).rowcount
                out["events"] += d_ev
                out["findings"] += d_fi
                removed = d_ev + d_fi

            self._write(by_size)
            try:
                self._conn_or(conn).execute("PRAGMA incremental_vacuum")
                self._conn_or(conn).execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.warning("findings database: vacuum failed: %s", exc)
            if removed == 0:
                break
        return out

    def _conn_or(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        return self._conn if self._conn is not None else conn

    # --- reading (blocking; the API runs them through asyncio.wrap_future(submit)) ---

    def active(self) -> list[dict[str, Any]]:
        return self.call(active_findings)

    def history(self, **filters: Any) -> list[dict[str, Any]]:
        return self.call(lambda c: query_findings(c, **filters))

    def get(self, finding_id: int) -> dict[str, Any] | None:
        return self.call(lambda c: get_finding(c, finding_id))

    def events(
        self,
        since: float | None = None,
        stream: str | None = None,
        subject: str | None = None,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        return self.call(lambda c: query_events(c, since, stream, subject, limit))

    def board_facts(
        self, now: float, policy: boards.BoardPolicy, by_subject: Mapping[str, boards.Board]
    ) -> dict[str, boards.Facts]:
        return self.call(lambda c: boards.board_facts(c, now, policy, by_subject))

    def size(self) -> int:
        return self.call(_size)

    def status(self) -> dict[str, Any]:
        out = self.health.as_dict()
        out["schema_version"] = SCHEMA_VERSION
        try:
            out["bytes"] = self.size()
        except (sqlite3.Error, concurrent.futures.TimeoutError):
            out["bytes"] = None
        return out


class _transaction:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")


def _no_job() -> None:
    pass


def _table_sizes(conn: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    out = {}
    for table in TABLES:
        row = conn.execute(f"SELECT count(*), coalesce(max(id), 0) FROM {table}").fetchone()  # noqa: S608
        out[table] = (int(row[0]), int(row[1]))
    return out


def _log_changes(mem: sqlite3.Connection) -> None:
    """Note the id of every row inserted, updated or deleted in `mem` from now on (the
    triggers and their table live in the connection's temp schema, not in the file)."""
    mem.execute(
        "CREATE TEMP TABLE changed (tbl TEXT NOT NULL, id INTEGER NOT NULL, "
        "PRIMARY KEY (tbl, id)) WITHOUT ROWID"
    )
    for table in TABLES:
        for op, row in (("INSERT", "new"), ("UPDATE", "new"), ("DELETE", "old")):
            name = f"changed_{table}_{op.lower()}"
            # not INSERT OR IGNORE: in a trigger, an upsert's DO UPDATE (the log positions)
            # overrides the IGNORE, and the second change to a row failed the whole write
            # with "UNIQUE constraint failed: changed.tbl, changed.id" (issue 30, item 7)
            body = (
                f"INSERT INTO changed SELECT '{table}', {row}.id WHERE NOT EXISTS "  # noqa: S608
                f"(SELECT 1 FROM changed WHERE tbl = '{table}' AND id = {row}.id)"
            )
            mem.execute(f"CREATE TEMP TRIGGER {name} AFTER {op} ON main.{table} BEGIN {body}; END")


def _copy_changes(mem: sqlite3.Connection, disk: sqlite3.Connection, whole: bool) -> dict[str, int]:
    """Make `disk` hold what `mem` holds, by id: the rows logged as changed (all rows when
    `whole`: the file is no longer the one copied to memory). Rows written, per table."""
    counts: dict[str, int] = {}
    if whole:
        for table in reversed(TABLES):
            disk.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed names
    else:
        for table in reversed(TABLES):
            removed = f"SELECT id FROM temp.changed WHERE tbl = ? EXCEPT SELECT id FROM {table}"  # noqa: S608
            gone = [(r[0],) for r in mem.execute(removed, (table,))]
            disk.executemany(f"DELETE FROM {table} WHERE id = ?", gone)  # noqa: S608
    for table in TABLES:
        cols = [r[1] for r in mem.execute(f"PRAGMA main.table_info({table})")]
        select = f"SELECT {', '.join(cols)} FROM main.{table}"  # noqa: S608 - fixed names
        if not whole:
            select += " WHERE id IN (SELECT id FROM temp.changed WHERE tbl = ?)"
        rows = mem.execute(select, () if whole else (table,)).fetchall()
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols if c != "id")
        disk.executemany(
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "  # noqa: S608
            f"ON CONFLICT(id) DO UPDATE SET {updates}",
            [tuple(r) for r in rows],
        )
        counts[table] = len(rows)
    return counts


def _size(conn: sqlite3.Connection) -> int:
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return (pages - free) * size


# What a finding's row keeps beside its columns (caused_by, consequences: its links to
# findings on other subjects, moptd.diagnose.links).
DETAIL_KEYS = ("evidence", "path", "actions", "runbook", "steps", "caused_by", "consequences")


def _insert_transition(c: sqlite3.Connection, tr: Mapping[str, Any]) -> None:
    f: Mapping[str, Any] = tr.get("finding") or {}
    t = float(tr["t"])
    row = c.execute(
        "SELECT id FROM findings WHERE rule = ? AND subject = ? AND state IN (?, ?) "
        "ORDER BY id DESC LIMIT 1",
        (tr["rule"], tr["subject"], *OPEN_STATES),
    ).fetchone()
    detail = {k: f[k] for k in DETAIL_KEYS if k in f}
    state = tr["new"]
    if row is None:
        cur = c.execute(
            "INSERT INTO findings (rule, subject, code, severity, state, summary, "
            "pending_since, updated_at, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                tr["rule"],
                tr["subject"],
                tr["code"],
                tr["severity"],
                state,
                tr.get("summary", ""),
                min(t, float(f.get("pending_since") or t)),  # a finding on older evidence
                t,
                _json(detail),
            ),
        )
        fid = int(cur.lastrowid or 0)
    else:
        fid = int(row["id"])
    sets: dict[str, Any] = {
        "state": state,
        "code": tr["code"],
        "severity": tr["severity"],
        "summary": tr.get("summary") or f.get("summary") or "",
        "updated_at": t,
    }
    if detail:
        sets["detail"] = _json(detail)
    if state == "firing":
        sets["first_seen"] = f.get("first_seen") or t
    if state in ("resolved", "inactive"):
        sets["resolved_at"] = t
    if f.get("last_seen") is not None:
        sets["last_seen"] = f["last_seen"]
    elif state in OPEN_STATES:
        sets["last_seen"] = t
    if f.get("pci_bus_id"):
        sets["pci_bus_id"] = f["pci_bus_id"]
    assign = ", ".join(f"{k} = ?" for k in sets)
    c.execute(f"UPDATE findings SET {assign} WHERE id = ?", (*sets.values(), fid))  # noqa: S608
    c.execute(
        "INSERT INTO transitions (finding_id, t, old, new, summary) VALUES (?, ?, ?, ?, ?)",
        (fid, t, tr["old"], state, tr.get("summary", "")),
    )
    if tr.get("board") and state == "firing" and tr["old"] != "firing":
        boards.insert_fault(c, tr, fid)


def _insert_events(c: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    c.executemany(
        "INSERT INTO events (t, stream, subject, text, fields) VALUES (?, ?, ?, ?, ?)", rows
    )


def _upsert_position(c: sqlite3.Connection, pos: LogPosition, now: float) -> None:
    c.execute(
        "INSERT INTO positions (source, boot_id, seq, cursor, updated_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(source) DO UPDATE SET boot_id = excluded.boot_id, seq = excluded.seq, "
        "cursor = excluded.cursor, updated_at = excluded.updated_at",
        (pos.source, pos.boot_id, pos.seq, pos.cursor, now),
    )


def _select_position(c: sqlite3.Connection, source: str) -> LogPosition | None:
    row = c.execute(
        "SELECT boot_id, seq, cursor FROM positions WHERE source = ?", (source,)
    ).fetchone()
    if row is None:
        return None
    return LogPosition(source, str(row["boot_id"]), row["seq"], str(row["cursor"]))


def _finding(row: sqlite3.Row) -> dict[str, Any]:
    out = {k: row[k] for k in row.keys() if k != "detail"}
    out.update(json.loads(row["detail"] or "{}"))
    return {k: v for k, v in out.items() if v is not None}


def active_findings(c: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = c.execute(
        "SELECT * FROM findings WHERE state = 'firing' ORDER BY first_seen, id"
    ).fetchall()
    return [_finding(r) for r in rows]


def _where(base: str, filters: list[tuple[str, object]]) -> tuple[str, list[object]]:
    """A WHERE clause from fixed conditions (written here, never from input) for the
    filters that were given, and their values as parameters."""
    given = [(clause, value) for clause, value in filters if value is not None]
    return " AND ".join([base, *(clause for clause, _ in given)]), [v for _, v in given]


def recorded_subjects(c: sqlite3.Connection) -> list[str]:
    """Every subject a finding was recorded on (a GPU gone from the store included)."""
    return [r[0] for r in c.execute("SELECT DISTINCT subject FROM findings")]


def query_findings(
    c: sqlite3.Connection,
    subject: str | None = None,
    code: str | None = None,
    severity: str | None = None,
    since: float | None = None,
    state: str | None = None,
    limit: int = 500,
) -> list[dict[str, Any]]:
    where, args = _where(
        "state != 'inactive'",
        [
            ("subject = ?", subject),
            ("code = ?", code),
            ("severity = ?", severity),
            ("state = ?", state),
            ("updated_at >= ?", since),
        ],
    )
    sql = (
        f"SELECT * FROM findings WHERE {where} "  # noqa: S608 - fixed columns
        "ORDER BY updated_at DESC, id DESC LIMIT ?"
    )
    return [_finding(r) for r in c.execute(sql, (*args, limit)).fetchall()]


def get_finding(c: sqlite3.Connection, finding_id: int) -> dict[str, Any] | None:
    row = c.execute("SELECT * FROM findings WHERE id = ?", (finding_id,)).fetchone()
    if row is None:
        return None
    out = _finding(row)
    out["transitions"] = [
        {"t": r["t"], "from": r["old"], "to": r["new"], "summary": r["summary"]}
        for r in c.execute(
            "SELECT * FROM transitions WHERE finding_id = ? ORDER BY t, id", (finding_id,)
        )
    ]
    out["remediations"] = remediations_of(c, finding_id)
    return out


REMEDIATION_FIELDS = (
    "key",
    "t",
    "finished_at",
    "finding_id",
    "rule",
    "subject",
    "code",
    "remedy",
    "entry",
    "actor",
    "outcome",
    "reason",
)


def _upsert_remediation(c: sqlite3.Connection, rec: Mapping[str, Any]) -> None:
    """The finding is the newest of its rule and subject: its transition was queued (and so
    written) before the remedy that answers it."""
    sets = {k: rec.get(k) for k in REMEDIATION_FIELDS if k != "finding_id"}
    sets["detail"] = _json(rec.get("detail") or {})
    cols = ", ".join(sets)
    marks = ", ".join("?" * len(sets))
    updates = ", ".join(f"{k} = excluded.{k}" for k in sets if k != "key")
    c.execute(
        f"INSERT INTO remediations ({cols}, finding_id) VALUES ({marks}, "  # noqa: S608
        "(SELECT id FROM findings WHERE rule = ? AND subject = ? ORDER BY id DESC LIMIT 1)) "
        f"ON CONFLICT(key) DO UPDATE SET {updates}",
        (*sets.values(), rec["rule"], rec["subject"]),
    )


def _upsert_remediation_state(
    c: sqlite3.Connection,
    subject: str,
    suspended: str | None,
    reset_at: float | None,
    now: float,
) -> None:
    c.execute(
        "INSERT INTO remediation_state (subject, suspended, reset_at, updated_at) "
        "VALUES (?, ?, ?, ?) ON CONFLICT(subject) DO UPDATE SET suspended = excluded.suspended, "
        "reset_at = excluded.reset_at, updated_at = excluded.updated_at",
        (subject, suspended, reset_at, now),
    )


def _remediation(row: sqlite3.Row) -> dict[str, Any]:
    out = {k: row[k] for k in row.keys() if k not in ("detail", "id")}
    out["id"] = row["id"]
    out.update(json.loads(row["detail"] or "{}"))
    return {k: v for k, v in out.items() if v is not None}


def remediations_of(c: sqlite3.Connection, finding_id: int) -> list[dict[str, Any]]:
    """The remedies that answered one finding, oldest first ([] in a file older than the
    audit table, which a read-only reader does not migrate)."""
    try:
        rows = c.execute(
            "SELECT * FROM remediations WHERE finding_id = ? ORDER BY t, id", (finding_id,)
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    return [_remediation(r) for r in rows]


def query_remediations(
    c: sqlite3.Connection,
    since: float | None = None,
    subject: str | None = None,
    limit: int = 500,
) -> list[dict[str, Any]]:
    """The audit trail, newest first."""
    where, args = _where("1", [("t >= ?", since), ("subject = ?", subject)])
    sql = f"SELECT * FROM remediations WHERE {where} ORDER BY t DESC, id DESC LIMIT ?"  # noqa: S608
    return [_remediation(r) for r in c.execute(sql, (*args, limit)).fetchall()]


def query_events(
    c: sqlite3.Connection,
    since: float | None = None,
    stream: str | None = None,
    subject: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    where, args = _where("1", [("t >= ?", since), ("stream = ?", stream), ("subject = ?", subject)])
    sql = (
        f"SELECT * FROM events WHERE {where} "  # noqa: S608 - fixed columns
        "ORDER BY t DESC, id DESC LIMIT ?"
    )
    rows = c.execute(sql, (*args, limit)).fetchall()
    return [
        {
            "t": r["t"],
            "stream": r["stream"],
            "subject": r["subject"],
            "text": r["text"],
            "fields": json.loads(r["fields"]),
        }
        for r in reversed(rows)
    ]


def open_read_only(path: Path) -> sqlite3.Connection | None:
    """The daemon's database for a reader that must not change it (`moptd explain` while
    the daemon is down); None when there is none or it cannot be read."""
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
        conn.row_factory = sqlite3.Row
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error:
        return None
    if version < 1 or version > SCHEMA_VERSION:
        conn.close()
        return None
    return conn


# Corrupt copies kept for a post-mortem: enough to compare, bounded on a flapping disk.
KEEP_QUARANTINED = 3


def _prune_quarantine(path: Path) -> None:
    """Remove all but the newest KEEP_QUARANTINED `<db>.corrupt-<stamp>` copies (with their
    -wal/-shm): each is as large as the database, and a disk that keeps corrupting it would
    otherwise fill with them. Only regular files of that name, never a link."""
    stamps = sorted(
        {
            p.name[len(path.name) + len(".corrupt-") :].split("-", 1)[0]
            for p in path.parent.glob(f"{path.name}.corrupt-*")
        }
    )
    for stamp in stamps[:-KEEP_QUARANTINED]:
        for suffix in ("", "-wal", "-shm"):
            old = path.parent / f"{path.name}.corrupt-{stamp}{suffix}"
            try:
                if stat.S_ISREG(os.lstat(old).st_mode):
                    old.unlink()
            except FileNotFoundError:
                continue
            log.info("findings database: removed the old corrupt copy %s", old)
