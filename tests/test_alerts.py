"""Alert rules: promtool check and unit tests, and the runbook/code/alert consistency check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from .conftest import REPO, require_tool

ALERTS = REPO / "grafana" / "alerts"
CHECK = REPO / "tools" / "check_runbooks.py"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = require_tool("promtool")
    return subprocess.run([tool, *args], capture_output=True, text=True, check=False, cwd=ALERTS)


def test_promtool_check_rules():
    result = promtool("check", "rules", "moptd.rules.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", ["moptd-dcgm", "moptd-fleet"])
def test_promtool_checks_and_tests_the_recording_rules(name):
    tool = require_tool("promtool")
    recording = ALERTS.parent / "recording"
    for args in (
        ["check", "rules", f"{name}.rules.yaml"],
        ["test", "rules", f"{name}.rules.test.yaml"],
    ):
        result = subprocess.run(
            [tool, *args], capture_output=True, text=True, check=False, cwd=recording
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules():
    result = promtool("test", "rules", "moptd.rules.test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails_promtool(tmp_path):
    # The unit tests can fail: an expected annotation that differs makes promtool say so.
    shutil.copy(ALERTS / "moptd.rules.yaml", tmp_path)
    text = (ALERTS / "moptd.rules.test.yaml").read_text()
    (tmp_path / "t.yaml").write_text(text.replace("GPU 0 lost on h1:9477", "GPU 0 lost on h9"))
    tool = require_tool("promtool")
    result = subprocess.run(
        [tool, "test", "rules", "t.yaml"], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert result.returncode != 0
    assert "MoptdGPULost" in result.stdout + result.stderr


def run_check(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), "--repo", str(repo)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_runbook_check_passes_on_the_repo():
    result = run_check(REPO)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def repo_copy(tmp_path) -> Path:
    for rel in ("docs/runbooks", "grafana/alerts"):
        shutil.copytree(REPO / rel, tmp_path / rel)
    shutil.copy(REPO / "docs/diagnosis-codes.md", tmp_path / "docs/diagnosis-codes.md")
    return tmp_path


def test_every_code_has_a_runbook(repo_copy):
    (repo_copy / "docs/runbooks/SWAP_ACTIVE.md").unlink()
    result = run_check(repo_copy)
    assert result.returncode == 1
    assert "docs/runbooks/SWAP_ACTIVE.md: missing" in result.stderr


def test_a_runbook_for_an_unknown_code_is_named(repo_copy):
    (repo_copy / "docs/runbooks/GPU_ON_FIRE.md").write_text("# GPU_ON_FIRE\n")
    result = run_check(repo_copy)
    assert result.returncode == 1
    assert (
        "docs/runbooks/GPU_ON_FIRE.md: runbook for GPU_ON_FIRE, which is not a diagnosis code"
        in (result.stderr)
    )


def test_a_runbook_without_a_section_is_named(repo_copy):
    path = repo_copy / "docs/runbooks/CUDA_OOM.md"
    path.write_text(path.read_text().replace("## When to escalate", "## Later"))
    result = run_check(repo_copy)
    assert "docs/runbooks/CUDA_OOM.md: missing section '## When to escalate'" in result.stderr


def edit_rules(repo: Path, edit) -> None:
    path = repo / "grafana/alerts/moptd.rules.yaml"
    doc = yaml.safe_load(path.read_text())
    edit(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def rule(doc, name):
    return next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name)


def test_an_alert_without_a_runbook_is_named(repo_copy):
    edit_rules(repo_copy, lambda d: rule(d, "MoptdGPULost")["annotations"].pop("runbook_url"))
    result = run_check(repo_copy)
    assert result.returncode == 1
    assert "grafana/alerts/moptd.rules.yaml: alert MoptdGPULost: no runbook_url annotation" in (
        result.stderr
    )


def test_an_alert_pointing_at_a_missing_runbook_is_named(repo_copy):
    def edit(doc):
        rule(doc, "MoptdDown")["annotations"]["runbook_url"] = (
            "https://github.com/moptd/moptd/blob/main/docs/runbooks/nowhere.md"
        )

    edit_rules(repo_copy, edit)
    result = run_check(repo_copy)
    assert "alert MoptdDown: runbook_url points to docs/runbooks/nowhere.md" in result.stderr


def test_an_alert_without_summary_or_description_is_named(repo_copy):
    def edit(doc):
        annotations = rule(doc, "MoptdCollectorStale")["annotations"]
        del annotations["summary"]
        annotations["description"] = " "

    edit_rules(repo_copy, edit)
    result = run_check(repo_copy)
    assert "alert MoptdCollectorStale: no summary annotation" in result.stderr
    assert "alert MoptdCollectorStale: no description annotation" in result.stderr


def test_an_alert_on_an_unknown_metric_is_named(repo_copy):
    edit_rules(repo_copy, lambda d: rule(d, "MoptdGPULost").update(expr="moptd_gpu_gone == 1"))
    result = run_check(repo_copy)
    assert "alert MoptdGPULost: queries moptd_gpu_gone, which the metric catalog lacks" in (
        result.stderr
    )


def test_an_untested_alert_is_named(repo_copy):
    def edit(doc):
        extra = dict(rule(doc, "MoptdGPULost"), alert="MoptdGPULostAgain")
        doc["groups"][1]["rules"].append(extra)

    edit_rules(repo_copy, edit)
    result = run_check(repo_copy)
    assert "alert MoptdGPULostAgain has no promtool test case where it fires" in result.stderr


def test_an_alert_whose_severity_differs_from_its_code_is_named(repo_copy):
    edit_rules(repo_copy, lambda d: rule(d, "MoptdGPULost")["labels"].update(severity="warning"))
    result = run_check(repo_copy)
    assert result.returncode == 1
    assert (
        "alert MoptdGPULost: severity warning but GPU_LOST's default severity is critical"
        in result.stderr
    )


def test_a_severity_without_a_finding_alert_is_named(repo_copy):
    def edit(doc):
        rules = doc["groups"][0]["rules"]
        rules.remove(rule(doc, "MoptdFindingInfo"))

    edit_rules(repo_copy, edit)
    result = run_check(repo_copy)
    assert result.returncode == 1
    assert 'no alert on moptd_finding_active{severity="info"}' in result.stderr


def test_a_code_missing_from_the_docs_table_is_named(repo_copy):
    path = repo_copy / "docs/diagnosis-codes.md"
    path.write_text("".join(
        line for line in path.read_text().splitlines(keepends=True) if "| SWAP_ACTIVE |" not in line
    ))
    result = run_check(repo_copy)
    assert result.returncode == 1
    assert "docs/diagnosis-codes.md: SWAP_ACTIVE is missing from the table" in result.stderr


def test_every_alert_has_a_known_severity():
    doc = yaml.safe_load((ALERTS / "moptd.rules.yaml").read_text())
    severities = {r["labels"]["severity"] for g in doc["groups"] for r in g["rules"]}
    assert severities <= {"info", "warning", "critical"}


def load_checker():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_runbooks", CHECK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = load_checker()
CODE = st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True)
SEVERITY = st.sampled_from(["info", "warning", "critical"])


@given(st.lists(st.tuples(CODE, SEVERITY), max_size=20), st.text(max_size=200))
def test_code_table_parser_reads_what_a_table_holds(rows, noise):
    table = ["| layer | code | default severity | what it means |", "|---|---|---|---|"]
    table += [f"| hardware | {code} | {sev} | means {code} |" for code, sev in rows]
    # Prose around the table (no line starting with a pipe) is ignored.
    prose = "\n".join(line for line in noise.splitlines() if not line.lstrip().startswith("|"))
    assert checker.parse_codes(prose + "\n\n" + "\n".join(table) + "\n") == [c for c, _ in rows]


@given(st.text(max_size=500))
def test_code_table_parser_never_raises(text):
    for code in checker.parse_codes(text):
        assert code[0].isalpha()
        assert code == code.upper()
