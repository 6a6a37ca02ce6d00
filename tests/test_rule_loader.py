"""Loading rule files: every bad input gives file:line and a clear message (tested verbatim)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moptd.diagnose.loader import default_rules_dir, load_rules

HEAD = "schema: moptd.rules/v1\n"

GOOD_RULE = """\
rules:
  - id: hot
    title: Hot GPU
    layer: hardware
    scope: gpu
    status: experimental
    for: 1m
    decide:
      - id: hot
        if: gpu.temperature > 90
        verdict:
          code: THERMAL_THROTTLE
          summary: "{{subject}} is hot"
          actions: [{kind: inspect, command: "nvidia-smi -q -i {{index}}"}]
          runbook: https://example.invalid/hot
"""


def errors_of(tmp_path: Path, text: str, name: str = "x.rules.yaml") -> list[str]:
    f = tmp_path / name
    f.write_text(text)
    return [str(e).replace(str(tmp_path) + "/", "") for e in load_rules([f]).errors]


def test_good_rule_loads(tmp_path: Path) -> None:
    f = tmp_path / "x.rules.yaml"
    f.write_text(HEAD + GOOD_RULE)
    loaded = load_rules([f])
    assert loaded.errors == []
    (rule,) = loaded.ruleset.rules
    assert (rule.id, rule.for_, rule.line) == ("hot", 60.0, 3)
    assert rule.signals == {"gpu.temperature"}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            HEAD + "rules: [\n",
            "x.rules.yaml:3: YAML: expected the node content, but found '<stream end>'",
        ),
        (HEAD + "rules:\n  - id: a\n    id: b\n", "x.rules.yaml:4: YAML: duplicate key 'id'"),
        ("- 1\n", "x.rules.yaml:1: a rule file is a mapping with schema: moptd.rules/v1"),
        ("schema: moptd.rules/v2\n", "x.rules.yaml:1: schema: 'moptd.rules/v1' was expected"),
        (HEAD + "colour: red\n", "x.rules.yaml:1: (top): unknown key ('colour' was unexpected)"),
        (
            HEAD + GOOD_RULE.replace("for: 1m", "for: 1 minute"),
            "x.rules.yaml:8: rules.0.for: '1 minute' is not a duration (use e.g. 30s, 5m, 1h30m)",
        ),
        (
            HEAD + GOOD_RULE.replace("status: experimental", "status: 3"),
            "x.rules.yaml:7: rules.0.status: 3 is not one of "
            "['experimental', 'stable', 'deprecated']",
        ),
        (
            HEAD + GOOD_RULE.replace("    for: 1m\n", "    for: 1m\n    colour: red\n"),
            "x.rules.yaml:3: rules.0: unknown key ('colour' was unexpected)",
        ),
        (
            HEAD + GOOD_RULE.replace("gpu.temperature", "gpu.temp"),
            "x.rules.yaml:11: rule hot: branch hot: unknown signal 'gpu.temp'",
        ),
        (
            HEAD + GOOD_RULE.replace("THERMAL_THROTTLE", "TOO_HOT"),
            "x.rules.yaml:13: rules.0.decide.0.verdict.code: 'TOO_HOT' is not one of",
        ),
        (
            HEAD + GOOD_RULE.replace("inspect", "pray"),
            "x.rules.yaml:15: rules.0.decide.0.verdict.actions.0.kind: 'pray' is not one of",
        ),
        (
            HEAD + GOOD_RULE.replace("{{subject}} is hot", "{{temp}} is hot"),
            "x.rules.yaml:14: rule hot: {{temp}} names no evidence "
            "(nor subject, index, pci_bus_id)",
        ),
        (
            HEAD
            + GOOD_RULE.replace("if: gpu.temperature > 90", "else: true")
            + '      - id: never\n        if: "true"\n        ok: unreachable\n',
            "x.rules.yaml:17: rule hot: branch never is unreachable (after the branch at line 10 "
            "that always matches)",
        ),
        (
            HEAD + GOOD_RULE.replace("        if: gpu.temperature > 90\n", ""),
            "x.rules.yaml:10: rules.0.decide.0: a branch needs exactly one of if/else and one of "
            "verdict/decide/ok",
        ),
        (
            HEAD + GOOD_RULE.replace("gpu.temperature > 90", "gpu.temperature >"),
            "x.rules.yaml:11: rule hot: branch hot: syntax error: invalid syntax",
        ),
        (
            HEAD + "macros:\n  a: b\n  b: a\n" + GOOD_RULE.replace("gpu.temperature > 90", "a"),
            "x.rules.yaml:3: macro 'a': macro cycle: a -> b -> a",
        ),
        (
            HEAD
            + "macros:\n  hot: gpu.nope > 1\n"
            + GOOD_RULE.replace("gpu.temperature > 90", "hot"),
            "x.rules.yaml:3: macro 'hot': unknown signal 'gpu.nope'",
        ),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, text: str, want: str) -> None:
    errors = errors_of(tmp_path, text)
    assert any(e.startswith(want) for e in errors), errors


def test_missing_path(tmp_path: Path) -> None:
    errors = load_rules([tmp_path / "nope"]).errors
    assert [str(e) for e in errors] == [f"{tmp_path}/nope:0: no such file or directory"]


def test_rules_d_overrides_by_id_and_adds(tmp_path: Path) -> None:
    shipped = tmp_path / "shipped"
    local = tmp_path / "rules.d"
    shipped.mkdir()
    local.mkdir()
    (shipped / "a.rules.yaml").write_text(HEAD + "lists:\n  codes: [1]\n" + GOOD_RULE)
    (local / "z.rules.yaml").write_text(
        HEAD
        + "lists:\n  codes: [2, 3]\n"
        + GOOD_RULE.replace("for: 1m", "for: 5m")
        + GOOD_RULE.replace("rules:\n", "").replace("id: hot\n    title", "id: mine\n    title")
    )
    loaded = load_rules([shipped, local])
    assert loaded.errors == []
    assert [(r.id, r.for_) for r in loaded.ruleset.rules] == [("hot", 300.0), ("mine", 60.0)]
    assert loaded.lists["codes"] == [2, 3]


def test_shipped_rules_load_clean() -> None:
    loaded = load_rules([default_rules_dir()])
    assert loaded.errors == []
    assert len(loaded.ruleset.rules) >= 20


def test_every_engine_code_is_reachable() -> None:
    from moptd.diagnose.codes import CODES, ENGINE_LAYERS

    loaded = load_rules([default_rules_dir()])
    reached = {v.code for r in loaded.ruleset.rules for v in r.verdicts()}
    wanted = {c for c, info in CODES.items() if info.layer in ENGINE_LAYERS}
    assert wanted - reached == set()


def test_schema_file_agrees_with_the_code_table() -> None:
    from moptd.diagnose.codes import CODES, LAYERS, SEVERITIES
    from moptd.diagnose.loader import schema
    from moptd.diagnose.model import ACTION_KINDS

    s = schema()
    assert s["$defs"]["verdict"]["properties"]["code"]["enum"] == list(CODES)
    assert s["$defs"]["verdict"]["properties"]["severity"]["enum"] == list(SEVERITIES)
    assert s["$defs"]["rule"]["properties"]["layer"]["enum"] == list(LAYERS)
    assert tuple(s["$defs"]["action"]["properties"]["kind"]["enum"]) == ACTION_KINDS


def _broken(doc: object, k: int) -> object:
    """A shipped rule file's document broken in one of several ways the schema refuses,
    at a depth that goes through every $ref of the schema (rule, decide, branch, verdict,
    action, duration, link)."""
    import copy

    d = copy.deepcopy(doc)
    assert isinstance(d, dict)
    rules = d.get("rules") or []
    for rule in rules:
        branch = rule["decide"][k % len(rule["decide"])]
        if k % 7 == 0:
            rule["status"] = "retired"
        elif k % 7 == 1:
            branch["bogus"] = 1
        elif k % 7 == 2:
            branch.pop("if", None)
            branch.pop("else", None)
        elif k % 7 == 3:
            rule["for"] = "ten minutes"
        elif k % 7 == 4 and "verdict" in branch:
            branch["verdict"]["actions"] = [{"kind": "inspect"}, {"kind": "pray", "command": ""}]
        elif k % 7 == 5 and "decide" in branch:
            branch["decide"][0]["verdict"] = {"code": "NOT_A_CODE"}
        else:
            rule["decide"] = []
    for link in d.get("links") or []:
        link["within"] = -1
        link["cause"] = []
    return d


def test_the_loaders_validator_gives_jsonschemas_errors_on_broken_shipped_rules() -> None:
    """The loader checks with the schema's $refs replaced by their definitions (quicker):
    on every shipped rule file, intact and broken seven ways, its errors (path, message,
    keyword) are those of jsonschema's own validator over the schema file as written."""
    import jsonschema  # type: ignore[import-untyped]

    from moptd.diagnose.loader import _schema_path, _validator, parse_yaml, schema
    from moptd.diagnose.rulefiles import read_rule_file, rule_files

    plain = jsonschema.Draft202012Validator(schema())
    ours = _validator(_schema_path().read_text())
    assert "$ref" not in str(ours.schema["$defs"]["branch"])  # the replaced schema is used

    def errors(v: object, doc: object) -> list[tuple[list[str], str, str]]:
        got = v.iter_errors(doc)  # type: ignore[attr-defined]
        return sorted((list(map(str, e.absolute_path)), e.message, e.validator) for e in got)

    files, _ = rule_files([default_rules_dir()])
    compared = 0
    for f in files:
        doc, errs = parse_yaml(read_rule_file(f), str(f))
        assert not errs
        assert errors(ours, doc) == errors(plain, doc) == []
        for k in range(7):
            bad = _broken(doc, k)
            want = errors(plain, bad)
            assert errors(ours, bad) == want, (f, k)
            compared += len(want)
    assert compared > 500
