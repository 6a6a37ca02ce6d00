"""The real /dev/kmsg: records written here arrive parsed and attributed.

The records land in this machine's real kernel log, so they are unmistakable (a
``moptd-test-<uuid>`` tag) and name a PCI address no GPU has (0000:fe:00).
"""

from __future__ import annotations

import asyncio
import os
import stat
import uuid
from pathlib import Path

import pytest

from moptd.collector import CollectorContext
from moptd.collectors.kernel_log import STATE_FILE, KernelLogCollector
from moptd.observations import Event

KMSG = Path("/dev/kmsg")


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


def _collector(tmp_path: Path, events: list[Event]) -> KernelLogCollector:
    ctx = CollectorContext(
        options={"kmsg_path": str(KMSG)}, state_dir=tmp_path, publish=events.extend
    )
    return KernelLogCollector(ctx)


async def test_written_records_arrive_parsed_and_attributed(tmp_path: Path) -> None:
    _writable()
    tag = f"moptd-test-{uuid.uuid4()}"
    events: list[Event] = []
    collector = _collector(tmp_path, events)
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
    counts = {(s.subject, s.labels): s.value for s in batch.samples if s.signal == "gpu.xid_errors"}
    assert counts[("gpu:0000:fe:00.0", (("xid", "13"),))] >= 1
    state = tmp_path / STATE_FILE
    assert stat.S_IMODE(state.stat().st_mode) == 0o640


async def test_restart_resumes_without_repeating_or_missing(tmp_path: Path) -> None:
    _writable()
    tag = f"moptd-test-{uuid.uuid4()}"
    events: list[Event] = []
    collector = _collector(tmp_path, events)
    await collector.start()
    _write(f"NVRM: Xid (PCI:0000:fe:00): 31, pid='<unknown>', name=<unknown>, {tag} one\n")
    assert len(await _wait_for(events, tag, 1)) == 1
    await collector.stop()  # saves the position
    _write(f"NVRM: Xid (PCI:0000:fe:00): 31, pid='<unknown>', name=<unknown>, {tag} two\n")
    events2: list[Event] = []
    collector2 = _collector(tmp_path, events2)
    await collector2.start()
    try:
        mine = await _wait_for(events2, tag, 2, within=1.0)
    finally:
        await collector2.stop()
    assert [e.text.rsplit(" ", 1)[-1] for e in mine] == ["two"]


async def test_unreadable_kmsg_makes_the_collector_unavailable(tmp_path: Path) -> None:
    from moptd.collector import Unavailable

    ctx = CollectorContext(options={"kmsg_path": str(tmp_path / "no-kmsg")}, state_dir=tmp_path)
    collector = KernelLogCollector(ctx)
    with pytest.raises(Unavailable, match=r"cannot read .*no-kmsg: No such file"):
        await collector.start()
    with pytest.raises(Unavailable, match="no-kmsg"):
        await collector.collect()
    await collector.stop()
