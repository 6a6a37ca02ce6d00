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
from tests.conftest import FIXTURES, REPO, year_free

GOLDEN = Path(__file__).parent / "golden"
GSP_BUNDLE = FIXTURES / "scenarios" / "gsp-xid119-h100-xe9680"
ENV = {**os.environ, "COLUMNS": "100", "TZ": "UTC"}


def check_golden(name: str, text: str) -> None:
    text = year_free(text)
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


def render(
    view: dict, terminal: bool = False, verbose: bool = False, width: int = 100, colour: bool = True
) -> str:
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=terminal,
        highlight=False,
        color_system="standard" if terminal and colour else None,
    )
    print_explain(view, console, verbose=verbose)
    return buf.getvalue()


def test_gpu_lost_reads_well_as_plain_text():
    """--verbose: the whole finding, in the order the old default printed it (the commit that
    made the compact view the default moved this test to --verbose)."""
    view = {"time": 1795969586.0, "notes": [], "findings": [enrich(GPU_LOST)]}
    text = render(view, verbose=True)
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
    assert out.returncode == 3  # an input that could not be used, as `moptd replay`
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


# --- the default view: one screen, causes first ------------------------------------------

DRILL = FIXTURES / "explain-drill"


def drill_json() -> dict:
    out = moptd("explain", "--json", "--bundle", str(DRILL.relative_to(REPO)))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_gpu_lost_compact_golden():
    """The compact block: what, since when, the evidence, the first action whole, the runbook."""
    from moptd.cli.explain_facts import annotate, load_ruleset
    from moptd.diagnose.loader import default_rules_dir

    f = annotate(enrich(GPU_LOST), load_ruleset([default_rules_dir()]))
    text = render({"time": 1795969586.0, "notes": [], "findings": [f]})
    check_golden("explain_gpu_lost_compact.txt", text)
    assert text.startswith("1 problem: 1 critical, 0 warning, 0 info (--verbose: ")
    assert "Decision path (rule" not in text
    assert "NVIDIA recommends" not in text
    assert "unknown" not in text  # the undecided nvml-lost branch is for --verbose
    assert (
        "   run (1 of 2): kubectl drain $(hostname) --ignore-daemonsets --delete-emptydir-data\n"
        in (text)
    )
    assert "line: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python" in text
    assert "runbook: moptd explain --code GPU_LOST --runbook" in text


def test_drill_of_twenty_findings_fits_one_screen_golden():
    """22 findings from real captures (tests/fixtures/explain-drill/SOURCE.md), piped."""
    out = moptd("explain", "--bundle", str(DRILL.relative_to(REPO)))
    assert out.returncode == 0, out.stderr
    check_golden("explain_drill.txt", out.stdout)
    text = out.stdout
    # 22 since the Xid rules (issue 16, scope 2) read the fatal SXid and the Xid 154 Drain and
    # Reset of the same excerpts, which gave no finding before; 23 since the Xid 45 on dc:00
    # "caused by previous Xid 149" is read as the NVLink error it names (issue 17)
    assert "23 problems: " in text
    blocks = [line for line in text.splitlines() if line[:1].isdigit() and ". " in line[:4]]
    # the node-wide driver mismatch before any per-GPU finding; serving after the hardware
    assert "DRIVER_VERSION_MISMATCH on node" in blocks[0]
    assert "Start with 1: DRIVER_VERSION_MISMATCH on node" in text
    codes = [b.split()[2] for b in blocks]
    assert codes.index("GPU_LOST") < codes.index("ENGINE_DEAD")
    # the eight power-braked GPUs are one block, the reset that Xid 119 asks for sits under it
    assert sum("HW_SLOWDOWN" in b for b in blocks) == 1
    assert "HW_SLOWDOWN on gpu:0-7 (8 GPUs)" in text
    assert "   also: CRITICAL GPU_RESET_REQUIRED on gpu:4: " in text
    assert not any("GPU_RESET_REQUIRED on gpu:4" in b for b in blocks)
    # GPU identity where the subject alone does not say it
    assert "where: gpu 4 · 0000:9b:00.0 · GPU-" in text
    # the evidence that decided it, not every event on the subject: no SXid under the mismatch
    mismatch = text[text.index("1. ") : text.index("\n2. ")]
    assert "kernel.api_mismatch" in mismatch
    assert "SXid" not in mismatch
    # plurals
    assert "1 kernel.api_mismatch record " in text
    assert "5 kernel.xid records " in text
    assert "Decision path (rule" not in text


def test_drill_piped_wraps_no_command_or_url():
    text = moptd("explain", "--bundle", str(DRILL.relative_to(REPO))).stdout
    body = drill_json()
    commands = [s["text"] for f in body["findings"] for s in f["action_steps"] if s["command"]]
    assert "nvidia-smi -r -i 4" in commands
    shown = [c for c in set(commands) if c in text]
    assert shown, "no command printed"
    for c in shown:
        assert any(line.endswith(c) for line in text.splitlines()), c
    assert "Missing from the bundle (evidence unknown): container/daemon.json" in text
    assert max(map(len, text.splitlines())) > 100  # COLUMNS=100: nothing was cut to fit


def test_terminal_soft_wraps_commands_only():
    """On a narrow terminal rich may wrap prose, never a command: the terminal wraps it, and a
    copy of the line pastes as one command."""
    body = drill_json()
    text = render(body, terminal=True, width=50, colour=False)
    commands = [s["text"] for f in body["findings"] for s in f["action_steps"] if s["command"]]
    longest = max(commands, key=len)
    assert len(longest) > 50
    assert longest in text
    assert "moptd explain --code CODE --runbook" in text  # said once, in the header


def test_json_is_the_old_shape_plus_added_fields():
    body = drill_json()
    assert set(body) == {"source", "notes", "findings", "time", "asked", "read"}
    old = {
        "code", "subject", "severity", "rule", "summary", "first_seen", "last_seen",
        "evidence", "path", "actions", "runbook", "state", "events", "related",
    }  # fmt: skip
    added = {"action_steps", "decided_by", "attribution", "runbook_command"}
    for f in body["findings"]:
        optional = {"pci_bus_id", "resolved_at", "nvidia_actions"}
        optional |= {"drain"}  # where a drain step was fitted to the host (drain_fit.py)
        optional |= {"untimed", "note", "relative"}  # replay's marks for untimed/unconfirmed
        assert old <= set(f) <= old | added | optional
        assert added <= set(f)
        assert [f"{s['kind']}: {s['text']}" for s in f["action_steps"]] == f["actions"]
    lost = next(f for f in body["findings"] if f["code"] == "GPU_LOST")
    assert lost["decided_by"] == ["gpu.xid_event", "kernel.xid"]
    assert lost["runbook_command"] == "moptd explain --code GPU_LOST --runbook"
    # a bundle's host is not known: the drain names the alternatives in words
    assert [s["command"] for s in lost["action_steps"]] == [False, True, False]
    assert lost["drain"]["host"] == "unknown"


def test_attribution_names_process_user_container_and_pod():
    from moptd.cli.explain_facts import annotate

    f = json.loads(json.dumps(GPU_LOST))
    # what moptd.kernel.attribution adds live; the container id is the one of the real memcg
    # OOM line in tests/fixtures/explain-drill/kernel/dmesg.txt
    f["events"][0]["fields"].update(
        pid=1234,  # as the parser reads them from the line's "pid=1234, name=python"
        process="python",
        user="inference",
        container="3fc28fa1c647ceede9f6b340d0b16c9f1f663698972d22a52e296f291638e014",
        container_runtime="containerd",
        pod_uid="6b1a1f5e-3c1d-4f57-9e0e-2f3a8e0e2d11",
    )
    text = render({"time": 1795969586.0, "findings": [annotate(f, None)]})
    assert (
        "hit by pid 1234 python (user inference, container 3fc28fa1c647, "
        "pod 6b1a1f5e-3c1d-4f57-9e0e-2f3a8e0e2d11)"
    ) in text


def test_runbook_is_printed_from_the_shipped_copy():
    out = moptd("explain", "--code", "gpu_lost", "--runbook")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (REPO / "docs" / "runbooks" / "GPU_LOST.md").read_text()
    out = moptd("explain", "--runbook")
    assert out.returncode == 2
    assert "--runbook needs --code CODE" in out.stderr


def test_every_code_has_a_local_runbook():
    from moptd.cli.runbooks import runbook_path
    from moptd.diagnose.codes import CODES

    assert all(runbook_path(code) is not None for code in CODES)
    assert runbook_path("../../etc/passwd") is None


def test_bundle_gpus_resolve_a_subject_given_by_uuid():
    """The drill's nvidia-smi dump gives gpu:4 (bus 9B) its UUID: the UUID finds its findings."""
    uuid = "GPU-2b6f61f9-8b00-3b57-d912-b62792120662"
    out = moptd("explain", "--json", "--bundle", str(DRILL.relative_to(REPO)), uuid)
    assert out.returncode == 0, out.stderr
    found = {(f["code"], f["subject"]) for f in json.loads(out.stdout)["findings"]}
    assert found == {
        ("GSP_FIRMWARE_ERROR", "gpu:4"),
        ("GPU_RESET_REQUIRED", "gpu:4"),
        ("HW_SLOWDOWN", "gpu:4"),
    }


def test_evidence_says_when_a_line_was_written_from_user_space():
    """/dev/kmsg takes writes from root in user space (tests, a hostile root process); the
    kernel stamps those facility "user", and the evidence says so (issue 18, item 11)."""
    from moptd.cli.explain_compact import evidence_line

    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    kernel = {"stream": "kernel.xid", "t": 1795969286.0, "text": line, "fields": {"code": 79}}
    user = {**kernel, "fields": {"code": 79, "facility": "user"}}
    f = {"code": "GPU_LOST", "events": [kernel], "evidence": {}}
    assert "user space" not in evidence_line(f)
    text = evidence_line({**f, "events": [user]})
    assert text.endswith("; written from user space (facility user), not the kernel"), text


def test_a_block_of_several_gpus_gives_each_its_own_reset_command_golden():
    """Two Xid 154 lines of two GPUs (tests/fixtures/kernel-drill/SOURCE.md) read as one
    GPU_RESET_REQUIRED block: the reset command is one a GPU, each naming its subject, and
    the drain step says which subjects it is for (issue 31, item 1)."""
    drill = Path("tests/fixtures/kernel-drill")
    out = moptd(
        "explain",
        "--bundle",
        str(drill / "xid154-reset.log"),
        "--bundle",
        str(drill / "xid154-drain-reset.log"),
    )
    assert out.returncode == 0, out.stderr
    check_golden("explain_grouped_commands.txt", out.stdout)
    assert "     nvidia-smi -r -i 0009:01:00.0  # gpu:0009:01:00.0\n" in out.stdout
    assert "     nvidia-smi -r -i 0019:01:00.0  # gpu:0019:01:00.0\n" in out.stdout


def test_replay_lists_the_node_wide_cause_first_golden():
    """A half-applied driver update (tests/fixtures/kernel-drill/SOURCE.md: an RmInitAdapter
    failure and an API mismatch): replay lists DRIVER_VERSION_MISMATCH, the node-wide cause,
    before the GPU_INIT_FAILED it explains, as explain does (issue 31, item 4)."""
    drill = Path("tests/fixtures/kernel-drill")
    out = moptd("replay", str(drill / "rminitadapter.log"), str(drill / "api-mismatch.log"))
    assert out.returncode == 2, out.stderr
    check_golden("replay_driver_update.txt", out.stdout)
    titles = [ln.split(" · ")[0] for ln in out.stdout.splitlines() if "  CRITICAL  " in ln]
    assert titles == [
        "1.  CRITICAL  DRIVER_VERSION_MISMATCH on node",
        "2.  CRITICAL  GPU_INIT_FAILED on gpu:0000:0a:00.0",
    ]
    # the tree behind --verbose keeps the same order
    tree = moptd("replay", "-v", str(drill / "rminitadapter.log"), str(drill / "api-mismatch.log"))
    titles = [ln for ln in tree.stdout.splitlines() if ln.startswith("CRITICAL ")]
    assert titles == [
        "CRITICAL DRIVER_VERSION_MISMATCH on node",
        "CRITICAL GPU_INIT_FAILED on gpu:0000:0a:00.0 (0000:0a:00.0)",
    ]
