"""`moptd rules check|test` over the shipped rules (what CI runs) and over broken copies."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from moptd.cli import main

REPO = Path(__file__).parent.parent
RULES = REPO / "rules"


def test_check_shipped_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "check", str(RULES)]) == 0
    assert capsys.readouterr().out.endswith(" rules OK\n")


def test_test_shipped_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "test", str(RULES)]) == 0
    out = capsys.readouterr().out
    assert out.endswith(": 0 failed, 0 errors: OK\n"), out


@pytest.fixture
def rules_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    dst = tmp_path / "rules"
    shutil.copytree(RULES, dst)
    # The shipped tests point at ../../tests/fixtures: keep that relation in the copy.
    (tmp_path / "tests").symlink_to(REPO / "tests")
    monkeypatch.chdir(tmp_path)
    return dst


def test_check_reports_file_and_line(rules_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = rules_copy / "host" / "host.rules.yaml"
    f.write_text(
        f.read_text().replace("node.memory_available_ratio < 0.05", "node.memory_free_ratio < 0.05")
    )
    assert main(["rules", "check", "rules"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "rules/host/host.rules.yaml:39: rule host-memory-low: branch low: unknown signal "
        "'node.memory_free_ratio'",
        "1 problem(s)",
    ]


def test_a_changed_threshold_fails_its_tests(
    rules_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = rules_copy / "hardware" / "clocks.rules.yaml"
    f.write_text(f.read_text().replace("if: gpu.util < 0.5", "if: gpu.util < 0.99"))
    assert main(["rules", "test", "rules"]) == 1
    err = capsys.readouterr().err
    assert (
        "FAIL rules/hardware/clocks.test.yaml:36: test 'full load at the power cap is info, "
        "never thermal': expected but not firing: gpu-power-capped/POWER_CAPPED/gpu:0"
    ) in err


def test_stable_rule_without_tests_fails(
    rules_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (rules_copy / "host" / "host.test.yaml").unlink()
    assert main(["rules", "test", "rules"]) == 1
    err = capsys.readouterr().err
    assert "stable rule host-oom-kill has no firing test" in err
    assert "stable rule host-disk-space has no silent test" in err


def test_malformed_test_file(rules_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = rules_copy / "host" / "host.test.yaml"
    t.write_text(t.read_text().replace("'node.swap_in': '0+409600x30'", "'node.swap_in': 'lots'"))
    assert main(["rules", "test", "rules"]) == 1
    err = capsys.readouterr().err
    assert (
        "rules/host/host.test.yaml:32: test 'swapping in for 5 minutes': bad series value "
        "'lots' (use a, a+bxn, a-bxn, axn or _)"
    ) in err


def test_rules_without_action_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules"]) == 2


def test_check_and_test_json_for_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["rules", "check", "--json", str(RULES)]) == 0
    check = json.loads(capsys.readouterr().out)
    assert check["ok"] is True
    assert check["problems"] == []
    assert check["rules"] > 10
    assert main(["rules", "test", "--json", str(RULES)]) == 0
    test = json.loads(capsys.readouterr().out)
    assert test["ok"] is True
    assert test["failures"] == []
    assert test["errors"] == []
    assert test["tests"] > 10
    assert test["files"] > 1


def test_check_json_names_file_line_and_problem(
    rules_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    f = rules_copy / "host" / "host.rules.yaml"
    f.write_text(
        f.read_text().replace("node.memory_available_ratio < 0.05", "node.memory_free_ratio < 0.05")
    )
    assert main(["rules", "check", "--json", str(rules_copy)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    assert any(
        p["file"].endswith("host.rules.yaml")
        and p["line"] > 1
        and "memory_free_ratio" in p["message"]
        for p in out["problems"]
    ), out
