"""`moptd replay` over the real scenario bundles: every `must` found, no `must_not`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moptd.bundle import read_bundle
from moptd.cli import main
from moptd.diagnose.loader import default_rules_dir
from moptd.diagnose.replay import replay
from moptd.proc.pci import normalize_pci
from tests.expected_outcomes import check

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent
BUNDLES = sorted(
    [p for p in (FIXTURES / "scenarios").iterdir() if (p / "expected.yaml").exists()]
    + [p for p in (FIXTURES / "bundles").iterdir() if (p / "expected.yaml").exists()]
)
GOLDEN = Path(__file__).parent / "golden" / "replay_sw_thermal.txt"


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_scenario(bundle: Path) -> None:
    expected = yaml.safe_load((bundle / "expected.yaml").read_text())
    report = replay(bundle, [default_rules_dir()], read_bundle)
    check(expected, report.findings)
    for f in report.findings:
        assert f["path"]
        assert f["actions"]
        assert f["summary"]


@pytest.mark.slow
@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_scenario_through_the_cli(bundle: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "moptd", "replay", str(bundle), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    out = json.loads(proc.stdout)
    # the exit status says the worst finding, as doctor's (bundle spec, issue 17)
    worst = {"critical": 2, "warning": 1}
    assert proc.returncode == max(
        (worst.get(f["severity"], 0) for f in out["findings"]), default=0
    ), proc.stderr
    assert out["bundle"] == str(bundle)
    assert out["steps"] >= 1
    check(yaml.safe_load((bundle / "expected.yaml").read_text()), out["findings"])
    for f in out["findings"]:
        if str(f["subject"]).startswith("gpu:"):
            assert normalize_pci(str(f["pci_bus_id"])) == f["pci_bus_id"]


def test_gsp_bundle_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    bundle = FIXTURES / "scenarios" / "gsp-xid119-h100-xe9680"
    assert main(["replay", str(bundle), "--json"]) == 2  # critical: GSP_FIRMWARE_ERROR
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 5
    assert out["missing_evidence"] == [
        "container/daemon.json",
        "gpu/nvidia-smi",
        "host/dev_nodes.txt",
        "host/df.txt",
        "host/meminfo",
        "host/swappiness",
        "kernel/dkms_status.txt",
        "kernel/driver_version",
        "kernel/proc_modules",
        "kernel/tainted",
        "kernel/uname_r",
        "serving/",
    ]
    gsp = next(f for f in out["findings"] if f["code"] == "GSP_FIRMWARE_ERROR")
    assert gsp["subject"] == "gpu:0000:9b:00.0"
    assert gsp["pci_bus_id"] == "0000:9b:00.0"
    assert gsp["first_seen"] == 1740327858.0
    assert gsp["last_seen"] == 1740328213.0
    assert gsp["path"] == ["gpu-gsp-error/xid"]
    assert gsp["evidence"] == {"lines": 5}


def test_readable_report_golden(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    # The layers this repository's engine owns, so other layers' rules do not move the text.
    layers = [
        "rules/lists.rules.yaml",
        "rules/hardware",
        "rules/driver",
        "rules/container",
        "rules/host",
    ]
    args = [a for layer in layers for a in ("--rules", layer)]
    # exit 1: the worst finding is a warning (THERMAL_THROTTLE)
    assert main(["replay", "tests/fixtures/scenarios/sw-thermal-slowdown-h100x8", *args]) == 1
    out = capsys.readouterr().out
    if os.environ.get("MOPTD_UPDATE_GOLDEN"):
        GOLDEN.write_text(out)
    assert out == GOLDEN.read_text()
