"""`moptd rules check` and GET /v1/rules list the links between findings (``links:`` in
rule files, moptd.diagnose.links) as the rule files declare them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from moptd.cli import main
from moptd.clock import SystemClock
from moptd.daemon.views import rules_view
from moptd.diagnose.loader import default_rules_dir
from moptd.diagnose.service import RuleService
from moptd.durations import parse_duration
from moptd.store import SignalStore
from tests.api_helpers import get, wait_socket
from tests.daemon_proc import DaemonProcess

RULES = default_rules_dir()
CROSS_LAYER = RULES / "serving" / "cross-layer.rules.yaml"


def declared(path: Path) -> list[dict[str, object]]:
    return list(yaml.safe_load(path.read_text())["links"])


def _same(listed: dict[str, object], lk: dict[str, object], path: Path) -> None:
    assert listed["title"] == lk["title"]
    assert listed["consequence"] == sorted(lk["consequence"])  # type: ignore[type-var]
    assert listed["cause"] == lk["cause"]
    assert listed["join"] == lk["join"]
    assert listed["within_seconds"] == parse_duration(str(lk["within"]))
    assert listed["if"] == lk.get("if")
    assert listed["enabled"] is lk.get("enabled", True)
    assert Path(str(listed["file"])).resolve() == path.resolve()


def test_check_json_lists_each_shipped_link_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "check", "--json", str(RULES)]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = declared(CROSS_LAYER)
    assert [lk["id"] for lk in doc["links"]] == [lk["id"] for lk in want]
    for listed, lk in zip(doc["links"], want, strict=True):
        _same(listed, lk, CROSS_LAYER)


def test_check_text_shows_each_link_and_keeps_the_verdict_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["rules", "check", str(RULES)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].endswith(" rules OK")
    assert lines[-1].startswith(f"{len(declared(CROSS_LAYER))} links, ")
    for lk in declared(CROSS_LAYER):
        (line,) = [x for x in lines if x.startswith(f"link {lk['id']}:")]
        assert " <- " + ", ".join(lk["cause"]) in line  # type: ignore[arg-type]
        assert f"cross-layer.rules.yaml:{_line_of(CROSS_LAYER, str(lk['id']))}" in line


def _line_of(path: Path, link_id: str) -> int:
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if text.strip() == f"- id: {link_id}":
            return n
    raise AssertionError(link_id)


def test_a_later_file_replaces_a_link_and_that_is_what_is_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = declared(CROSS_LAYER)[0]
    local = tmp_path / "local.rules.yaml"
    override = {**first, "enabled": False, "within": "5m"}
    local.write_text(yaml.safe_dump({"schema": "moptd.rules/v1", "links": [override]}))
    assert main(["rules", "check", "--json", str(RULES), str(local)]) == 0
    doc = json.loads(capsys.readouterr().out)
    (listed,) = [lk for lk in doc["links"] if lk["id"] == first["id"]]
    _same(listed, override, local)
    assert listed["enabled"] is False


def test_the_api_view_lists_the_links_in_force() -> None:
    service = RuleService(SignalStore(), SystemClock(), [RULES])
    view = rules_view(service)
    assert [lk["id"] for lk in view["links"]] == [lk["id"] for lk in declared(CROSS_LAYER)]
    for listed, lk in zip(view["links"], declared(CROSS_LAYER), strict=True):
        _same(listed, lk, CROSS_LAYER)


def test_get_v1_rules_lists_the_links(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path).start()
    try:
        wait_socket(d.socket, d.proc)
        code, body = get(d.socket, "/v1/rules")
    finally:
        d.stop()
    assert code == 200
    assert [lk["id"] for lk in body["links"]] == [lk["id"] for lk in declared(CROSS_LAYER)]


def test_a_copy_without_links_lists_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "rules"
    shutil.copytree(RULES, copy)
    (copy / "serving" / "cross-layer.rules.yaml").unlink()
    for test in (copy / "serving").glob("cross-layer*.test.yaml"):
        test.unlink()
    assert main(["rules", "check", "--json", str(copy)]) == 0
    assert json.loads(capsys.readouterr().out)["links"] == []
