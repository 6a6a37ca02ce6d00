"""Each board's fault history (moptd/findings/boards.py): kept by serial in the findings
database across a new index or PCI address and a salvage, read by the diagnosis loop into
findings.* samples that raise GPU_FAULT_RECURRING and GPU_FAULT_SAME_LOCATION.

The GPU identity is the real H200 of tests/fixtures/h200/nvml_recording_h200.jsonl (serial
1654024077485, UUID GPU-c8045656-...); the Xid lines are public ones
(tests/fixtures/kmsg-restart, tests/fixtures/xid-location)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from moptd.clock import VirtualClock
from moptd.diagnose.codes import CODES
from moptd.findings import boards
from moptd.findings.db import FILE_NAME, FindingsDB, transition_record
from moptd.findings.service import build_diagnosis
from moptd.kernel.patterns import parse_xid
from moptd.located import LocatedError
from moptd.observations import Batch, Event
from moptd.store import SignalStore

FIXTURES = Path(__file__).parent / "fixtures"
RECORDING = FIXTURES / "h200" / "nvml_recording_h200.jsonl"
STATIC = json.loads(RECORDING.read_text().splitlines()[1])["reading"]
SERIAL, UUID = STATIC["serial"], STATIC["uuid"]
DAY = 86400.0
NOW = 1_800_000_000.0


def board(pci: str = "0000:3b:00.0") -> boards.Board:
    return boards.Board(f"serial:{SERIAL}", SERIAL, UUID, pci)


def fired(
    db: FindingsDB,
    t: float,
    code: str,
    subject: str,
    b: boards.Board | None,
    severity: str = "critical",
    rule: str = "gpu-lost",
) -> None:
    """One finding that fires and resolves, as the diagnosis loop records it."""
    for old, new, at in (
        ("inactive", "pending", t),
        ("pending", "firing", t + 1),
        ("firing", "resolved", t + 600),
    ):
        rec = transition_record(
            at,
            rule,
            subject,
            code,
            severity,
            old,
            new,
            f"{code} on {subject}",
            {"actions": [{"kind": "reset_gpu"}]},
        )
        if b is not None and new == "firing":
            rec["board"] = boards.board_row(b, rec["finding"])
        db.record_transition(rec)


def policy() -> boards.BoardPolicy:
    return boards.load_policy()


def test_the_shipped_thresholds_load_and_cite_their_sources() -> None:
    p = policy()
    assert set(p.hardware_codes) <= set(CODES)
    assert all(t.source for t in p.thresholds)
    assert min(t.incidents for t in p.thresholds) >= 2


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("hardware_codes: {NOT_A_CODE: warning}\nwindow: 30d\n", ":1: hardware_codes.NOT_A_CODE"),
        (
            "hardware_codes: {GPU_LOST: warning}\nwindow: 30d\nthresholds:\n"
            "  - {name: x, codes: [GPU_LOST], incidents: 1, source: s}\n",
            ":4: thresholds[0].incidents",
        ),
        ("hardware_codes: {GPU_LOST: warning}\nwindow: soon\n", ":2: window"),
    ],
)
def test_a_bad_thresholds_file_names_file_line_and_key(text: str, where: str) -> None:
    with pytest.raises(LocatedError) as err:
        boards.parse_policy(text, "board-history.yaml", CODES)
    assert f"board-history.yaml{where}" in str(err.value)


def test_one_board_at_two_addresses_is_one_history_and_a_repeat(tmp_path: Path) -> None:
    with FindingsDB(tmp_path / FILE_NAME) as db:
        # lost at one address as gpu:3; after a reboot re-enumerated as gpu:0 elsewhere
        fired(db, NOW - 10 * DAY, "GPU_LOST", "gpu:3", board("0000:3b:00.0"))
        p = policy()
        assert db.board_facts(NOW, p, {"gpu:0": board("0000:86:00.0")})["gpu:0"].recurring == ""
        fired(db, NOW - DAY, "GPU_LOST", "gpu:0", board("0000:86:00.0"))
        facts = db.board_facts(NOW, p, {"gpu:0": board("0000:86:00.0")})["gpu:0"]
        assert (facts.incidents, facts.recurring) == (2, "bus")
        assert [(r["subject"], r["pci_bus_id"]) for r in facts.history] == [
            ("gpu:0", "0000:86:00.0"),
            ("gpu:3", "0000:3b:00.0"),
        ]
        assert facts.history[0]["resolved_at"] == NOW - DAY + 600
        assert facts.history[0]["actions"] == [{"kind": "reset_gpu"}]
        # another board (another serial) has none of it
        other = boards.Board("serial:0000000000001", "0000000000001", "", "0000:3b:00.0")
        assert db.board_facts(NOW, p, {"gpu:1": other})["gpu:1"].incidents == 0


def test_faults_outside_the_window_or_not_hardware_do_not_count(tmp_path: Path) -> None:
    with FindingsDB(tmp_path / FILE_NAME) as db:
        fired(db, NOW - 40 * DAY, "GPU_LOST", "gpu:0", board())
        fired(db, NOW - DAY, "GPU_LOST", "gpu:0", board())
        # a warning NVLINK_ERROR is a counter rising, not a fatal link: it does not count
        fired(
            db,
            NOW - DAY,
            "NVLINK_ERROR",
            "gpu:0",
            board(),
            severity="warning",
            rule="gpu-nvlink-errors",
        )
        facts = db.board_facts(NOW, policy(), {"gpu:0": board()})["gpu:0"]
        assert (facts.incidents, facts.recurring) == (1, "")


def test_three_of_any_mix_is_a_repeat(tmp_path: Path) -> None:
    with FindingsDB(tmp_path / FILE_NAME) as db:
        for i, code in enumerate(("GPU_LOST", "ECC_UNCORRECTABLE", "GSP_FIRMWARE_ERROR")):
            fired(db, NOW - (5 - i) * DAY, code, "gpu:0", board())
        facts = db.board_facts(NOW, policy(), {"gpu:0": board()})["gpu:0"]
        assert (facts.incidents, facts.recurring) == (3, "any")


def test_a_row_written_under_the_uuid_joins_the_board_once_the_serial_is_known(tmp_path):
    with FindingsDB(tmp_path / FILE_NAME) as db:
        fired(
            db,
            NOW - 3 * DAY,
            "ECC_UNCORRECTABLE",
            "gpu:0",
            boards.Board(f"uuid:{UUID}", "", UUID, "0000:3b:00.0"),
        )
        fired(db, NOW - DAY, "ECC_UNCORRECTABLE", "gpu:0", board())
        facts = db.board_facts(NOW, policy(), {"gpu:0": board()})["gpu:0"]
        assert (facts.incidents, facts.recurring) == (2, "memory")


def test_board_of_reads_the_serial_of_the_nvml_gpu_at_the_kernel_lines_address() -> None:
    attrs = {
        "gpu:0": {"serial": SERIAL, "uuid": UUID, "pci_bus_id": "0000:3b:00.0"},
        "gpu:0000:3b:00.0": {},
        "gpu:0000:5e:00.0": {},
    }
    assert boards.board_of("gpu:0000:3b:00.0", attrs) == board("0000:3b:00.0")
    assert boards.board_of("gpu:0", attrs) == board("0000:3b:00.0")
    assert boards.board_of("gpu:0000:5e:00.0", attrs) == boards.Board(
        "pci:0000:5e:00.0", "", "", "0000:5e:00.0"
    )
    assert boards.board_of("node", attrs) is None


def xid_event(line: str, t: float, subject: str, process: str | None = None) -> Event:
    fields = parse_xid(line)
    assert fields is not None
    if process is not None:
        fields["process"] = process
    return Event("kernel.xid", subject, t, fields, line)


CASES = (FIXTURES / "xid-location" / "cases.jsonl").read_text().splitlines()
XID31 = json.loads(CASES[3])["line"]  # gpud's README: pid=626486, name=pt_main_thread
XID13 = [json.loads(x)["line"] for x in CASES[:2]]  # gpud's README: (GPC 7, TPC 7, SM 0)


def test_one_program_at_one_place_is_the_application(tmp_path: Path) -> None:
    """gpud's public Xid 31 (pt_main_thread, GRAPHICS GPCCLIENT_T1_14), twice: one program
    repeating; the Xid 13 burst names no process at all."""
    with FindingsDB(tmp_path / FILE_NAME) as db:
        db.record_events(
            [
                xid_event(XID31, NOW - 2 * DAY, "gpu:0000:3b:00.0"),
                xid_event(XID31, NOW - DAY, "gpu:0000:3b:00.0"),
                *(xid_event(line, NOW - 3600, "gpu:0000:3b:00.0") for line in XID13),
            ]
        )
        facts = db.board_facts(NOW, policy(), {"gpu:0": board()})["gpu:0"]
    assert facts.location_processes == ["pt_main_thread"]
    assert facts.location == "GRAPHICS GPCCLIENT_T1_14"


def test_two_programs_at_one_place_within_the_window(tmp_path: Path) -> None:
    """The stored fields of two faults at the same place from two programs (the second
    event's process field set here: structured data as the kernel collector stores it,
    not a log line)."""
    with FindingsDB(tmp_path / FILE_NAME) as db:
        db.record_events(
            [
                xid_event(XID31, NOW - 3 * DAY, "gpu:0"),
                xid_event(XID31, NOW - 8 * DAY, "gpu:0", process="vllm"),  # outside 7 days
            ]
        )
        assert db.board_facts(NOW, policy(), {"gpu:0": board()})["gpu:0"].location_processes == [
            "pt_main_thread"
        ]
        db.record_events([xid_event(XID31, NOW - DAY, "gpu:0", process="vllm")])
        facts = db.board_facts(NOW, policy(), {"gpu:0": board()})["gpu:0"]
    assert facts.location_processes == ["pt_main_thread", "vllm"]


def test_the_history_survives_a_salvage(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    path = state / FILE_NAME
    with FindingsDB(path) as db:
        fired(db, NOW - 10 * DAY, "GPU_LOST", "gpu:3", board("0000:3b:00.0"))
        fired(db, NOW - DAY, "GPU_LOST", "gpu:0", board("0000:86:00.0"))
        db.flush()
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[16:18], "big") or 65536
    # damage a page of the transitions table's index only: the file fails its check
    conn = sqlite3.connect(path)
    root = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'transitions_t'"
    ).fetchone()[0]
    conn.close()
    data[(root - 1) * size : root * size] = b"\xa5" * size
    path.write_bytes(bytes(data))
    with FindingsDB(path) as db:
        health = db.health.as_dict()
        facts = db.board_facts(NOW, policy(), {"gpu:0": board("0000:86:00.0")})["gpu:0"]
    assert health["quarantined"], health
    assert (facts.incidents, facts.recurring) == (2, "bus")


def test_the_diagnosis_loop_raises_both_codes_from_the_history(tmp_path: Path) -> None:
    clock = VirtualClock(NOW)
    store = SignalStore()
    d = build_diagnosis(store, tmp_path / "state", clock=clock)
    d.db.open()
    try:
        fired(d.db, NOW - 10 * DAY, "GPU_LOST", "gpu:3", board("0000:3b:00.0"))
        fired(d.db, NOW - DAY, "GPU_LOST", "gpu:0", board("0000:86:00.0"))
        d.db.record_events(
            [
                xid_event(XID31, NOW - 3 * DAY, "gpu:0"),
                xid_event(XID31, NOW - DAY, "gpu:0", process="vllm"),
            ]
        )
        b = Batch()
        b.describe("gpu:0", serial=SERIAL, uuid=UUID, pci_bus_id="0000:86:00.0", index="0")
        b.add("gpu.info", "gpu:0", 1.0)
        store.ingest("nvml", b, NOW)
        d.tick(NOW)
        clock.advance(1)
        d.tick()
        active = {(f.code, f.subject) for f in d.rules.active()}
    finally:
        d.db.close()
    assert ("GPU_FAULT_RECURRING", "gpu:0") in active
    assert ("GPU_FAULT_SAME_LOCATION", "gpu:0") in active


def test_history_command_lists_a_board_by_serial_and_subject_and_writes_nothing(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    with FindingsDB(state / FILE_NAME) as db:
        fired(db, NOW - 10 * DAY, "GPU_LOST", "gpu:3", board("0000:3b:00.0"))
        fired(
            db,
            NOW - DAY,
            "ECC_UNCORRECTABLE",
            "gpu:0",
            board("0000:86:00.0"),
            rule="gpu-ecc-uncorrectable",
        )
    config = tmp_path / "moptd.yaml"
    config.write_text(f"state_dir: {state}\n")
    before = (state / FILE_NAME).read_bytes()

    def history(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "moptd", "history", "--config", str(config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    out = history("gpu:0", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["faults"]
    assert [(r["code"], r["subject"], r["pci_bus_id"]) for r in rows] == [
        ("ECC_UNCORRECTABLE", "gpu:0", "0000:86:00.0"),
        ("GPU_LOST", "gpu:3", "0000:3b:00.0"),
    ]
    assert {r["serial"] for r in rows} == {SERIAL}
    assert json.loads(history(SERIAL, "--json").stdout)["faults"] == rows
    text = history().stdout
    assert f"Board serial:{SERIAL} ({SERIAL}, {UUID}): 2 hardware faults" in text
    assert "GPU_LOST (critical) on gpu:3 (0000:3b:00.0)" in text
    assert "advised: reset_gpu" in text
    assert history("gpu:7").stdout.strip() == "No hardware faults recorded for gpu:7."
    # the database is opened read-only: not a byte of it changes (SQLite may create an
    # empty -wal/-shm beside a WAL database it reads, as for `moptd explain --offline`)
    assert (state / FILE_NAME).read_bytes() == before
    missing = tmp_path / "none.yaml"
    missing.write_text(f"state_dir: {tmp_path / 'nowhere'}\n")
    gone = subprocess.run(
        [sys.executable, "-m", "moptd", "history", "--config", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gone.returncode == 1
    assert "no readable findings database" in gone.stderr


def test_a_board_known_only_by_its_address_finds_the_faults_recorded_there(tmp_path):
    """NVML down, no UUID line: the address is all there is (the query joins findings,
    which has a pci_bus_id of its own)."""
    at = boards.Board("pci:0000:3b:00.0", "", "", "0000:3b:00.0")
    with FindingsDB(tmp_path / FILE_NAME) as db:
        fired(db, NOW - 3 * DAY, "GPU_LOST", "gpu:0000:3b:00.0", at)
        fired(db, NOW - DAY, "GPU_LOST", "gpu:0", board("0000:3b:00.0"))
        facts = db.board_facts(NOW, policy(), {"gpu:0000:3b:00.0": at})["gpu:0000:3b:00.0"]
    assert (facts.incidents, facts.recurring) == (2, "bus")
