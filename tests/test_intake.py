"""Any paste in (issue 17 item 1): content sniffing, ticket sections, raw files, stdin,
several inputs, misnamed files in a bundle, the read list and the exit status.

Every text here is a real capture (tests/fixtures/*/SOURCE.md); a ticket body is built by
concatenating captures, never by writing a line.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.bundle import classify, intake
from moptd.bundle.classify import sniff, split
from moptd.bundle.intake import gather, read_inputs, unusable
from moptd.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "h200"
PASTES = FIXTURES / "intake"
GSP_BUNDLE = FIXTURES / "scenarios" / "gsp-xid119-h100-xe9680"
XID119 = FIXTURES / "kernel-peers" / "gpud-dmesg-with-xid-119.log"
REPO = Path(__file__).parent.parent


def kinds(text: str) -> list[str]:
    return [s.kind for s in split(text) if s.kind != "prose"]


# --- one capture, one kind ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (H200 / "dmesg.txt", "kernel-log"),
        (H200 / "kmsg_raw.txt", "kernel-log"),
        (FIXTURES / "kernel-peers" / "gpud-dmesg-with-xid-119.log", "kernel-log"),  # dmesg -T
        (FIXTURES / "kernel-peers" / "gpud-memory-dmesg.decode.iso.log", "kernel-log"),
        (FIXTURES / "kernel-drill" / "xid48.log", "kernel-log"),  # syslog, kernel: [uptime]
        (FIXTURES / "kernel-drill" / "api-mismatch.log", "kernel-log"),  # journalctl -k
        (FIXTURES / "kernel-drill" / "xid94.log", "kernel-log"),  # no stamp, as NVIDIA prints
        (FIXTURES / "kernel-drill" / "fallen-off-no-xid.log", "kernel-log"),
        (PASTES / "mattshma-133-dmesg.txt", "kernel-log"),  # unstamped continuation lines
        (PASTES / "tuxedo-186-journal.txt", "kernel-log"),  # journal of a user-space unit
        (H200 / "nvsmi_idle.txt", "nvidia-smi-q"),
        (H200 / "nvsmi_idle.xml", "nvidia-smi-xml"),
        (H200 / "nvsmi_table_idle.txt", "nvidia-smi-table"),
        (H200 / "nvsmi_table_load.txt", "nvidia-smi-table"),
        (H200 / "proc_modules", "proc-modules"),
        (H200 / "dev_nodes.txt", "dev-nodes"),
        (H200 / "proc_driver_nvidia_version", "driver-version"),
        (H200 / "uname_r", "uname-r"),
        (H200 / "meminfo", "meminfo"),
        (H200 / "df.txt", "df"),
        (H200 / "nvml_samples.jsonl", "moptd-samples"),
        (H200 / "oom_plain.txt", "python-log"),
        (PASTES / "negativo17-56-dkms-status.txt", "dkms-status"),
        (PASTES / "tinygrad-20-rmmod.txt", "modprobe"),
        (PASTES / "gpud-pstore-dmesg-erst.txt", "kernel-log"),  # <level>[uptime]
        (PASTES / "open-gpu-1150-kernel-prefix.txt", "kernel-log"),  # kernel: NVRM: ...
        (PASTES / "gpud-870-dmesg-decode-syslog.txt", "kernel-log"),  # syslog:err : iso
        (PASTES / "open-gpu-1151-journal.txt", "kernel-log"),
        (PASTES / "open-gpu-421-nvsmi-excerpt.txt", "nvidia-smi-q"),  # a dump's middle
        (PASTES / "gpud-fabricmanager.log", "fabricmanager-log"),
        (PASTES / "trtllm-260-oom.txt", "trtllm-log"),
        (PASTES / "sglang-8826-scheduler.txt", "sglang-log"),
        (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_idle.txt", "prometheus"),
    ],
    ids=lambda v: v.name if isinstance(v, Path) else v,
)
def test_a_capture_is_one_section_of_its_kind(path: Path, kind: str) -> None:
    assert kinds(path.read_text()) == [kind]


def test_a_whole_vllm_log_is_one_log_with_the_lines_of_no_known_shape() -> None:
    # vLLM's own lines, a progress bar and warnings between them: one serving log
    sections = split((FIXTURES / "vllm-cpu" / "vllm_cpu_server_log.txt").read_text())
    assert set(kinds((FIXTURES / "vllm-cpu" / "vllm_cpu_server_log.txt").read_text())) == {
        "vllm-log"
    }
    assert classify.whole_file_kind(sections) == "vllm-log"


def test_nvidia_smi_failure_and_its_version_line() -> None:
    sections = split((PASTES / "intel-llvm-17614-nvml-mismatch.txt").read_text())
    assert [(s.kind, s.first, s.last) for s in sections] == [
        ("prose", 1, 1),
        ("nvidia-smi-failure", 2, 3),
    ]


def test_a_shell_session_from_a_ticket_is_cut_by_kind() -> None:
    sections = split((PASTES / "nvidia-docker-365-ticket.txt").read_text())
    assert [(s.kind, s.first, s.last) for s in sections] == [
        ("prose", 1, 1),  # $ nvidia-smi
        ("modprobe", 2, 2),  # nvidia-smi runs modprobe first
        ("nvidia-smi-failure", 3, 3),
        ("prose", 5, 5),
        ("modprobe", 6, 6),
        ("prose", 7, 7),
        ("modprobe", 8, 8),
        ("prose", 9, 12),  # dkms not installed, uname -a
    ]
    sections = split((PASTES / "broadcom-wl-22-ticket.txt").read_text())
    assert [(s.kind, s.first, s.last) for s in sections if s.kind != "prose"] == [
        ("dkms-status", 7, 7)
    ]


def _ticket(*parts: Path) -> str:
    """Captures one after another, a blank line apart, as a ticket body holds them."""
    return "\n".join(p.read_text().rstrip("\n") + "\n" for p in parts)


def test_a_ticket_body_of_several_captures_is_split_back_into_them() -> None:
    parts = [
        H200 / "nvsmi_table_idle.txt",
        XID119,
        H200 / "nvsmi_idle.txt",
        H200 / "nvsmi_idle.xml",
        H200 / "nvsmi_table_load.txt",
        PASTES / "intel-llvm-17614-nvml-mismatch.txt",
        H200 / "proc_driver_nvidia_version",
        H200 / "dev_nodes.txt",
        FIXTURES / "vllm-cpu" / "vllm_cpu_engine_core_killed.txt",
    ]
    text = _ticket(*parts)
    assert kinds(text) == [
        "nvidia-smi-table",
        "kernel-log",
        "nvidia-smi-q",
        "nvidia-smi-xml",
        "nvidia-smi-table",
        "nvidia-smi-failure",
        "driver-version",
        "dev-nodes",
        "vllm-log",  # one log, its progress bars between blank lines included
    ]
    # each section holds exactly its capture's lines
    sections = [s for s in split(text) if s.kind != "prose"]
    for s, part in zip(sections[:5], parts[:5], strict=True):
        assert s.text.strip("\n") == part.read_text().strip("\n"), part.name


def test_two_dumps_back_to_back_are_two_documents() -> None:
    text = (H200 / "nvsmi_idle.xml").read_text() + (H200 / "nvsmi_load.xml").read_text()
    assert kinds(text) == ["nvidia-smi-xml", "nvidia-smi-xml"]
    text = (H200 / "nvsmi_idle.txt").read_text() + (H200 / "nvsmi_load.txt").read_text()
    assert kinds(text) == ["nvidia-smi-q", "nvidia-smi-q"]


# --- sniffing raw bytes --------------------------------------------------------------------


def test_sniff_names_what_is_not_text() -> None:
    assert sniff(b"").kind == "empty"
    assert sniff(b" \n\n").kind == "empty"
    assert sniff((H200 / "dmesg.txt").read_bytes()).kind == "text"
    assert sniff(bytes(range(256)) * 4).kind == "binary"
    buf = io.BytesIO()
    import gzip

    with gzip.GzipFile(fileobj=buf, mode="wb") as gz:
        gz.write((H200 / "dmesg.txt").read_bytes())
    assert sniff(buf.getvalue()).kind == "gzip"


# --- laying pastes into a bundle -----------------------------------------------------------


def test_pastes_are_laid_at_the_canonical_paths(tmp_path: Path) -> None:
    ticket = tmp_path / "ticket.txt"
    ticket.write_text(
        _ticket(XID119, H200 / "nvsmi_idle.txt", FIXTURES / "vllm-cpu" / "vllm_cpu_server_log.txt")
    )
    got = gather([str(ticket), str(H200 / "proc_modules"), str(H200 / "nvsmi_idle.xml")])
    try:
        root = got.root
        assert (root / "kernel/dmesg.txt").read_text().strip() == XID119.read_text().strip()
        assert (root / "gpu/nvidia-smi/001.txt").is_file()
        assert (root / "gpu/nvidia-smi/002.xml").read_text() == (
            H200 / "nvsmi_idle.xml"
        ).read_text()
        assert (root / "kernel/proc_modules").read_text() == (H200 / "proc_modules").read_text()
        assert (root / "serving/vllm/log.txt").is_file()
    finally:
        got.close()
    assert not root.exists()


def test_a_raw_kernel_log_replays_like_a_bundle(capsys: pytest.CaptureFixture[str]) -> None:
    # the dmesg -T of an Xid 119 incident (gpud's test data): GSP error on 0000:9b:00.0
    assert main(["replay", str(XID119), "--json"]) == 2  # the worst finding is critical
    out = json.loads(capsys.readouterr().out)
    gsp = next(f for f in out["findings"] if f["code"] == "GSP_FIRMWARE_ERROR")
    assert gsp["pci_bus_id"] == "0000:9b:00.0"
    (entry,) = out["read"]
    assert entry["kind"] == "kernel-log"
    assert entry["as"] == "kernel/dmesg.txt"
    assert entry["held"]["xid"] == 5
    assert entry["summary"] == "kernel log: 43 lines, 5 Xid, 2025-02-23 16:24-16:30 UTC"


def test_standard_input_is_read_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = io.TextIOWrapper(io.BytesIO(XID119.read_bytes()))
    monkeypatch.setattr(sys, "stdin", fake)
    assert main(["replay", "-", "-", "--json"]) == 3  # the second - is named, not read again
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert [e["kind"] for e in out["read"]] == ["kernel-log", "unreadable"]
    assert any(f["code"] == "GSP_FIRMWARE_ERROR" for f in out["findings"])
    assert "-: not used: standard input was already read" in captured.err


def test_several_inputs_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(GSP_BUNDLE), str(H200 / "nvsmi_idle.txt"), str(H200 / "dmesg.txt")]
    assert main(["replay", *args, "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    used = {(e["kind"], e["as"]) for e in out["read"] if e["used"]}
    assert ("kernel-log", "kernel/dmesg.txt") in used  # the bundle's own
    assert ("kernel-log", "kernel/dmesg-2.txt") in used  # the pasted one beside it
    assert ("nvidia-smi-q", "gpu/nvidia-smi/001.txt") in used
    assert "gpu/nvidia-smi" not in out["missing_evidence"]
    assert any(f["code"] == "GSP_FIRMWARE_ERROR" for f in out["findings"])


def test_the_terminal_report_starts_with_what_was_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ticket = tmp_path / "ticket.txt"
    ticket.write_text(_ticket(PASTES / "nvidia-docker-365-ticket.txt", H200 / "nvsmi_idle.txt"))
    main(["replay", str(ticket)])
    lines = capsys.readouterr().out.splitlines()
    # the answer `explain --bundle` gives: what was read first, then what was not
    assert lines[0] == f"Bundle {ticket}: 1 time step replayed."
    assert lines[1].startswith("Read ")
    assert (
        f"Read nvidia-smi -q: 1 \u00d7 NVIDIA H200, driver 580.159.04  ({ticket} lines 15-269)"
        in lines
    )
    assert any(f"Not used: {ticket} line 1: not a kind moptd reads" in ln for ln in lines)
    undecided = [ln for ln in lines if "undecided" in ln]
    assert len(undecided) == 1, undecided
    assert undecided[0].endswith("--verbose lists them")


def test_verbose_lists_the_undecided_rules(capsys: pytest.CaptureFixture[str]) -> None:
    main(["replay", str(H200 / "nvsmi_idle.txt"), "--verbose"])
    out = capsys.readouterr().out
    assert "Undecided for missing evidence (never read as healthy)" in out
    assert "gpu-lost/xid79: xid_lost_seen" in out


# --- a bundle directory with files at names it does not know --------------------------------


def test_a_misnamed_kernel_log_in_a_bundle_is_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(GSP_BUNDLE, bundle)
    (bundle / "kernel" / "dmesg.txt").rename(bundle / "kernel" / "dmesg.log")
    # was: exit 0, "No findings" for a dump holding an Xid 119
    assert main(["replay", str(bundle), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert any(f["code"] == "GSP_FIRMWARE_ERROR" for f in out["findings"])
    entry = next(e for e in out["read"] if e.get("misnamed"))
    assert entry["input"] == f"{bundle}/kernel/dmesg.log"
    assert entry["as"] == "kernel/dmesg.txt"
    assert "kernel/dmesg.txt" not in out["missing_evidence"]


def test_misnamed_nvidia_smi_and_a_top_level_vllm_log_are_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(FIXTURES / "scenarios" / "row-remap-pending-a10", bundle)
    dump = next((bundle / "gpu" / "nvidia-smi").iterdir())
    shutil.move(dump, bundle / "gpu" / "nvidia-smi.txt")
    shutil.rmtree(bundle / "gpu" / "nvidia-smi")
    shutil.copy(FIXTURES / "vllm-cpu" / "vllm_cpu_engine_core_killed.txt", bundle / "vllm.log")
    main(["replay", str(bundle), "--json"])
    out = json.loads(capsys.readouterr().out)
    placed = {e["input"].rsplit("/", 1)[-1]: e.get("as") for e in out["read"] if e.get("misnamed")}
    assert placed == {
        "nvidia-smi.txt": "gpu/nvidia-smi/001.txt",
        "vllm.log": "serving/vllm/log.txt",
    }
    expected = (bundle / "expected.yaml").read_text()
    assert "ROW_REMAP" in expected
    assert any(f["code"].startswith("ROW_REMAP") for f in out["findings"]), out["findings"]


def test_a_file_of_no_known_kind_in_a_bundle_is_named_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(GSP_BUNDLE, bundle)
    shutil.copy(FIXTURES / "kernel-drill" / "SOURCE.md", bundle / "notes.txt")
    assert main(["replay", str(bundle)]) == 3
    captured = capsys.readouterr()
    assert f"{bundle}/notes.txt: not used: not a kind moptd reads" in captured.err
    assert "notes.txt is not a name docs/bundle.md gives" in captured.err
    assert "GSP_FIRMWARE_ERROR" in captured.out  # the rest is still read and reported


def test_documentation_in_a_bundle_is_not_evidence_and_not_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # SOURCE.md and expected.yaml sit beside the evidence in every scenario bundle
    assert main(["replay", str(GSP_BUNDLE), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert unusable(out["read"]) == []


# --- bad input ---------------------------------------------------------------------------------


def test_empty_binary_and_oversized_inputs_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    garbage = tmp_path / "core"
    garbage.write_bytes(Path(sys.executable).resolve().read_bytes()[:8192])  # an ELF binary
    big = tmp_path / "big.log"
    shutil.copy(H200 / "dmesg.txt", big)  # 25 KiB, over the limit set here
    monkeypatch.setattr(intake, "MAX_INPUT_BYTES", 16384)
    code = main(["replay", str(empty), str(garbage), str(big), str(XID119)])
    captured = capsys.readouterr()
    assert code == 3
    assert f"{empty}: not used: empty" in captured.err
    assert f"{garbage}: not used: binary data" in captured.err
    assert f"{big}: not used: more than 16384 bytes, the limit for one input" in captured.err
    assert "GSP_FIRMWARE_ERROR" in captured.out  # the usable input is still read


def test_a_fabric_manager_log_is_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # its INFO records only (multicast teams set up and freed): read, nothing raised
    assert main(["replay", str(PASTES / "gpud-fabricmanager.log")]) == 0
    assert "Read NVIDIA Fabric Manager log" in capsys.readouterr().out


def test_a_missing_input_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.txt")]) == 3
    captured = capsys.readouterr()
    assert "nope.txt: not used: cannot read: No such file or directory" in captured.err
    assert "No findings: nothing could be read." in captured.out  # no green all-clear


def test_a_device_is_not_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "/dev/zero"]) == 3  # would never end
    assert "/dev/zero: not used: a device node, not a file" in capsys.readouterr().err


def test_a_truncated_dump_in_a_ticket_is_named_with_its_line_and_the_rest_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    xml = (H200 / "nvsmi_idle.xml").read_text().splitlines(keepends=True)
    ticket = tmp_path / "ticket.txt"
    # a dump cut off in the middle (a ticket's paste limit), then a kernel log
    ticket.write_text("".join(xml[:40]) + "\n" + XID119.read_text())
    assert main(["replay", str(ticket), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    bad = next(e for e in out["read"] if e["kind"] == "nvidia-smi-xml")
    assert bad["used"] is False
    assert bad["at"] == f"{ticket}:41", bad  # where the cut dump ends
    assert bad["failed"] is True
    assert "XML" in bad["reason"], bad
    assert bad["lines"] == [1, 40]
    assert any(f["code"] == "GSP_FIRMWARE_ERROR" for f in out["findings"])


# --- property-based ------------------------------------------------------------------------------

_LINES = [
    ln
    for p in (H200 / "dmesg.txt", H200 / "nvsmi_idle.txt", H200 / "nvsmi_table_idle.txt", XID119)
    for ln in p.read_text().splitlines()[:40]
]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.sampled_from(_LINES), st.text(max_size=200), st.just("")), max_size=60)
)
def test_split_covers_every_line_once_in_order(lines: list[str]) -> None:
    text = "\n".join(lines)
    sections = split(text)
    real = text.splitlines()
    seen: list[int] = []
    for s in sections:
        assert 1 <= s.first <= s.last <= len(real)
        assert s.lines == real[s.first - 1 : s.last]
        seen.extend(range(s.first, s.last + 1))
    assert seen == sorted(set(seen))
    covered = set(seen)
    assert all(n in covered for n, ln in enumerate(real, start=1) if ln.strip())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096))
def test_sniff_and_lay_never_raise(data: bytes) -> None:
    assert sniff(data).kind in {"text", "empty", "binary", "gzip", "bzip2", "xz", "zstd", "zip"}
    if sniff(data).kind == "text":
        split(data.decode("utf-8", "replace"))


def test_past_the_section_limit_the_rest_is_named_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a shell session of many commands: prompt and output alternate
    ticket = tmp_path / "ticket.txt"
    ticket.write_text((PASTES / "nvidia-docker-365-ticket.txt").read_text() * 40)
    assert main(["replay", str(ticket), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    last = out["read"][-1]
    assert last["kind"] == "skipped"
    assert last["failed"] is True
    assert last["lines"][1] == 480
    assert len(out["read"]) == classify.MAX_SECTIONS + 1


def test_past_the_stray_limit_files_are_named_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(GSP_BUNDLE, bundle)
    shutil.copy(H200 / "meminfo", bundle / "meminfo.txt")
    shutil.copy(H200 / "df.txt", bundle / "z-df.txt")
    monkeypatch.setattr(intake, "MAX_STRAYS", 1)
    assert main(["replay", str(bundle), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    by_input = {e["input"].rsplit("/", 1)[-1]: e for e in out["read"]}
    assert by_input["meminfo.txt"]["as"] == "host/meminfo"
    assert by_input["z-df.txt"]["kind"] == "skipped"


def test_cost_is_linear_on_hostile_lines() -> None:
    # lines built to make a backtracking pattern explode: every one is cut at
    # MAX_MATCH_CHARS and tested against two anchored patterns, so this takes milliseconds
    # (the bound is loose for a shared machine; quadratic behaviour takes minutes here)
    hostile = "\n".join(
        [
            "[" + " " * 200_000,
            "{" + '"a":' * 50_000,
            "nvidia, " + "1, " * 60_000,
            "a" * 300_000 + " : ",
            "Module " + " " * 100_000 + "Size",
        ]
        * 4
    )
    start = time.monotonic()
    split(hostile)
    assert time.monotonic() - start < 10


# --- the CLI end to end ---------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_reads_a_pipe_on_standard_input() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "moptd", "replay", "-", "--json"],
        input=_ticket(XID119, H200 / "nvsmi_idle.txt").encode(),
        capture_output=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    out = json.loads(proc.stdout)
    assert [e["kind"] for e in out["read"] if e["used"]] == ["kernel-log", "nvidia-smi-q"]


@pytest.mark.slow
def test_replay_help_explains_pasting() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "replay", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout
    assert "journalctl -k -b | moptd replay -" in out
    assert "3 an input" in out


def test_read_inputs_is_the_reader_for_one_bundle_too() -> None:
    tl = read_inputs([str(GSP_BUNDLE)])
    assert [e["kind"] for e in tl.read] == ["kernel-log"]
    assert tl.events


_ALL_LINES = [
    ln
    for p in [
        H200 / "dmesg.txt",
        H200 / "nvsmi_idle.txt",
        H200 / "nvsmi_idle.xml",
        H200 / "nvsmi_table_idle.txt",
        H200 / "proc_modules",
        H200 / "dev_nodes.txt",
        H200 / "proc_driver_nvidia_version",
        H200 / "meminfo",
        H200 / "df.txt",
        H200 / "nvml_samples.jsonl",
        XID119,
        PASTES / "nvidia-docker-365-ticket.txt",
        PASTES / "negativo17-56-dkms-status.txt",
        PASTES / "intel-llvm-17614-nvml-mismatch.txt",
        PASTES / "trtllm-260-oom.txt",
        FIXTURES / "vllm-cpu" / "vllm_cpu_engine_core_killed.txt",
    ]
    for ln in p.read_text().splitlines()[:30]
]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_ALL_LINES), st.just("")), min_size=1, max_size=80))
def test_any_paste_of_real_lines_reads_or_is_named_never_crashes(lines: list[str]) -> None:
    # shuffled and cut real lines: a dump cut short, a table without its header, a meminfo
    # of one line... each section reads or is named as not used with its line
    data = ("\n".join(lines) + "\n").encode()
    tl = read_inputs(["-"], io.BytesIO(data))
    assert tl.read
    for entry in tl.read:
        assert entry["used"] or entry["reason"]


def test_the_library_reader_classifies_misnamed_files_too(tmp_path: Path) -> None:
    # moptd.bundle.read_bundle (rule tests, the corpus, the bench) reads as the CLI does
    from moptd.bundle import read_bundle

    bundle = tmp_path / "b"
    shutil.copytree(GSP_BUNDLE, bundle)
    (bundle / "kernel" / "dmesg.txt").rename(bundle / "kernel" / "dmesg.log")
    tl = read_bundle(bundle)
    assert any(e.get("misnamed") == "kernel/dmesg.log" and e["used"] for e in tl.read)
    assert tl.events
    with pytest.raises(intake.BundleError, match=r"not a bundle directory or \.tar\.gz"):
        read_bundle(XID119)
