"""The board history on real daemons: real /dev/kmsg lines, a restart, and a salvage.

The GPU is the real H200 of tests/fixtures/h200/nvml_recording_h200.jsonl through the
recorded NVML backend (serial 1654024077485). Adaptations, all of addresses: the recording's
PCI address 0000:00:06.0 becomes this run's own test address (a random PCI domain, bus fe,
as the other kmsg tests pick it, so that runs sharing the host's kernel log never see each
other's lines and no real GPU is named); the public kernel lines (tests/fixtures/kmsg-restart
xid79.txt, tests/fixtures/xid-location gpud's Xid 31) are written to /dev/kmsg with that
address and a test tag.

What the daemon finds in its state directory when it starts stands for its own earlier life
on this host: the same board, by serial, lost from the bus 10 days ago at another address
(bus fd: it was re-enumerated since) as gpu:3, and an Xid 31 stored a day ago at the place
of the GPU the new line names, from another program (the stored fields of a kernel.xid
event, as the kernel collector writes them, not a log line).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from moptd.findings import boards
from moptd.findings.db import FILE_NAME, FindingsDB, transition_record
from moptd.observations import Event
from tests.daemon_proc import DaemonProcess, seed_kernel_position

FIXTURES = Path(__file__).parent / "fixtures"
RECORDING = FIXTURES / "h200" / "nvml_recording_h200.jsonl"
XID79 = (FIXTURES / "kmsg-restart" / "xid79.txt").read_text().strip()
XID31 = json.loads((FIXTURES / "xid-location" / "cases.jsonl").read_text().splitlines()[3])["line"]
SERIAL = "1654024077485"  # the recording's
UUID = "GPU-c8045656-c1db-d6d0-8d7b-a4b8a670341e"
KMSG = Path("/dev/kmsg")


def write_kmsg(line: str) -> None:
    if not os.access(KMSG, os.W_OK):
        pytest.skip(f"{KMSG} is not writable here (uid {os.getuid()})")
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def readdressed(line: str, kernel_bus: str) -> str:
    start = line.index("(PCI:") + len("(PCI:")
    return line[:start] + kernel_bus + line[line.index(")", start) :]


def seed(state: Path, old_bus: str, new_bus: str) -> None:
    state.mkdir(parents=True)
    now = time.time()
    earlier = boards.Board(f"serial:{SERIAL}", SERIAL, "", old_bus)
    with FindingsDB(state / FILE_NAME) as db:
        for old, new, t in (
            ("inactive", "pending", -10 * 86400.0),
            ("pending", "firing", -10 * 86400.0 + 1),
            ("firing", "resolved", -10 * 86400.0 + 3600),
        ):
            rec = transition_record(
                now + t,
                "gpu-lost",
                "gpu:3",
                "GPU_LOST",
                "critical",
                old,
                new,
                f"gpu:3 ({old_bus}) is lost: drain and reboot the node",
                {"actions": [{"kind": "reboot_node"}]},
            )
            if new == "firing":
                rec["board"] = boards.board_row(earlier, rec["finding"])
            db.record_transition(rec)
        db.record_events(
            [
                Event(
                    "kernel.xid",
                    f"gpu:{new_bus}",
                    now - 86400.0,
                    {
                        "code": 31,
                        "pci_bus_id": new_bus,
                        "pid": 5403,
                        "process": "python3",
                        "location": "GRAPHICS GPCCLIENT_T1_14",
                        "mmu_engine": "GRAPHICS",
                        "mmu_client": "GPCCLIENT_T1_14",
                    },
                    "",
                )
            ]
        )
        db.flush()
    seed_kernel_position(state)


def active(text: str, code: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith("moptd_finding_active{")
        and f'code="{code}"' in line
        and line.endswith(" 1.0")
    ]


def wait_active(d: DaemonProcess, code: str, within: float = 20.0) -> list[str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = active(d.scrape(), code)
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {code} within {within}s:\n{d.scrape()[-3000:]}\n{d.log()[-3000:]}")


def wait_metric(d: DaemonProcess, prefix: str, value: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    seen: list[str] = []
    while time.monotonic() < deadline:
        seen = [line for line in d.scrape().splitlines() if line.startswith(prefix)]
        if any(line.endswith(f" {value}") for line in seen):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {prefix}... {value} within {within}s: {seen}")


def history(config: Path, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "history", "--config", str(config), "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.slow
def test_a_repeat_offender_across_re_enumeration_restart_and_salvage(tmp_path: Path) -> None:
    domain = f"{random.randint(0x1000, 0xFFFE):04x}"
    kernel_bus, bus, old_bus = f"{domain}:fe:00", f"{domain}:fe:00.0", f"{domain}:fd:00.0"
    tag = f"moptd-test-{uuid.uuid4().hex[:8]}"
    recording = tmp_path / "recording.jsonl"
    recording.write_text(RECORDING.read_text().replace('"0000:00:06.0"', f'"{bus}"'))
    seed(tmp_path / "state", old_bus, bus)
    extra = {"collectors": {"nvml": {"backend": "recorded", "recording": str(recording)}}}
    d = DaemonProcess(tmp_path, extra)
    with d:
        d.wait_metrics()
        write_kmsg(f"{readdressed(XID79, kernel_bus)} {tag}-1\n")
        write_kmsg(f"{readdressed(XID31, kernel_bus)} {tag}-2\n")
        lost = wait_active(d, "GPU_LOST")
        recurring = wait_active(d, "GPU_FAULT_RECURRING")
        same = wait_active(d, "GPU_FAULT_SAME_LOCATION")
    assert 'subject="gpu:0"' in recurring[0], recurring
    assert 'subject="gpu:0"' in same[0], same
    assert lost
    faults = history(d.config_path, "gpu:0")["faults"]
    assert [(f["code"], f["pci_bus_id"], f["serial"]) for f in faults] == [
        ("GPU_LOST", bus, SERIAL),
        ("GPU_LOST", old_bus, SERIAL),
    ]
    assert history(d.config_path, SERIAL)["faults"] == faults

    # a restart: the history is in the database, not in the store
    with d:
        d.wait_metrics()
        wait_active(d, "GPU_FAULT_RECURRING")
        wait_active(d, "GPU_FAULT_SAME_LOCATION")
        wait_metric(d, 'moptd_gpu_board_fault_recurring{gpu="0"', "1.0")

    # a damaged file: moved aside, what reads is carried over, the board's history with it
    db = tmp_path / "state" / FILE_NAME
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'transitions_t'"
    ).fetchone()[0]
    conn.close()
    data = bytearray(db.read_bytes())
    size = int.from_bytes(data[16:18], "big") or 65536
    data[(root - 1) * size : root * size] = b"\xa5" * size
    db.write_bytes(bytes(data))
    with d:
        d.wait_metrics()
        recurring = wait_active(d, "GPU_FAULT_RECURRING")
        wait_metric(d, 'moptd_gpu_board_fault_incidents{gpu="0"', "2.0")
    assert "salvaged" in d.log(), d.log()[-2000:]
    assert len(history(d.config_path, "gpu:0")["faults"]) == 2

    # explain shows the GPU's history (here with the daemon stopped: from its database)
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "explain", "--config", str(d.config_path), "gpu:0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Hardware history (moptd history)" in out.stdout, out.stdout + out.stderr
    assert f"Board serial:{SERIAL} ({SERIAL}, {UUID}): 2 hardware faults" in out.stdout
    assert f"GPU_LOST (critical) on gpu:3 ({old_bus})" in out.stdout
    assert f"GPU_LOST (critical) on gpu:0 ({bus})" in out.stdout
    assert "advised: drain_node, reboot_node, replace_hardware" in out.stdout
