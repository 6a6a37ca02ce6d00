"""The NVIDIA daemons' own logs (issue 29): Fabric Manager's and nvidia-persistenced's
journals, Fabric Manager's log file and nvidia-container-cli's errors, read by
moptd.kernel.daemon_log, live by the daemon_logs collector and in replay over a bundle's
files or a paste. Lines: tests/fixtures/daemon-logs (SOURCE.md) and
tests/fixtures/emitter-lines (the catalogs' `seen:` lines)."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from moptd.bundle.intake import read_inputs
from moptd.collector import CollectorContext, Unavailable
from moptd.collectors.daemon_journals import DaemonJournalCollector
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.replay import replay_timeline
from moptd.kernel.daemon_log import (
    CONTAINER_CLI,
    EMITTERS,
    FABRICMANAGER,
    MAX_TEXT,
    PERSISTENCED,
    Reader,
    parse_daemon_log,
    parse_line,
)

HERE = Path(__file__).parent / "fixtures"
LOGS = HERE / "daemon-logs"
LINES = HERE / "emitter-lines"
BUNDLE_YAML = "format: moptd-bundle/v1\nhost: h\ncaptured_at: '{at}'\n"


def _diagnoses(text: str, emitter: str | None = None) -> list[str]:
    recs = parse_daemon_log(text, emitter, 2025)
    return [str(e.fields["diagnosis"]) for e in Reader().events(recs, "t", 0.0)]


def test_container_cli_errors_inside_dockers_error_are_read_by_stage() -> None:
    text = (LOGS / "container-cli-docker.txt").read_text()
    recs = parse_daemon_log(text)
    assert [r.emitter for r in recs] == [CONTAINER_CLI] * 4
    # docker's wrapping (escaped newlines and quotes, ": unknown.") is not the message
    assert recs[1].message.endswith("libnvidia-fatbinaryloader.so.440.18: file exists")
    assert recs[2].message == "initialization error: nvml error: driver not loaded"
    assert _diagnoses(text) == [
        "UNCLASSIFIED_ERROR",  # mount error: the detail decides (catalog)
        "UNCLASSIFIED_ERROR",
        "DRIVER_NOT_LOADED",
        "UNCLASSIFIED_ERROR",
    ]


def test_fabric_manager_journal_parsed_by_program_then_message() -> None:
    text = (LINES / "fabricmanager.journal").read_text()
    recs = parse_daemon_log(text, None, 2025)
    assert {r.emitter for r in recs} == {FABRICMANAGER}
    assert all(r.t is not None for r in recs)
    assert _diagnoses(text) == ["DRIVER_VERSION_MISMATCH"] * 2


def test_systemd_and_other_programs_lines_are_not_the_daemons() -> None:
    text = (LOGS / "fm-cube-studio-29.journal").read_text()
    recs = parse_daemon_log(text, None, 2025)
    assert len(recs) == 3  # the start script's three; systemd's line is systemd's
    assert _diagnoses(text) == ["UNCLASSIFIED_ERROR", "FABRIC_MANAGER_NOT_READY"]


@pytest.mark.parametrize(
    "name",
    [
        "fm-nvtrust-128.journal",
        "persistenced-ollama-11932.journal",
        "persistenced-nvidia-persistenced-2.journal",
    ],
)
def test_healthy_starts_stops_and_signals_raise_nothing(name: str) -> None:
    text = (LOGS / name).read_text()
    assert parse_daemon_log(text, None, 2025)  # read, not passed over
    assert _diagnoses(text) == []


def test_a_bare_message_is_its_files_emitters() -> None:
    text = (LINES / "persistenced.txt").read_text()
    assert parse_daemon_log(text) == []  # whose? no program, no file: not guessed
    assert _diagnoses(text, PERSISTENCED) == ["DEVICE_NODE_PROBLEM"]


def test_fabric_manager_log_file_level_decides_error() -> None:
    """gpud's copy of a Fabric Manager log: its INFO records (multicast teams freed and
    allocated, "status:0") are no errors; its one [ERROR] record is quoted."""
    text = (LOGS / "gpud-fabricmanager.log").read_text()
    recs = parse_daemon_log(text)
    assert {r.emitter for r in recs} == {FABRICMANAGER}
    assert {r.level for r in recs} == {"INFO", "ERROR"}
    assert all(r.t is not None for r in recs)
    events = Reader().events(recs, "f", 0.0)
    assert [e.fields["diagnosis"] for e in events] == ["UNCLASSIFIED_ERROR"]
    assert events[0].fields["level"] == "ERROR"
    assert "non-fatal error 12028" in events[0].text


def test_unclassified_messages_are_tallied_per_emitter() -> None:
    text = (LOGS / "container-cli-docker.txt").read_text()
    events = Reader().events(parse_daemon_log(text), "t", 0.0)
    last = [e for e in events if e.fields["diagnosis"] == "UNCLASSIFIED_ERROR"][-1]
    assert "x1" in str(last.fields["messages"])
    assert last.fields["more"] == 0
    assert last.fields["matched"] == "mount error:"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from([None, *EMITTERS]))
def test_parser_never_raises_and_caps(text: str, emitter: str | None) -> None:
    for rec in parse_daemon_log(text * 3, emitter):
        assert rec.emitter in EMITTERS
        assert len(rec.message) <= MAX_TEXT


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="nvidia-contaerl: \\\"'.unknow", max_size=400))
@example("unknown")  # "mount error: unknown": runc's ": unknown" is wrapping (CI found it)
def test_container_cli_regex_stays_linear(tail: str) -> None:
    line = "x nvidia-container-cli: mount error: " + tail
    rec = parse_line(line)
    assert rec is not None
    assert rec.message.startswith("mount error")


@pytest.mark.parametrize("tail", ["\\", "\\n", " ", '"', ": unknown"])
def test_a_pathological_wrapping_costs_linear_time(tail: str) -> None:
    """Thousands of escapes, quotes or blanks after the message (a regex with a lazy
    message and a greedy tail took minutes on 8000 blanks): stripped in one pass."""
    import time

    line = "nvidia-container-cli: mount error: " + tail * (8000 // len(tail)) + "x"
    started = time.perf_counter()
    rec = parse_line(line)
    assert time.perf_counter() - started < 0.5
    assert rec is not None
    assert rec.message.startswith("mount error:")


# --- replay: bundles and pastes ---------------------------------------------------------


def _replay(
    inputs: list[str], stdin: bytes | None = None
) -> tuple[set[str], list[dict[str, object]]]:
    loaded = load_rules([default_rules_dir()])
    tl = read_inputs(inputs, stdin=io.BytesIO(stdin) if stdin is not None else None)
    report = replay_timeline(tl, loaded.ruleset)
    return {str(f["code"]) for f in report.findings}, tl.read


def _bundle(root: Path, files: dict[str, Path], at: str = "2025-09-18T04:00:00Z") -> Path:
    root.mkdir()
    (root / "bundle.yaml").write_text(BUNDLE_YAML.format(at=at))
    for rel, src in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / rel)
    return root


def test_replay_reads_the_fabric_manager_journal_of_a_bundle(tmp_path: Path) -> None:
    b = _bundle(
        tmp_path / "b",
        {"host/journal/nvidia-fabricmanager.txt": LINES / "fabricmanager.journal"},
        "2025-11-05T14:00:00Z",
    )
    codes, _ = _replay([str(b)])
    assert "DRIVER_VERSION_MISMATCH" in codes


def test_no_nvswitch_fabric_manager_exit_is_no_fabric_fault(tmp_path: Path) -> None:
    """cube-studio#29: two RTX 4090s, Fabric Manager finds no NVSwitch and exits. Quoted
    (never silent), but no FABRIC_MANAGER_NOT_READY: there is no fabric to wait for."""
    b = _bundle(
        tmp_path / "b",
        {"host/journal/nvidia-fabricmanager.txt": LOGS / "fm-cube-studio-29.journal"},
    )
    codes, _ = _replay([str(b)])
    assert "FABRIC_MANAGER_NOT_READY" not in codes
    assert "UNCLASSIFIED_ERROR" in codes


def test_fabric_manager_log_file_in_a_bundle(tmp_path: Path) -> None:
    log = tmp_path / "fabricmanager.log"
    # the start script's exit line as the journal quoted it (cube-studio#29), with no
    # NOTHING_TO_DO before it: Fabric Manager did not start
    line = (LOGS / "fm-cube-studio-29.journal").read_text().splitlines()[2]
    log.write_text(line + "\n")
    b = _bundle(tmp_path / "b", {"host/fabricmanager.log": log})
    codes, read = _replay([str(b)])
    assert "FABRIC_MANAGER_NOT_READY" in codes
    assert any(e.get("as") == "host/fabricmanager.log" for e in read)


def test_persistenced_lines_inside_a_pasted_whole_journal(tmp_path: Path) -> None:
    """A `journalctl -b` paste is a kernel log to intake; the daemons' lines in it are read
    too (the kernel parser passes over another program's lines)."""
    healthy = (LOGS / "persistenced-ollama-11932.journal").read_bytes()
    codes, read = _replay(["-"], stdin=healthy)
    assert codes == set()
    assert [e["kind"] for e in read] == ["kernel-log"]


def test_persistenced_failure_inside_a_pasted_syslog() -> None:
    """Ubuntu Forums (T420): the syslog lines are a kernel-log paste; persistenced's
    "Failed to query NVIDIA devices" in it is read as DEVICE_NODE_PROBLEM."""
    text = (LOGS / "persistenced-t420-ubuntuforums.syslog").read_bytes()
    codes, read = _replay(["-"], stdin=text)
    assert [e["kind"] for e in read] == ["kernel-log"]
    assert codes == {"DEVICE_NODE_PROBLEM"}


def test_the_daemons_lines_pasted_without_the_stamp() -> None:
    """The same lines with the syslog stamp and host cut ("nvidia-persistenced: ..."): a
    paste of the daemon's own kind, laid as its journal."""
    lines = (LOGS / "persistenced-t420-ubuntuforums.syslog").read_text().splitlines()
    bare = "".join(line.split(" laurie-ThinkPad-T420s ", 1)[1] + "\n" for line in lines)
    codes, read = _replay(["-"], stdin=bare.encode())
    assert [(e["kind"], e.get("as")) for e in read] == [
        ("journal-nvidia-persistenced", "host/journal/nvidia-persistenced.txt")
    ]
    assert codes == {"DEVICE_NODE_PROBLEM"}


def test_a_pasted_container_cli_error_is_read_not_refused() -> None:
    text = (LOGS / "container-cli-docker.txt").read_bytes()
    codes, read = _replay(["-"], stdin=text)
    assert not [e for e in read if not e.get("used")]
    assert "container-cli" in {e["kind"] for e in read}
    assert {"UNCLASSIFIED_ERROR", "DRIVER_NOT_LOADED"} <= codes


def test_requirement_error_paste_is_cuda_driver_too_old() -> None:
    line = (LINES / "container-cli.txt").read_text().splitlines()[3]
    codes, read = _replay(["-"], stdin=(line + "\n").encode())
    assert [e["kind"] for e in read] == ["container-cli"]
    assert codes == {"CUDA_DRIVER_TOO_OLD"}


# --- the live collector -----------------------------------------------------------------


def _collector(tmp_path: Path, **options: object) -> DaemonJournalCollector:
    opts = {"units": [], "container_units": [], **options}
    return DaemonJournalCollector(CollectorContext(options=opts, host_root=tmp_path))


def test_live_log_file_read_from_where_the_last_pass_stopped(tmp_path: Path) -> None:
    log = tmp_path / "var/log/fabricmanager.log"
    log.parent.mkdir(parents=True)
    lines = (LINES / "fabricmanager.journal").read_text().splitlines(keepends=True)
    log.write_text(lines[0])
    c = _collector(tmp_path)
    try:
        first = asyncio.run(c.collect())
        assert [e.fields["diagnosis"] for e in first.events] == ["DRIVER_VERSION_MISMATCH"]
        assert asyncio.run(c.collect()).events == []  # nothing new
        with log.open("a") as fh:
            fh.write(lines[1])
        again = asyncio.run(c.collect())
        assert [e.text for e in again.events] == [lines[1].split(": ", 1)[1].strip()]
        # replaced by logrotate: read from its start
        log.unlink()
        log.write_text(lines[0])
        assert len(asyncio.run(c.collect()).events) == 1
    finally:
        asyncio.run(c.stop())


def test_live_log_file_that_cannot_be_read_is_said(tmp_path: Path) -> None:
    (tmp_path / "var/log/fabricmanager.log").mkdir(parents=True)  # not a file
    c = _collector(tmp_path)
    try:
        with pytest.raises(RuntimeError, match=r"cannot read .*fabricmanager\.log"):
            asyncio.run(c.collect())
    finally:
        asyncio.run(c.stop())


def test_no_log_file_is_no_fabric_manager(tmp_path: Path) -> None:
    c = _collector(tmp_path)
    try:
        assert asyncio.run(c.collect()).events == []
    finally:
        asyncio.run(c.stop())


def test_without_journalctl_the_collector_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    c = _collector(tmp_path, units=["nvidia-persistenced"], fabricmanager_log="")
    try:
        with pytest.raises(Unavailable, match="journalctl not found"):
            asyncio.run(c.collect())
    finally:
        asyncio.run(c.stop())


@pytest.mark.skipif(shutil.which("journalctl") is None, reason="journalctl not installed")
def test_a_journal_that_cannot_be_read_is_said_not_empty(tmp_path: Path) -> None:
    """journalctl itself, over a host root without a journal: its refusal makes the
    collector unavailable with the reason (moptd status shows it; the rules read unknown),
    never an empty all-clear."""
    assert not (tmp_path / "var/log/journal").exists()
    c = _collector(tmp_path, units=["nvidia-fabricmanager"], fabricmanager_log="")
    try:
        with pytest.raises(Unavailable, match="journalctl -u nvidia-fabricmanager: "):
            asyncio.run(c.collect())
    finally:
        asyncio.run(c.stop())
    assert os.environ.get("PATH")


def _no_journal_here() -> bool:
    kept = [Path("/var/log/journal"), Path("/run/log/journal")]
    return shutil.which("journalctl") is not None and not any(
        p.is_dir() and any(p.rglob("*.journal")) for p in kept
    )


@pytest.mark.skipif(not _no_journal_here(), reason="this host keeps a journal")
def test_record_notes_a_journal_it_could_not_read(tmp_path: Path) -> None:
    """journalctl prints "-- No entries --" and exits 0 where no journal exists at all:
    `moptd record` notes that instead of writing an empty (healthy-looking) journal."""
    from moptd.record.writer import Recorder, RecordOptions

    opts = RecordOptions(duration=0.0, interval=1.0, kmsg=tmp_path / "no-kmsg")
    result = Recorder(opts).record(tmp_path / "bundle")
    assert not (tmp_path / "bundle/host/journal").exists()
    assert any(
        n.startswith("host/journal/nvidia-fabricmanager.txt: `journalctl") for n in result.notes
    )


def test_the_rules_name_catalog_entries_that_exist() -> None:
    """A rule that tells catalog entries apart (`matched == "..."`) names an entry's text;
    an edited catalog text would otherwise leave the rule matching nothing, silently."""
    import re

    from moptd.catalog.emitters import catalogs

    texts = {m.text for e in catalogs().values() for m in e.messages}
    rules = Path(__file__).parent.parent / "rules" / "driver"
    named = []
    for f in ("fabric-manager.rules.yaml", "daemon-logs.rules.yaml"):
        named += re.findall(r'matched == "((?:[^"\\]|\\.)*)"', (rules / f).read_text())
    assert named
    assert set(named) <= texts
