"""A snapshot is evidence (issue 17, scope 2): a ``for:`` one snapshot cannot establish is
reported as unconfirmed, and a snapshot's state holds until newer evidence of its kind.

The bundles are real pastes (tests/fixtures/snapshot-evidence/SOURCE.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moptd.bundle import read_bundle
from moptd.cli.cmd_explain import bundle_view
from moptd.diagnose.engine import Result
from moptd.diagnose.lifecycle import Lifecycle
from moptd.diagnose.loader import default_rules_dir
from moptd.diagnose.model import Rule, Verdict
from moptd.diagnose.replay import UNCONFIRMED, ReplayReport, replay

FIXTURES = Path(__file__).parent / "fixtures" / "snapshot-evidence"
X8 = FIXTURES / "pcie-x8-rtx5090"
X8_LATER_LOG = FIXTURES / "pcie-x8-rtx5090-later-kernel-log"
DUMP_TIME = 1746033758.0  # the dump's own Timestamp, Wed Apr 30 17:22:38 2025 (UTC)


def _replay(bundle: Path) -> ReplayReport:
    return replay(bundle, [default_rules_dir()], read_bundle)


def _pcie(report: ReplayReport) -> list[dict[str, object]]:
    return [f for f in report.findings if f["code"] == "PCIE_LINK_DEGRADED"]


def test_one_dump_at_x8_of_x16_is_reported_unconfirmed() -> None:
    report = _replay(X8)
    assert report.steps == 1
    [f] = _pcie(report)
    assert f["subject"] == "gpu:0"
    assert f["pci_bus_id"] == "0000:02:00.0"
    assert f["state"] == "unconfirmed"
    assert f["note"] == UNCONFIRMED
    assert f["first_seen"] == DUMP_TIME
    assert f["evidence"]["width"] == 8
    assert f["evidence"]["width_max"] == 16
    assert f["path"] == ["gpu-pcie-link/width"]
    json.dumps(report.to_json())  # what `replay --json` prints


def test_explain_bundle_keeps_the_unconfirmed_state() -> None:
    view = bundle_view([str(X8)])
    assert view is not None
    [f] = [f for f in view["findings"] if f["code"] == "PCIE_LINK_DEGRADED"]
    assert f["state"] == "unconfirmed"
    assert f["note"] == UNCONFIRMED


def _unknown_on(report: ReplayReport, subject: str) -> set[str]:
    return {str(u["rule"]) for u in report.unknown if u["subject"] == subject}


def test_a_log_from_7_minutes_later_does_not_undecide_the_dump() -> None:
    alone = _replay(X8)
    mixed = _replay(X8_LATER_LOG)
    # the log's lines are steps 7 minutes after the dump (else this test proves nothing)
    assert mixed.steps > 1
    assert mixed.meta["boot_time"] + 38 > DUMP_TIME + 5 * 60
    # every GPU rule the dump alone decided is still decided at the end
    assert _unknown_on(mixed, "gpu:0") <= _unknown_on(alone, "gpu:0")
    assert "gpu-pcie-link" not in _unknown_on(mixed, "gpu:0")
    # the width seen once still holds, and one snapshot still spans no minute of for:
    [f] = _pcie(mixed)
    assert f["state"] == "unconfirmed"
    assert f["first_seen"] == DUMP_TIME
    assert float(str(f["last_seen"])) > DUMP_TIME + 5 * 60


def _rule(for_: float) -> Rule:
    return Rule("r", "t", "hardware", "gpu", "stable", for_, 0.0, (), (), "f", 1)


def _match(rule: Rule) -> Result:
    verdict = Verdict("PCIE_LINK_DEGRADED", "warning", "s", (), "")
    return Result(rule, "gpu:0", "match", verdict=verdict)


@pytest.mark.parametrize(
    ("evidence_at", "fires"),
    [
        (None, True),  # the daemon: the clock's time counts
        (0.0, False),  # one snapshot at 0, held over to 120: no minute is established
        (90.0, True),  # newer evidence at 90 still shows it: 90 s held
    ],
)
def test_for_counts_only_over_evidence(evidence_at: float | None, fires: bool) -> None:
    rule = _rule(60.0)
    life = Lifecycle()
    until = None if evidence_at is None else (lambda _res: min(evidence_at, 120.0))
    life.update([_match(rule)], 0.0, None if until is None else (lambda _res: 0.0))
    life.update([_match(rule)], 120.0, until)
    assert [f.state for f in life.findings.values()] == ["firing" if fires else "pending"]


def test_a_for_zero_rule_fires_on_evidence_older_than_its_step() -> None:
    life = Lifecycle()
    life.update([_match(_rule(0.0))], 420.0, lambda _res: 0.0)
    assert [f.state for f in life.findings.values()] == ["firing"]


# --- untimed lines: ordered, never dated 1970 ---

KERNEL_ONLY = Path(__file__).parent / "fixtures" / "kernel-only-gpu" / "gpud_sxid_readme_xid79.txt"
OOM_ONLY = Path(__file__).parent / "fixtures" / "bundles" / "vllm-log-oom-plain"


def _kernel_only_bundle(root: Path) -> Path:
    (root / "kernel").mkdir(parents=True)
    (root / "kernel" / "dmesg.txt").write_bytes(KERNEL_ONLY.read_bytes())
    (root / "bundle.yaml").write_text("format: moptd-bundle/v1\nhost: pasted\n")
    return root


def test_dmesg_in_seconds_since_boot_alone_is_relative_to_boot(tmp_path: Path) -> None:
    report = _replay(_kernel_only_bundle(tmp_path / "b"))
    out = report.to_json()
    assert out["untimed"] is True
    assert out["relative_to"] == "kernel boot"
    assert report.steps == 2  # the lines keep their own order and spacing
    [f] = [f for f in report.findings if f["code"] == "GPU_LOST"]
    assert f["first_seen"] is None
    assert f["last_seen"] is None
    assert f["relative"] == {
        "to": "kernel boot",
        "first_seen": 6781741.548779,  # the Xid 79 line's own stamp
        "last_seen": 6781741.548783,  # the "fallen off the bus" line after it
    }
    assert "seconds since kernel boot" in report.time_note()


def _printed(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "moptd", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TZ": "UTC", "COLUMNS": "200"},
        check=False,
    )
    assert "Traceback" not in proc.stderr
    return proc.stdout + proc.stderr


def test_untimed_findings_are_never_dated_1970(tmp_path: Path) -> None:
    bundle = _kernel_only_bundle(tmp_path / "b")
    for args in (("replay", str(bundle)), ("explain", "--bundle", str(bundle))):
        text = _printed(*args)
        assert "GPU_LOST" in text
        assert "1970" not in text
        assert "seconds since kernel boot" in text


def test_a_log_line_without_a_time_of_its_own_is_marked() -> None:
    # a pasted vLLM traceback: no line carries a date; the bundle has captured_at only
    report = _replay(OOM_ONLY)
    [f] = [f for f in report.findings if f["code"] == "CUDA_OOM"]
    assert f["untimed"] is True
    assert f["first_seen"] is None
    assert "1970" not in _printed("replay", str(OOM_ONLY))
