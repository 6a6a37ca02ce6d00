"""The kmsg follower: sequence tracking, lost records, resume and replay, bursts,
failures; the position kept in the findings database with the events it covers.

Records travel through a real SOCK_SEQPACKET socket pair (one record per read, exactly
as /dev/kmsg delivers them); the real device is exercised in test_kmsg_live.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.collector import CollectorContext
from moptd.collectors.host import HostCollector
from moptd.collectors.kernel_log import KernelLogCollector
from moptd.daemon.runtime import CollectorRuntime
from moptd.findings.db import FindingsDB, LogPosition, log_position_of
from moptd.kernel.attribution import Attributor
from moptd.kernel.kmsg import (
    POSITION_FIELD,
    KmsgFollower,
    Position,
    StateError,
    load_position,
)
from moptd.kernel.logparse import KernelRecord
from moptd.observations import NODE, Event
from moptd.store import SignalStore

BOOT = "5e1f2c7a-0000-4000-8000-000000000001"


def _record(seq: int, text: str = "hello", us: int = 1000) -> bytes:
    return f"6,{seq},{us},-;{text}\n SUBSYSTEM=pci\n".encode()


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _follower(
    tmp_path: Path,
    got: list[KernelRecord],
    resume: Position | None = None,
    replayed: list[KernelRecord] | None = None,
) -> KmsgFollower:
    on_replay = replayed.extend if replayed is not None else None
    return KmsgFollower(
        tmp_path / "dev", got.extend, boot_id=BOOT, resume=resume, on_replay=on_replay
    )


def test_sequence_gaps_count_as_lost(tmp_path, pair):
    a, b = pair
    got: list[KernelRecord] = []
    f = _follower(tmp_path, got)
    f.adopt(b.fileno())
    for seq in (10, 11, 14, 15):
        a.send(_record(seq))
    records = f.read_some(100)
    assert [r.seq for r in records] == [10, 11, 14, 15]
    assert records[0].meta == {"SUBSYSTEM": "pci"}
    assert f.records_read == 4
    assert f.records_lost == 2
    assert f.read_some(100) == []  # nothing more: EAGAIN, not an error


def test_resume_replays_through_the_position_of_the_same_boot(tmp_path, pair):
    a, b = pair
    replayed: list[KernelRecord] = []
    f = _follower(tmp_path, [], Position(BOOT, 11), replayed)
    f.adopt(b.fileno())
    for seq in (9, 10, 11, 12, 13):
        a.send(_record(seq))
    assert [r.seq for r in f.read_some(100)] == [12, 13]
    # the records before it rebuild the parser's state; they are not new, nor counted
    assert [r.seq for r in replayed] == [9, 10, 11]
    assert f.records_read == 2
    assert f.records_lost == 0
    assert f.position() == Position(BOOT, 13)


def test_resume_counts_records_lost_while_stopped(tmp_path, pair):
    a, b = pair
    f = _follower(tmp_path, [], Position(BOOT, 11))
    f.adopt(b.fileno())
    a.send(_record(20))  # the ring wrapped while moptd was down
    assert [r.seq for r in f.read_some(100)] == [20]
    assert f.records_lost == 8


def test_first_start_and_another_boot_read_every_record(tmp_path, pair):
    for resume in (None, Position("another-boot", 500), Position(BOOT, None)):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        b.setblocking(False)
        replayed: list[KernelRecord] = []
        f = _follower(tmp_path, [], resume, replayed)
        f.adopt(b.fileno())
        a.send(_record(0))
        a.send(_record(1))
        assert [r.seq for r in f.read_some(100)] == [0, 1], resume
        assert replayed == []
        assert f.records_lost == 0
        a.close()
        b.close()


def test_a_slice_of_replayed_records_only_is_not_the_end(tmp_path, pair):
    a, b = pair
    got: list[KernelRecord] = []
    replayed: list[KernelRecord] = []
    f = KmsgFollower(
        tmp_path / "dev", got.extend, boot_id=BOOT, batch=2,
        resume=Position(BOOT, 4), on_replay=replayed.extend,
    )
    f.adopt(b.fileno())
    for seq in range(8):
        a.send(_record(seq))
    slices = 0
    while f.read_slice():
        slices += 1
    assert [r.seq for r in replayed] == [0, 1, 2, 3, 4]
    assert [r.seq for r in got] == [5, 6, 7]
    assert slices == 4  # 0-1 replayed, 2-3 replayed, 4 replayed with 5-6, 7; then nothing


def _event(seq: int | None, source: str = "kmsg", text: str = "x") -> Event:
    fields: dict[str, object] = {"code": 79}
    if seq is not None:
        fields[POSITION_FIELD] = {"source": source, "boot_id": BOOT, "seq": seq, "cursor": ""}
    return Event("kernel.xid", "gpu:0000:fe:00.0", 1.0, fields, text)


def test_events_commit_the_position_they_carry_in_one_transaction(tmp_path):
    with FindingsDB(tmp_path / "findings.db") as db:
        assert db.load_position("kmsg") is None
        db.record_events([_event(7, text="a"), _event(9, text="b")]).result(10)
        assert db.load_position("kmsg") == LogPosition("kmsg", BOOT, 9, "")
        db.save_position("kmsg", BOOT, 12).result(10)  # records with no event since
        db.record_events([Event("gpu.xid_event", "gpu:0", 2.0, {"code": 79})]).result(10)
        assert db.load_position("kmsg") == LogPosition("kmsg", BOOT, 12, "")
        db.save_position("journal", BOOT, None, "s=abc;i=1").result(10)
        assert db.load_position("journal") == LogPosition("journal", BOOT, None, "s=abc;i=1")
        assert [e["text"] for e in db.events(stream="kernel.xid")] == ["a", "b"]
    # and the file keeps it for the next start
    with FindingsDB(tmp_path / "findings.db") as db:
        assert db.load_position("kmsg") == LogPosition("kmsg", BOOT, 12, "")


def test_a_failed_write_commits_neither_the_events_nor_their_position(tmp_path):
    import sqlite3

    path = tmp_path / "findings.db"
    with FindingsDB(path) as db:
        db.record_events([_event(3, text="a")]).result(10)

        def refuse(c):
            # the position is written after the events, in the same transaction
            c.execute(
                "CREATE TEMP TRIGGER refuse BEFORE INSERT ON main.positions "
                "BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
            )

        db.call(refuse)
        db.record_events([_event(4, text="b")]).result(10)
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            texts = [r[0] for r in conn.execute("SELECT text FROM events ORDER BY id")]
            seq = conn.execute("SELECT seq FROM positions WHERE source = 'kmsg'").fetchone()[0]
        finally:
            conn.close()
        assert (texts, seq) == (["a"], 3)  # on disk: neither "b" nor its position


@pytest.mark.parametrize(
    "carried",
    [
        "not a mapping",
        {"source": "", "boot_id": BOOT, "seq": 1},
        {"source": "kmsg", "boot_id": 5, "seq": 1},
        {"source": "kmsg", "boot_id": BOOT, "seq": -1},
        {"source": "kmsg", "boot_id": BOOT, "seq": True},
        {"source": "kmsg", "boot_id": BOOT, "seq": 2**64},
    ],
)
def test_a_malformed_carried_position_is_not_committed(tmp_path, carried):
    with FindingsDB(None) as db:
        ev = Event("kernel.xid", NODE, 1.0, {POSITION_FIELD: carried}, "x")
        db.record_events([ev]).result(10)
        assert db.load_position("kmsg") is None
        assert len(db.events()) == 1  # the event itself is kept


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ('{"boot_id": 3}', "key 'boot_id'"),
        ('{"boot_id": "b", "seq": -1}', "key 'seq'"),
        ('{"boot_id": "b", "seq": 1, "cursor": 5}', "key 'cursor'"),
    ],
)
def test_bad_saved_position_names_file_and_key(tmp_path, content, message):
    path = tmp_path / "state.json"
    path.write_text(content)
    with pytest.raises(StateError, match=message) as info:
        load_position(path)
    assert str(path) in str(info.value)


@pytest.mark.slow
async def test_burst_of_100000_records_leaves_the_loop_free(tmp_path, pair):
    """Slices of records alternate with other tasks: the loop is never held for the burst."""
    a, b = pair
    total = 100_000
    order: list[str] = []
    events = []
    attributor = Attributor()

    def on_records(records: list[KernelRecord]) -> None:
        order.append("R")
        for rec in records:
            events.extend(attributor.events(rec))

    f = KmsgFollower(tmp_path / "dev", on_records, boot_id=BOOT)
    f.adopt(os.dup(b.fileno()))  # the follower closes what it adopts
    f.attach(asyncio.get_running_loop())
    tag = uuid.uuid4().hex

    def writer() -> None:
        for seq in range(total):
            text = f"NVRM: Xid (PCI:0000:fe:00): 13, pid='<unknown>', name=<unknown>, {tag}"
            a.send(_record(seq, text if seq % 100 == 0 else f"noise {seq}"))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while f.records_read < total:
            order.append("T")  # another task got the loop
            await asyncio.sleep(0)
    finally:
        thread.join()
        f.close()
    assert f.records_read == total
    assert f.records_lost == 0
    assert len(events) == total // 100
    first, last = order.index("R"), len(order) - 1 - order[::-1].index("R")
    assert "T" in order[first:last]


async def test_unreadable_kmsg_is_unavailable_and_nothing_else_changes(tmp_path):
    store = SignalStore()
    bad = str(tmp_path / "no-such-kmsg")
    kernel = KernelLogCollector(CollectorContext(options={"kmsg_path": bad}, state_dir=tmp_path))
    host = HostCollector(CollectorContext(state_dir=tmp_path))
    runtime = CollectorRuntime(store, {"kernel": (kernel, 5.0, 5.0), "host": (host, 5.0, 5.0)})
    await runtime.start(loops=False)
    await runtime.run_once()
    await runtime.stop()
    assert runtime.health["kernel"].state == "unavailable"
    assert bad in runtime.health["kernel"].reason
    assert runtime.health["host"].state == "ok"
    assert not list(tmp_path.glob("kernel_log.json"))


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("MOPTD_KMSG_OVERRUN"),
    reason="overwrites this host's whole kernel log; set MOPTD_KMSG_OVERRUN=1 (sandbox/CI VM)",
)
def test_ring_overrun_on_real_kmsg_is_counted(tmp_path):
    kmsg = Path("/dev/kmsg")
    if not os.access(kmsg, os.R_OK | os.W_OK):
        pytest.skip(f"{kmsg} not readable and writable here")
    f = KmsgFollower(kmsg, lambda r: None)
    f.open()
    # position the reader at the oldest record, then write until it has been overwritten
    os.lseek(f._fd, 0, os.SEEK_SET)  # type: ignore[arg-type]
    first = f.read_some(1)
    tag = f"moptd-test-{uuid.uuid4()}"
    for i in range(200_000):
        # the kernel rate-limits writes per open file (10 per 5 s): one open per write
        fd = os.open(kmsg, os.O_WRONLY)
        try:
            os.write(fd, f"{tag} overrun filler {i} {'x' * 150}\n".encode())
        finally:
            os.close(fd)
        if i % 1000 == 999:
            probe = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(probe, 0, os.SEEK_SET)
            oldest = os.read(probe, 8192).split(b",", 2)[1]
            os.close(probe)
            if int(oldest) > (first[0].seq or 0) + 10:
                break
    while f.read_some(10_000):
        pass
    f.close()
    assert f.overruns >= 1
    assert f.records_lost > 0


async def test_unknown_source_is_unavailable_naming_the_key(tmp_path):
    from moptd.collector import Unavailable

    collector = KernelLogCollector(
        CollectorContext(options={"source": "carrier-pigeon"}, state_dir=tmp_path)
    )
    with pytest.raises(Unavailable, match=r"collectors\.kernel\.source: unknown source"):
        await collector.start()
    await collector.stop()


async def test_journal_source_without_systemd_python_is_unavailable(tmp_path):
    from moptd.collector import Unavailable

    try:
        from systemd import journal  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("systemd-python is installed here")
    collector = KernelLogCollector(
        CollectorContext(options={"source": "journal"}, state_dir=tmp_path)
    )
    with pytest.raises(Unavailable, match=r"systemd-python is not installed"):
        await collector.start()
    await collector.stop()


def test_journal_entry_becomes_a_record():
    import collections
    import datetime as dt

    from moptd.kernel.journal import JournalFollower

    # the shape systemd-python's Reader returns (Monotonic is its named tuple)
    monotonic = collections.namedtuple("Monotonic", ["timestamp", "bootid"])
    entry = {
        "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has "
        "fallen off the bus.",
        "__REALTIME_TIMESTAMP": dt.datetime(2026, 11, 29, 16, 21, 26, tzinfo=dt.UTC),
        "_SOURCE_MONOTONIC_TIMESTAMP": monotonic(dt.timedelta(seconds=5678.9), None),
        "PRIORITY": 3,
        "__CURSOR": "s=abc;i=1",
    }
    rec = JournalFollower.to_record(entry)
    assert (rec.t, rec.uptime, rec.level, rec.fmt) == (1795969286.0, 5678.9, 3, "journal")
    [ev] = Attributor({"0000:3b:00.0": 1}).events(rec)
    assert (ev.stream, ev.subject, ev.fields["code"]) == ("kernel.xid", "gpu:1", 79)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=20),
        st.dictionaries(
            st.sampled_from(["source", "boot_id", "seq", "cursor", "other"]),
            st.one_of(
                st.none(), st.booleans(), st.integers(-5, 2**70), st.floats(), st.text(max_size=40),
                st.lists(st.integers(), max_size=3),
            ),
            max_size=5,
        ),
    )
)
def test_any_carried_position_is_read_or_refused_never_raises(carried):
    ev = Event("kernel.xid", NODE, 1.0, {POSITION_FIELD: carried}, "x")
    pos = log_position_of(ev)
    if pos is not None:
        assert isinstance(pos.source, str)
        assert pos.source
        assert isinstance(pos.boot_id, str)
        assert pos.seq is None or (isinstance(pos.seq, int) and 0 <= pos.seq < 2**63)
        assert isinstance(pos.cursor, str)
