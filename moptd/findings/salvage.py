"""What still reads from a corrupt findings database is carried into the new one.

A findings database that fails its integrity check at start is moved aside and a new one
begun (`FindingsDB._connect`). Without this the findings that were firing were gone, and
the kernel-log position had moved past the records that caused them. Now every row the
corrupt file still yields is copied over, table by table (parents first, their ids kept so
that transitions still point at their findings), one row at a time: a row that raises on
read or on insert is skipped and counted. A read that hits a damaged page resumes past it,
probing further ahead each time it fails again (``MAX_PROBES`` in all per table).

The log positions are copied only when the findings and the events read whole. Otherwise
they are left behind: the kernel collector then reads the kernel ring from its start, as on
a first start, so the Xid lines it still holds are diagnosed again. Some events are then
stored twice (once salvaged, once read again); none that the ring still holds is lost.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# parents first; positions: see above. The remediation audit and the guards' state (the
# open circuit breaker) are kept too: without them a salvage would close the breaker. So is
# each board's fault history: without it a salvage would forget a repeat offender.
TABLES = (
    "findings",
    "transitions",
    "events",
    "remediations",
    "remediation_state",
    "board_faults",
)
MAX_PROBES = 4096  # per table: failed reads before what is left of it is given up
_FIRST_ID = -(1 << 63)


@dataclass(slots=True)
class Salvage:
    copied: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # reads and inserts that raised
    positions_kept: bool = False
    error: str = ""  # the corrupt file could not be opened at all

    def summary(self) -> str:
        if self.error:
            return f"nothing salvaged ({self.error}); the kernel log is read again from its start"
        rows = ", ".join(
            f"{self.copied.get(t, 0)} {t}"
            + (f" ({self.skipped[t]} lost)" if self.skipped.get(t) else "")
            for t in TABLES
            if t in TABLES[:3] or self.copied.get(t) or self.skipped.get(t)
        )
        tail = (
            "log positions kept"
            if self.positions_kept
            else "the kernel log is read again from its start"
        )
        return f"salvaged {rows}; {tail}"


def _open_old(path: Path) -> sqlite3.Connection:
    """The corrupt copy, read only; with its -wal beside it when that opens, else without."""
    last: sqlite3.Error | None = None
    for query in ("mode=ro", "immutable=1"):
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(f"file:{path}?{query}", uri=True, check_same_thread=False)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.Error as exc:
            last = exc
            if conn is not None:
                conn.close()
    assert last is not None
    raise last


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")]


def _rows(
    old: sqlite3.Connection, table: str, cols: list[str], out: Salvage
) -> Iterator[tuple[object, ...]]:
    """The table's rows in id order; a read that raises resumes past the damage."""
    select = f"SELECT {', '.join(cols)} FROM {table} WHERE id > ? ORDER BY id"  # noqa: S608
    try:
        top = old.execute(f"SELECT max(id) FROM {table}").fetchone()[0]  # noqa: S608
    except sqlite3.Error:
        top = None
    after, step, probes = _FIRST_ID, 1, 0
    while True:
        try:
            for row in old.execute(select, (after,)):
                after, step = int(row[0]), 1
                yield tuple(row)
            return
        except sqlite3.Error:
            out.skipped[table] = out.skipped.get(table, 0) + 1
            probes += 1
            if top is None or after >= int(top) or probes >= MAX_PROBES:
                return
            # past the damaged page: one id further, then twice as far each time it fails
            after = (0 if after == _FIRST_ID else after) + step
            step *= 2


def salvage(old_path: Path, new: sqlite3.Connection) -> Salvage:
    """Copy what reads from ``old_path`` into the empty, migrated database ``new``."""
    out = Salvage()
    try:
        old = _open_old(old_path)
    except sqlite3.Error as exc:
        out.error = str(exc)
        return out
    try:
        for table in TABLES:
            try:
                have = set(_columns(old, table))
            except sqlite3.Error:
                have = set()
            else:
                if not have:
                    continue  # a table newer than the old file's schema: nothing to carry
            cols = [c for c in _columns(new, table) if c in have]
            if "id" not in cols:
                out.skipped[table] = out.skipped.get(table, 0) + 1
                continue
            insert = (
                f"INSERT INTO {table} ({', '.join(cols)}) "  # noqa: S608
                f"VALUES ({', '.join('?' * len(cols))})"
            )
            out.copied[table] = _copy_table(old, new, table, cols, insert, out)
        whole = not out.skipped.get("findings") and not out.skipped.get("events")
        if whole:
            out.positions_kept = _copy_positions(old, new)
    finally:
        old.close()
    return out


def _copy_table(
    old: sqlite3.Connection,
    new: sqlite3.Connection,
    table: str,
    cols: list[str],
    insert: str,
    out: Salvage,
) -> int:
    """One transaction per table; a new file that refuses the commit (a full disk) keeps
    nothing of the table, and the database opens all the same."""
    copied = 0
    try:
        new.execute("BEGIN")
        for row in _rows(old, table, cols, out):
            try:
                new.execute(insert, row)
                copied += 1
            except sqlite3.OperationalError:
                raise  # the new file itself (full, read-only): not this row's fault
            except (sqlite3.Error, OverflowError):
                # a damaged row: a NULL where none may be, a dangling finding id, a value
                # SQLite cannot bind
                out.skipped[table] = out.skipped.get(table, 0) + 1
        new.execute("COMMIT")
    except sqlite3.Error as exc:
        log.warning("salvaging %s: %s", table, exc)
        if new.in_transaction:
            new.execute("ROLLBACK")
        out.skipped[table] = out.skipped.get(table, 0) + copied + 1
        return 0
    return copied


def _copy_positions(old: sqlite3.Connection, new: sqlite3.Connection) -> bool:
    cols = ["source", "boot_id", "seq", "cursor", "updated_at"]
    try:
        rows = old.execute(f"SELECT {', '.join(cols)} FROM positions").fetchall()  # noqa: S608
    except sqlite3.Error:
        return False
    try:
        new.execute("BEGIN")
        new.executemany(
            f"INSERT INTO positions ({', '.join(cols)}) VALUES (?, ?, ?, ?, ?)",  # noqa: S608
            rows,
        )
        new.execute("COMMIT")
    except sqlite3.Error:
        new.execute("ROLLBACK")
        return False
    return True
