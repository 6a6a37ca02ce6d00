"""`moptd explain`: golden output for people and scripts, subject matching, bad input.

Set MOPTD_UPDATE_GOLDEN=1 to rewrite the golden files after a deliberate change.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from moptd.cli.cmd_explain import add_related, enrich
from moptd.cli.render_explain import print_explain
from moptd.findings.matching import matches
from tests.conftest import FIXTURES, REPO

GOLDEN = Path(__file__).parent / "golden"
GSP_BUNDLE = FIXTURES / "scenarios" / "gsp-xid119-h100-xe9680"
ENV = {**os.environ, "COLUMNS": "100", "TZ": "UTC"}


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MOPTD_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with MOPTD_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def moptd(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        cwd=cwd,
    )


# A GPU_LOST as the daemon's API returns it (ids, decision steps, kernel evidence).
GPU_LOST = {
    "id": 7,
    "code": "GPU_LOST",
    "subject": "gpu:0000:3b:00.0",
    "severity": "critical",
    "rule": "gpu-lost",
    "state": "firing",
    "summary": "gpu:0000:3b:00.0 (0000:3b:00.0) is lost: drain and reboot the node",
    "pending_since": 1795969286.0,
    "first_seen": 1795969286.0,
    "last_seen": 1795969400.0,
    "pci_bus_id": "0000:3b:00.0",
    "evidence": {"xids": 1},
    "path": ["gpu-lost/xid79"],
    "steps": [
        {
            "node": "gpu-lost/nvml-lost",
            "cond": "gpu.lost == 1",
            "value": None,
            "seen": [{"name": "gpu.lost", "value": None, "text": "unknown"}],
        },
        {
            "node": "gpu-lost/xid79",
            "cond": "xid_lost_seen",
            "value": True,
            "seen": [
                {"name": "count(kernel.xid, 1h, code in xid_lost)", "value": 1.0, "text": "1"}
            ],
        },
    ],
    "actions": [
        "drain_node: kubectl drain $(hostname) --ignore-daemonsets --delete-emptydir-data",
        "reboot_node: systemctl reboot",
    ],
    "runbook": "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
    "events": [
        {
            "t": 1795969285.5,
            "stream": "kernel.xid",
            "subject": "gpu:0000:3b:00.0",
            "text": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
            "GPU has fallen off the bus.",
            "fields": {"code": 79, "pci_bus_id": "0000:3b:00.0"},
        },
    ],
    "related": [
        {
            "id": 8,
            "code": "GPU_RESET_REQUIRED",
            "subject": "gpu:0000:3b:00.0",
            "severity": "critical",
            "state": "firing",
            "summary": "reset asked",
        }
    ],
}


def render(view: dict, terminal: bool = False) -> str:
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=100,
        force_terminal=terminal,
        highlight=False,
        color_system="standard" if terminal else None,
    )
    print_explain(view, console)
    return buf.getvalue()


def test_gpu_lost_reads_well_as_plain_text():
    view = {"time": 1795969586.0, "notes": [], "findings": [enrich(GPU_LOST)]}
    text = render(view)
    check_golden("explain_gpu_lost.txt", text)
    assert "\x1b[" not in text
    # what a person at 3 a.m. needs, in this order
    order = [
        "CRITICAL",
        "GPU_LOST",
        "is lost",
        "Decision path",
        "Evidence",
        "Xid (PCI:0000:3b:00): 79",
        "NVIDIA recommends",
        "RESTART_BM",
        "What to do",
        "1. drain_node",
        "2. reboot_node",
        "Related",
        "GPU_RESET_REQUIRED",
    ]
    positions = [text.index(s) for s in order]
    assert positions == sorted(positions)


def test_colour_on_a_terminal_only():
    view = {"time": 1795969586.0, "notes": [], "findings": [GPU_LOST]}
    assert "\x1b[" in render(view, terminal=True)


def test_no_findings_says_so():
    assert render({"time": 0, "notes": ["a note"], "findings": [], "asked": "gpu:3"}) == (
        "a note\nNo active findings for gpu:3.\n"
    )


def test_bundle_plain_output_golden():
    out = moptd("explain", "--bundle", str(GSP_BUNDLE.relative_to(REPO)))
    assert out.returncode == 0, out.stderr
    check_golden("explain_bundle_gsp.txt", out.stdout)


def test_bundle_json_golden_for_scripts():
    out = moptd("explain", "--json", "--bundle", str(GSP_BUNDLE.relative_to(REPO)))
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["source"] == "bundle"
    must = yaml.safe_load((GSP_BUNDLE / "expected.yaml").read_text())["must"]
    for want in must:
        assert any(f["code"] == want["code"] for f in body["findings"]), want
    check_golden("explain_bundle_gsp.json", out.stdout)


def test_bundle_filters_by_code_and_subject():
    rel = str(GSP_BUNDLE.relative_to(REPO))
    out = moptd("explain", "--json", "--bundle", rel, "--code", "gsp_firmware_error", "9b:00")
    body = json.loads(out.stdout)
    assert [f["code"] for f in body["findings"]] == ["GSP_FIRMWARE_ERROR"]
    out = moptd("explain", "--json", "--bundle", rel, "gpu:5")
    assert json.loads(out.stdout)["findings"] == []


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        ("0", True),
        ("gpu:0", True),
        ("GPU-1234", True),
        ("00000000:3B:00.0", True),
        ("0000:3b:00", True),
        ("3b:00.0", True),
        ("1", False),
        ("gpu:1", False),
        ("GPU-9999", False),
        ("node", False),
        ("vllm", False),
    ],
)
def test_subject_forms(asked, expected):
    gpus = [
        {"subject": "gpu:0", "index": "0", "uuid": "GPU-1234", "pci_bus_id": "00000000:3B:00.0"},
        {"subject": "gpu:1", "index": "1", "uuid": "GPU-9999", "pci_bus_id": "0000:5e:00.0"},
    ]
    f = {"subject": "gpu:0", "pci_bus_id": "0000:3b:00.0"}
    assert matches(f, asked, gpus) is expected


def test_serving_and_node_subjects():
    assert matches({"subject": "serving:vllm"}, "vllm", [])
    assert matches({"subject": "node"}, "node", [])
    assert not matches({"subject": "serving:vllm"}, "sglang", [])


def test_related_findings_share_a_gpu():
    fs = [
        {"code": "A", "subject": "gpu:0", "pci_bus_id": "0000:3b:00.0"},
        {"code": "B", "subject": "gpu:0000:3b:00.0", "pci_bus_id": "0000:3b:00.0"},
        {"code": "C", "subject": "node"},
    ]
    add_related(fs)
    assert [r["code"] for r in fs[0]["related"]] == ["B"]
    assert fs[2]["related"] == []


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path):
    out = moptd("explain", "--code", "NOT_A_CODE", "--offline")
    assert out.returncode == 2
    assert "unknown code 'NOT_A_CODE'" in out.stderr
    assert "Traceback" not in out.stderr
    out = moptd("explain", "--since", "last tuesday", "--offline")
    assert out.returncode == 2
    assert "--since" in out.stderr
    bad = tmp_path / "bundle"
    bad.mkdir()
    (bad / "bundle.yaml").write_text("format: something-else\n")
    out = moptd("explain", "--bundle", str(bad))
    assert out.returncode == 2
    assert "bundle.yaml" in out.stderr
    assert "Traceback" not in out.stderr


def offline_config(tmp_path: Path, **extra: object) -> Path:
    """A configuration whose daemon is not running, without the shared kernel log."""
    config = tmp_path / "moptd.yaml"
    settings = {
        "state_dir": str(tmp_path / "state"),
        "api": {"socket": str(tmp_path / "nowhere.sock")},
        "collectors": {"kernel": {"enabled": False}},
        **extra,
    }
    config.write_text(yaml.safe_dump(settings))
    return config


def test_offline_without_a_daemon_says_so(tmp_path):
    config = offline_config(tmp_path)
    out = moptd("explain", "--config", str(config))
    assert out.returncode == 0, out.stderr
    assert "The daemon is not reachable" in out.stdout
    assert "No findings database" in out.stdout
    assert "Ran one collection pass here" in out.stdout
    out = moptd("explain", "--config", str(config), "--offline", "--json")
    body = json.loads(out.stdout)
    assert body["source"] == "offline"
    assert any("--offline" in n for n in body["notes"])


def test_status_findings_part():
    from moptd.cli.render_explain import print_status_findings

    buf = io.StringIO()
    console = Console(file=buf, width=100, highlight=False, color_system=None)
    print_status_findings(
        {"findings": [GPU_LOST], "findings_store": {"state": "failing", "reason": "disk full"}},
        console,
    )
    text = buf.getvalue()
    assert "Findings store: failing: disk full" in text
    assert "CRITICAL  GPU_LOST  gpu:0000:3b:00.0" in text
    buf = io.StringIO()
    print_status_findings({"findings": []}, Console(file=buf, color_system=None))
    assert buf.getvalue() == "Findings: none active\n"


def test_offline_pass_runs_the_configured_rules_not_only_the_shipped_ones(tmp_path):
    """rules.paths (a rules.d override) is what the daemon runs, so explain --offline runs it
    too: a local rule that always holds shows up."""
    local = tmp_path / "rules.d"
    local.mkdir()
    (local / "local.rules.yaml").write_text(
        "schema: moptd.rules/v1\n"
        "rules:\n"
        "  - id: local-always\n"
        "    title: A local rule that always holds\n"
        "    layer: host\n"
        "    scope: node\n"
        "    status: experimental\n"
        "    for: 0s\n"
        "    decide:\n"
        "      - id: always\n"
        "        if: node.cpu_count > 0\n"
        "        verdict:\n"
        "          code: SWAP_ACTIVE\n"
        "          summary: local rule fired\n"
        "          actions: [{kind: inspect, command: 'true'}]\n"
        "          runbook: docs/runbooks/SWAP_ACTIVE.md\n"
    )
    from moptd.diagnose.loader import default_rules_dir

    config = offline_config(tmp_path, rules={"paths": [str(default_rules_dir()), str(local)]})
    out = moptd("explain", "--config", str(config), "--offline", "--json")
    assert out.returncode == 0, out.stderr
    rules = {f["rule"] for f in json.loads(out.stdout)["findings"]}
    assert "local-always" in rules
