"""The generated Grafana dashboards: up to date, every metric in the catalog, valid PromQL."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moptd.catalog import CATALOG

from .conftest import REPO, require_tool

DASHBOARDS = REPO / "grafana" / "dashboards"


def load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_dashboards", REPO / "tools/gen_dashboards.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_dashboards"] = module
    spec.loader.exec_module(module)
    return module


gen = load_generator()


def run_check(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "tools/gen_dashboards.py"), "--check", "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_committed_dashboards_are_current():
    result = run_check(DASHBOARDS)
    assert result.returncode == 0, result.stderr


def test_a_panel_with_an_unknown_metric_is_named():
    bad = gen.Dashboard(
        uid="bad",
        title="bad",
        description="",
        variables=("datasource",),
        rows=(gen.Row("r", (gen.Panel("Ghost panel", (gen.q("rate(moptd_ghost_total[5m])"),)),)),),
    )
    problems = gen.unknown_metrics([*gen.DASHBOARDS, bad], CATALOG.by_metric())
    assert problems == [
        "bad: panel 'Ghost panel' queries moptd_ghost_total, which the metric catalog does "
        "not declare"
    ]


def test_a_hand_edited_json_with_an_unknown_metric_fails_the_check(tmp_path):
    for path in DASHBOARDS.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    doc = json.loads((tmp_path / "moptd-host.json").read_text())
    panel = next(p for p in doc["panels"] if p.get("targets"))
    panel["targets"][0]["expr"] = "moptd_gpu_temprature_celsius"
    (tmp_path / "moptd-host.json").write_text(json.dumps(doc))
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert (
        f"moptd-host.json: panel {panel['title']!r} queries moptd_gpu_temprature_celsius"
        in result.stderr
    )
    assert "moptd-host.json: out of date" in result.stderr


def test_a_stale_or_foreign_file_fails_the_check(tmp_path):
    for path in DASHBOARDS.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "moptd-fleet.json").unlink()
    (tmp_path / "hand-made.json").write_text("{}")
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert "moptd-fleet.json: missing" in result.stderr
    assert "hand-made.json: not generated" in result.stderr


@pytest.mark.parametrize("path", sorted(DASHBOARDS.glob("*.json")), ids=lambda p: p.name)
def test_dashboard_conventions(path):
    doc = json.loads(path.read_text())
    assert doc["uid"] == path.stem
    assert "id" not in doc  # provisioning assigns ids
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names[0] == "datasource"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            expr = target["expr"]
            assert "rate(" not in expr or "[$__rate_interval]" in expr, (panel["title"], expr)


def test_the_four_views_exist():
    uids = {json.loads(p.read_text())["uid"] for p in DASHBOARDS.glob("*.json")}
    assert uids == {"moptd-fleet", "moptd-host", "moptd-serving", "moptd-findings"}


def substitute(expr: str) -> str:
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("$job", "moptd")
        .replace("$instance", ".*")
        .replace("$gpu", ".*")
        .replace("$serving", ".*")
        .replace("$severity", ".*")
    )


def test_every_query_is_valid_promql(tmp_path):
    # promtool parses each expression as a recording rule: syntax errors name the panel.
    promtool = require_tool("promtool")
    rules = [
        {"record": f"panel:q{i}", "expr": substitute(query.expr)}
        for i, (_, _, query) in enumerate(gen.panel_queries())
    ]
    titles = {
        f"panel:q{i}": (uid, panel.title) for i, (uid, panel, _) in enumerate(gen.panel_queries())
    }
    path = tmp_path / "panels.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{titles}"


def test_provisioning_files_parse():
    provider = yaml.safe_load((REPO / "grafana/provisioning/dashboards/moptd.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"
    source = yaml.safe_load(
        (REPO / "grafana/provisioning/datasources/prometheus.example.yaml").read_text()
    )
    assert source["datasources"][0]["type"] == "prometheus"
