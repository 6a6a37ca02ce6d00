"""The real /dev/kmsg: records written here arrive parsed and attributed, from the start
of the boot on a first start, exactly once across a restart.

The records land in this machine's real kernel log, so they are unmistakable (a
``moptd-test-<uuid>`` tag) and name a PCI address no GPU has (0000:fe:00). The ring also
holds other tests' records, and a first start reads all of them: every check matches on
the tag.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from pathlib import Path

import pytest

from moptd.collector import CollectorContext
from moptd.collectors.kernel_log import LEGACY_STATE_FILE, KernelLogCollector
from moptd.findings.db import FindingsDB
from moptd.kernel.kmsg import read_boot_id
from moptd.observations import Event

KMSG = Path("/dev/kmsg")
# a real line (see tests/fixtures/kmsg-restart/SOURCE.md), moved to PCI 0000:fe:00
XID79 = (
    (Path(__file__).parent / "fixtures" / "kmsg-restart" / "xid79.txt")
    .read_text()
    .strip()
    .replace("PCI:0000:05:00", "PCI:0000:fe:00")
)


def _writable() -> None:
    if not os.access(KMSG, os.R_OK | os.W_OK):
        reason = f"{KMSG} is not readable and writable here (uid {os.getuid()})"
        print(reason)
        pytest.skip(reason)


def _write(line: str) -> None:
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def _wait_for(events: list[Event], tag: str, n: int, within: float = 5.0) -> list[Event]:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        mine = [e for e in events if tag in e.text]
        if len(mine) >= n or asyncio.get_running_loop().time() > deadline:
            return mine
        await asyncio.sleep(0.01)


def _collector(
    tmp_path: Path, events: list[Event], db: FindingsDB | None = None
) -> KernelLogCollector:
    """The kernel collector as the daemon wires it (with db: events and their position go
    to the findings database) or as a one-shot command does (no db)."""

    def publish(evs: list[Event]) -> None:
        events.extend(evs)
        if db is not None:
            db.record_events(evs)

    ctx = CollectorContext(
        options={"kmsg_path": str(KMSG)}, state_dir=tmp_path, publish=publish, positions=db
    )
    return KernelLogCollector(ctx)


def _stored(db: FindingsDB, tag: str) -> list[str]:
    db.flush()
    return [e["text"] for e in db.events(stream="kernel.xid", limit=100_000) if tag in e["text"]]


def _newest_seq() -> int:
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    try:
        last = -1
        while True:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                return last
            except BrokenPipeError:
                continue
            last = int(data.split(b",", 2)[1])
    finally:
        os.close(fd)


async def test_written_records_arrive_parsed_and_attributed(tmp_path: Path) -> None:
    _writable()
    tag = f"moptd-test-{uuid.uuid4()}"
    events: list[Event] = []
    db = FindingsDB(tmp_path / "findings.db").open()
    collector = _collector(tmp_path, events, db)
    await collector.start()
    try:
        pid = os.getpid()
        _write(f"NVRM: Xid (PCI:0000:fe:00): 13, pid={pid}, name=x, {tag} Graphics SM Warp\n")
        _write(
            f"NVRM: Xid (PCI:0000:fe:00): 45, pid={pid}, name=x, Ch 1 caused by previous "
            f"Xid 13 {tag}\n"
        )
        _write(f"NVRM: GPU 0000:fe:00.0: GPU has fallen off the bus. {tag}\n")
        mine = await _wait_for(events, tag, 3)
        batch = await collector.collect()
    finally:
        await collector.stop()
    assert [e.stream for e in mine] == ["kernel.xid", "kernel.xid", "kernel.gpu_fallen_off_bus"]
    first, second, lost = mine
    assert first.subject == "gpu:0000:fe:00.0"
    assert first.fields["code"] == 13
    assert first.fields["pid"] == pid
    # attribution read this very process from /proc
    assert first.fields["process"] == "x"
    assert first.fields["cmdline"]
    assert first.fields["user"]
    assert second.fields["caused_by"] == 13
    assert second.fields["incident"] == first.fields["incident"]
    assert lost.fields["pci_bus_id"] == "0000:fe:00.0"
    # written from user space: the kernel stamped them facility "user" (never "kern")
    assert {e.fields.get("facility") for e in mine} == {"user"}
    counts = {(s.subject, s.labels): s.value for s in batch.samples if s.signal == "gpu.xid_errors"}
    assert counts[("gpu:0000:fe:00.0", (("xid", "13"),))] >= 1
    # each event names the record it came from; the newest is the committed position
    carried = [e.fields["log_position"] for e in mine]
    assert all(p["source"] == "kmsg" and p["boot_id"] == read_boot_id() for p in carried)
    seqs = [p["seq"] for p in carried]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 3
    position = db.load_position("kmsg")
    db.close()
    assert position is not None
    assert position.seq is not None
    assert position.seq >= seqs[-1]
    assert not (tmp_path / LEGACY_STATE_FILE).exists()


async def test_a_record_written_before_the_first_start_is_found(tmp_path: Path) -> None:
    _writable()
    tag = f"moptd-test-{uuid.uuid4()}"
    _write(f"<3>{XID79} {tag}\n")
    events: list[Event] = []
    with FindingsDB(tmp_path / "findings.db") as db:
        collector = _collector(tmp_path, events, db)
        await collector.start()  # no position yet: from the start of this boot
        try:
            mine = await _wait_for(events, tag, 1)
        finally:
            await collector.stop()
        assert [(e.stream, e.subject, e.fields["code"]) for e in mine] == [
            ("kernel.xid", "gpu:0000:fe:00.0", 79)
        ]
        assert len(_stored(db, tag)) == 1


async def test_a_one_shot_pass_reads_the_whole_boot_and_keeps_no_position(
    tmp_path: Path,
) -> None:
    _writable()
    tag = f"moptd-test-{uuid.uuid4()}"
    _write(f"<3>{XID79} {tag}\n")
    events: list[Event] = []
    collector = _collector(tmp_path, events)  # no database: explain --offline, doctor
    await collector.start()
    try:
        batch = await collector.collect()  # the one pass: the backlog is read in it
    finally:
        await collector.stop()
    assert len([e for e in events if tag in e.text]) == 1
    counts = {(s.subject, s.labels): s.value for s in batch.samples if s.signal == "gpu.xid_errors"}
    assert counts[("gpu:0000:fe:00.0", (("xid", "79"),))] >= 1
    assert os.listdir(tmp_path) == []  # a command that reads writes nothing


async def test_restart_resumes_without_repeating_or_missing(tmp_path: Path) -> None:
    _writable()
    tag = f"moptd-test-{uuid.uuid4()}"
    events: list[Event] = []
    with FindingsDB(tmp_path / "findings.db") as db:
        collector = _collector(tmp_path, events, db)
        await collector.start()
        _write(f"NVRM: Xid (PCI:0000:fe:00): 31, pid='<unknown>', name=<unknown>, {tag} one\n")
        assert len(await _wait_for(events, tag, 1)) == 1
        await collector.stop()
        _write(f"NVRM: Xid (PCI:0000:fe:00): 31, pid='<unknown>', name=<unknown>, {tag} two\n")
        events2: list[Event] = []
        collector2 = _collector(tmp_path, events2, db)
        await collector2.start()
        try:
            mine = await _wait_for(events2, tag, 2, within=1.0)
        finally:
            await collector2.stop()
        assert [e.text.rsplit(" ", 1)[-1] for e in mine] == ["two"]
        assert [t.rsplit(" ", 1)[-1] for t in _stored(db, tag)] == ["one", "two"]


async def test_the_position_file_of_an_earlier_moptd_is_taken_over(tmp_path: Path) -> None:
    _writable()
    tag = f"moptd-test-{uuid.uuid4()}"
    _write(f"<3>{XID79} {tag}-before\n")
    legacy = tmp_path / LEGACY_STATE_FILE
    legacy.write_text(json.dumps({"boot_id": read_boot_id(), "seq": _newest_seq(), "cursor": ""}))
    _write(f"<3>{XID79} {tag}-after\n")
    events: list[Event] = []
    with FindingsDB(tmp_path / "findings.db") as db:
        collector = _collector(tmp_path, events, db)
        await collector.start()
        try:
            mine = await _wait_for(events, tag, 2, within=1.0)
        finally:
            await collector.stop()
        assert [e.text.rsplit("-", 1)[-1] for e in mine] == ["after"]
        assert not legacy.exists()
        assert db.load_position("kmsg") is not None


async def test_an_unreadable_position_file_is_named_and_the_boot_read_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _writable()
    tag = f"moptd-test-{uuid.uuid4()}"
    _write(f"<3>{XID79} {tag}\n")
    legacy = tmp_path / LEGACY_STATE_FILE
    legacy.write_text('{"boot_id": "b", "seq": -1}')
    events: list[Event] = []
    with FindingsDB(tmp_path / "findings.db") as db:
        collector = _collector(tmp_path, events, db)
        with caplog.at_level(logging.WARNING):
            await collector.start()
        try:
            mine = await _wait_for(events, tag, 1)
        finally:
            await collector.stop()
    assert str(legacy) in caplog.text
    assert "key 'seq'" in caplog.text
    assert len(mine) == 1


async def test_unreadable_kmsg_makes_the_collector_unavailable(tmp_path: Path) -> None:
    from moptd.collector import Unavailable

    ctx = CollectorContext(options={"kmsg_path": str(tmp_path / "no-kmsg")}, state_dir=tmp_path)
    collector = KernelLogCollector(ctx)
    with pytest.raises(Unavailable, match=r"cannot read .*no-kmsg: No such file"):
        await collector.start()
    with pytest.raises(Unavailable, match="no-kmsg"):
        await collector.collect()
    await collector.stop()


async def test_an_xid_nvml_reported_too_counts_once(tmp_path: Path) -> None:
    import time

    from moptd.kernel.xid_tally import NVML, XidTally

    _writable()
    tag = f"moptd-test-{uuid.uuid4()}"
    shared = XidTally()
    events: list[Event] = []
    ctx = CollectorContext(
        options={"kmsg_path": str(KMSG)}, state_dir=tmp_path, publish=events.extend, xids=shared
    )
    collector = KernelLogCollector(ctx)
    newest = _newest_seq()
    await collector.start()
    try:
        # the boot's backlog first (other tests' Xid 31 lines on this address among it)
        for _ in range(500):
            if (getattr(collector.follower, "last_seq", None) or -1) >= newest:
                break
            await asyncio.sleep(0.01)
        before = shared.counts.get(("gpu:0000:fe:00.0", 31), 0)
        # the NVML event of the Xid whose kernel line follows (the subject as mapped)
        shared.add(NVML, "gpu:0000:fe:00.0", 31, time.time())
        _write(f"NVRM: Xid (PCI:0000:fe:00): 31, pid='<unknown>', name=<unknown>, {tag}\n")
        assert len(await _wait_for(events, tag, 1)) == 1
        batch = await collector.collect()
    finally:
        await collector.stop()
    counts = {(s.subject, s.labels): s.value for s in batch.samples if s.signal == "gpu.xid_errors"}
    assert counts[("gpu:0000:fe:00.0", (("xid", "31"),))] == before + 1
    assert not shared.kernel_following  # stopped: the NVML collector reports it now
