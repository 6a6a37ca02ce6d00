"""Alert rules: promtool check and unit tests, and the runbook/code/alert consistency check."""

from __future__ import annotations

import re
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


def test_promtool_checks_and_tests_the_fleet_causes():
    for args in (
        ("check", "rules", "moptd-fleet.rules.yaml"),
        ("test", "rules", "moptd-fleet.rules.test.yaml"),
    ):
        result = promtool(*args)
        assert result.returncode == 0, result.stdout + result.stderr


def test_a_shared_version_that_chance_explains_does_not_fire(tmp_path):
    """Without the chance clause, a version that most hosts run (vLLM 0.8.5 on 7 of 10, all
    five Xid 119 hosts among them) or every host runs (CUDA 12.8) would be blamed too."""
    text = (ALERTS / "moptd-fleet.rules.yaml").read_text()
    start = text.index("          and (\n            (\n              component_version")
    end = text.index("< 0.05\n          )\n") + len("< 0.05\n          )\n")
    (tmp_path / "moptd-fleet.rules.yaml").write_text(text[:start] + text[end:])
    shutil.copy(ALERTS / "moptd-fleet.rules.test.yaml", tmp_path)
    tool = require_tool("promtool")
    result = subprocess.run([tool, "test", "rules", "moptd-fleet.rules.test.yaml"],
                            capture_output=True, text=True, cwd=tmp_path, check=False)  # fmt: skip
    assert result.returncode != 0
    assert 'component="cuda", fault="Xid 119"' in result.stdout + result.stderr


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
    for path in ALERTS.glob("*.rules.yaml"):
        doc = yaml.safe_load(path.read_text())
        severities = {r["labels"]["severity"] for g in doc["groups"] for r in g["rules"]
                      if "alert" in r}  # fmt: skip
        assert severities <= {"info", "warning", "critical"}, path


def test_an_alert_on_a_series_nothing_records_is_named(repo_copy):
    path = repo_copy / "grafana/alerts/moptd-fleet.rules.yaml"
    path.write_text(path.read_text().replace(
        "(fault:moptd_hosts_1h:count >= 3)", "(fault:moptd_hosts_24h:count >= 3)"))  # fmt: skip
    result = run_check(repo_copy)
    assert result.returncode == 1
    assert (
        "alert MoptdFleetFaultOnManyHosts: queries fault:moptd_hosts_24h:count, which no rule "
        "file records"
    ) in result.stderr


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


# --- Alertmanager inhibition: every rule can match (issue 34) ------------------------------

FLEET = REPO / "docs" / "fleet.md"
INHIBIT_TESTS = ALERTS / "moptd.inhibit.test.yaml"


def _alertmanager_config() -> dict:
    """docs/fleet.md's routing and inhibition, as operators copy it (and the fleet test
    runs it)."""
    text = FLEET.read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "inhibit_rules" in b)
    return yaml.safe_load(block)


def _matches(matcher: str, labels: dict[str, str]) -> bool:
    """One Alertmanager matcher (name OP "value") against an alert's labels; a missing
    label is the empty string, and regular expressions are anchored, as Alertmanager's."""
    m = re.fullmatch(r'\s*(\w+)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*', matcher)
    assert m, matcher
    name, op, value = m.groups()
    got = labels.get(name, "")
    if op in ("=", "!="):
        return (got == value) == (op == "=")
    return (re.fullmatch(value, got) is not None) == (op == "=~")


def _expand(values: str) -> list[float | None]:
    """promtool's input_series notation: `a+bxn` is n+1 values from a, `_` a missing
    sample, `stale` a staleness marker (both None here)."""
    out: list[float | None] = []
    for token in values.split():
        if token in ("_", "stale"):
            out.append(None)
            continue
        if re.fullmatch(r"_x\d+", token):
            out.extend([None] * int(token[2:]))
            continue
        m = re.fullmatch(r"(-?[\d.]+(?:e[+-]?\d+)?)(?:([+-][\d.]+)?x(\d+))?", token)
        assert m, token
        start, step, times = float(m[1]), float(m[2] or 0), int(m[3] or 0)
        out.extend(start + i * step for i in range(times + 1))
    return out


def _instance(series: str) -> str | None:
    m = re.search(r'instance="([^"]*)"', series)
    return m[1] if m else None


def _firing_together(test: dict) -> dict[str, list[dict[str, str]]]:
    """eval_time -> every alert the test expects firing then (alertname as a label)."""
    out: dict[str, list[dict[str, str]]] = {}
    for case in test.get("alert_rule_test", []):
        for alert in case.get("exp_alerts") or []:
            labels = {"alertname": case["alertname"], **alert["exp_labels"]}
            out.setdefault(case["eval_time"], []).append(labels)
    return out


def test_the_inhibition_scenarios_are_ones_prometheus_can_see():
    """While up{instance=X} is 0, no other series of X has a sample: a failed scrape marks
    all of the target's series stale. (The alert tests in moptd.rules.test.yaml keep a
    down target's series going, which made the MoptdDown inhibit rule look useful.)"""
    for test in yaml.safe_load(INHIBIT_TESTS.read_text())["tests"]:
        series = {s["series"]: _expand(s["values"]) for s in test["input_series"]}
        for name, ups in series.items():
            if not name.startswith("up{"):
                continue
            down = {i for i, v in enumerate(ups) if v == 0}
            for other, values in series.items():
                if other == name or _instance(other) != _instance(name):
                    continue
                sampled = [i for i in down if i < len(values) and values[i] is not None]
                assert not sampled, f"{other} has samples while {name} is 0 (steps {sampled})"


def test_promtool_passes_the_inhibition_scenarios():
    result = promtool("test", "rules", INHIBIT_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_inhibit_rule_matches_alerts_that_fire_together():
    """Each inhibit rule of docs/fleet.md has, in the promtool scenarios above, an instant
    at which a source alert and a target alert fire with the `equal` labels alike. One
    that has none can never hold anything back (docs/fleet.md's MoptdDown rule could not)."""
    rules = _alertmanager_config()["inhibit_rules"]
    assert rules
    together = [
        alerts
        for test in yaml.safe_load(INHIBIT_TESTS.read_text())["tests"]
        for alerts in _firing_together(test).values()
    ]
    for rule in rules:
        matched = [
            (source["alertname"], target["alertname"])
            for alerts in together
            for source in alerts
            if all(_matches(m, source) for m in rule["source_matchers"])
            for target in alerts
            if target is not source
            and all(_matches(m, target) for m in rule["target_matchers"])
            and all(source.get(k, "") == target.get(k, "") for k in rule.get("equal", []))
        ]
        assert matched, f"inhibit rule {rule} matches no alerts that fire together"


def test_the_matcher_reads_alertmanager_matchers():
    labels = {"alertname": "MoptdCollectorFailing", "severity": "warning"}
    assert _matches('alertname=~"MoptdCollector.*"', labels)
    assert not _matches('alertname=~"Collector"', labels)  # anchored
    assert _matches('severity=~"warning|info"', labels)
    assert not _matches('code="GPU_LOST"', labels)
    assert _matches('code!="GPU_LOST"', labels)
    assert _expand("1x2 _ stale 0+5x2") == [1, 1, 1, None, None, 0, 5, 10]


def test_the_alertmanager_configuration_checks(tmp_path):
    """amtool, as an operator would after copying it (receivers added: the page leaves
    them to the reader)."""
    amtool = require_tool("amtool")
    config = _alertmanager_config()
    config["receivers"] = [
        {"name": name, "webhook_configs": [{"url": "http://127.0.0.1:9/hook"}]}
        for name in ("chat", "pager", "ticket-queue")
    ]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([amtool, "check-config", str(path)], capture_output=True,
                            text=True, check=False, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
