"""Rule expressions are cost-bounded at load (docs/rules.md "Limits").

Each input here used to be accepted and cost 2^40 evaluations a tick, or crash the loader
with a traceback (OverflowError, RecursionError). Now each is a RuleError naming the file,
the line and the key, found without expanding what it refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.diagnose import expr
from moptd.diagnose.expr import Compiler, Env, ExprError
from moptd.diagnose.loader import default_rules_dir, load_rules, parse_yaml, rule_files
from moptd.diagnose.service import RuleService
from moptd.store import SignalStore

RULE = """\
rules:
  - id: costly
    title: Costly
    layer: host
    scope: node
    status: experimental
    decide:
      - id: costly
        if: {condition}
        verdict:
          code: HOST_OOM_KILL
          summary: "{{{{subject}}}}"
          actions: [{{kind: inspect, command: "true"}}]
          runbook: https://example.invalid/costly
"""
IF_LINE = 10  # the line of `if:` in a file of the schema line and RULE


def rule_file(tmp_path: Path, condition: str, macros: dict[str, str] | None = None) -> Path:
    head = "schema: moptd.rules/v1\n"
    if macros:
        head += "macros:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in macros.items())
    f = tmp_path / "costly.rules.yaml"
    f.write_text(head + RULE.format(condition=json.dumps(condition)))
    return f


def errors_of(f: Path) -> list[str]:
    return [str(e).replace(str(f.parent) + "/", "") for e in load_rules([f]).errors]


def doubling_chain(n: int, fan: int = 2) -> dict[str, str]:
    """m1: m0 or m0, m2: m1 or m1, ...: m<n> expands to fan^n copies of m0."""
    macros = {"m0": "node.memory_available_ratio < 0.05"}
    for i in range(1, n + 1):
        macros[f"m{i}"] = " or ".join([f"m{i - 1}"] * fan)
    return macros


def test_forty_doubling_macros_are_refused(tmp_path: Path) -> None:
    f = rule_file(tmp_path, "m40", doubling_chain(40))
    errors = errors_of(f)
    line = IF_LINE + 42  # macros: and 41 macros
    assert errors[0] == (
        f"costly.rules.yaml:{line}: rule costly: branch costly: nested more than 32 levels "
        "deep (the limit), through macro m40 -> m39 -> m38 -> ... -> m26 -> m25"
    )
    # The first macro past the node limit, on its own line (m<k> is at line k + 3).
    assert (
        "costly.rules.yaml:11: macro 'm8': more than 1000 nodes after macro expansion (the limit)"
    ) in errors
    assert not load_rules([f]).ruleset.rules


def test_a_wide_shallow_macro_fan_is_refused_by_size(tmp_path: Path) -> None:
    # m12 is 8 ** 12 copies of m0 at depth 28, within the depth limit; m3 is the first
    # macro over the node limit (512 copies of m0's 4 nodes)
    f = rule_file(tmp_path, "m12", doubling_chain(12, fan=8))
    errors = errors_of(f)
    assert (
        "costly.rules.yaml:6: macro 'm3': more than 1000 nodes after macro expansion (the limit)"
    ) in errors
    assert not [e for e in errors if "nested" in e]


def test_a_macro_used_too_often_blames_the_rule(tmp_path: Path) -> None:
    macros = {"hot": "node.memory_available_ratio < 0.05 and node.memory_available_ratio > 0"}
    f = rule_file(tmp_path, " or ".join(["hot"] * 150), macros)
    assert errors_of(f) == [
        f"costly.rules.yaml:{IF_LINE + 2}: rule costly: branch costly: "
        "more than 1000 nodes after macro expansion (the limit)"
    ]


def test_the_chain_is_checked_in_linear_time() -> None:
    """The check sums each macro's cost once: 2 ** 400 copies would never finish."""
    compiler = Compiler(CATALOG, macros=doubling_chain(400))
    with pytest.raises(ExprError, match="nested more than 32 levels deep"):
        compiler.compile("m400")
    flat = Compiler(CATALOG, macros=doubling_chain(400, fan=1))  # m1: m0 ... as deep, 1 copy
    with pytest.raises(ExprError, match="nested more than 32 levels deep"):
        flat.compile("m400")


@pytest.mark.parametrize(
    ("condition", "want"),
    [
        (
            "0x" + "f" * 400 + " > 1",
            "number 0xffffffffff...ffff has 402 characters (the limit is 32)",
        ),
        ("1" * 400 + " > 1", "number 111111111111...1111 has 400 characters (the limit is 32)"),
        ("1e999 > 1", "number 1e999 is out of range"),
        ("node.memory_available_ratio in [1e999]", "number 1e999 is out of range"),
        ("not " * 2000 + "true", "more than 500 tokens (the limit)"),
        ("not " * 40 + "true", "nested more than 32 levels deep (the limit)"),
        ("-" * 400 + "1 > 0", "nested more than 32 levels deep (the limit)"),
        (" + ".join(["1"] * 3000) + " > 1", "more than 500 tokens (the limit)"),
        (" + ".join(["1"] * 40) + " > 1", "nested more than 32 levels deep (the limit)"),
    ],
)
def test_costly_conditions_are_refused_with_file_line_and_key(
    tmp_path: Path, condition: str, want: str
) -> None:
    f = rule_file(tmp_path, condition)
    assert errors_of(f) == [f"costly.rules.yaml:{IF_LINE}: rule costly: branch costly: {want}"]


def test_evidence_is_bounded_too(tmp_path: Path) -> None:
    f = rule_file(tmp_path, "true")
    f.write_text(
        f.read_text().replace(
            "    decide:\n",
            "    evidence:\n      big: " + " + ".join(["1"] * 600) + "\n    decide:\n",
        )
    )
    assert errors_of(f) == [
        f"costly.rules.yaml:{IF_LINE - 1}: rule costly: evidence big: "
        "more than 500 tokens (the limit)"
    ]


def test_rules_check_refuses_with_file_and_line(tmp_path: Path) -> None:
    f = rule_file(tmp_path, "0x" + "f" * 400 + " > 1")
    done = subprocess.run(
        [sys.executable, "-m", "moptd", "rules", "check", str(f)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == (
        f"{f}:{IF_LINE}: rule costly: branch costly: "
        "number 0xffffffffff...ffff has 402 characters (the limit is 32)"
    )
    assert "Traceback" not in done.stderr


def test_a_refused_set_keeps_the_rules_in_force(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    rule_file(good, "node.memory_available_ratio < 0.05")
    bad = tmp_path / "bad"
    bad.mkdir()
    rule_file(bad, "m40", doubling_chain(40))
    service = RuleService(SignalStore(clock=VirtualClock(0)), VirtualClock(0), [good])
    assert [r.id for r in service.ruleset.rules] == ["costly"]
    service.put_in_force(load_rules([good, bad]))  # what a SIGHUP reload does
    assert [r.id for r in service.ruleset.rules] == ["costly"]
    assert "nested more than 32 levels deep" in str(service.errors[0])
    # Starting with it: no traceback, the errors kept for /v1/rules, no rules in force.
    started = RuleService(SignalStore(clock=VirtualClock(0)), VirtualClock(0), [good, bad])
    assert started.errors == service.errors
    assert started.ruleset.rules == ()


# --- the shipped rules have room below every limit --------------------------------------


def shipped_expressions() -> list[tuple[str, str, str]]:
    """(scope, where, text) of every condition, evidence and macro in the shipped rules."""
    out: list[tuple[str, str, str]] = []
    files, _ = rule_files([default_rules_dir()])

    def walk(node: object, scope: str, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "if" or (where.endswith("evidence") and isinstance(value, str)):
                    out.append((scope, f"{where}.{key}", value))
                else:
                    walk(value, node.get("scope", scope), f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, scope, f"{where}.{i}")

    for f in files:
        doc, errors = parse_yaml(f.read_text(), str(f))
        assert not errors
        assert isinstance(doc, dict)
        for name, text in doc.get("macros", {}).items():
            out.append(("serving" if "serving." in text else "gpu", f"{f}:{name}", text))
        walk(doc.get("rules", []), "node", f.name)
    return out


def test_shipped_rules_are_far_below_the_limits() -> None:
    loaded = load_rules([default_rules_dir()])
    assert loaded.errors == []
    compilers = {
        s: Compiler(CATALOG, loaded.lists, loaded.macros, s) for s in ("node", "gpu", "serving")
    }
    exprs = shipped_expressions()
    assert len(exprs) > 100
    costs = [compilers[scope].cost(text) for scope, _, text in exprs]
    tokens = [sum(1 for _ in expr._TOKEN.finditer(text)) for _, _, text in exprs]
    numbers = [
        len(m.group(3)) for _, _, text in exprs for m in expr._TOKEN.finditer(text) if m.group(3)
    ]
    # docs/rules.md "Limits" states the largest shipped expression (64 nodes, depth 7, 99
    # tokens, a 10-character number): a bigger one must update it.
    assert max(c.nodes for c in costs) <= 64
    assert max(c.depth for c in costs) <= 7
    assert max(tokens) <= 99
    assert max(numbers) <= 10
    assert max(c.nodes for c in costs) * 10 < expr.MAX_NODES
    assert max(c.depth for c in costs) * 4 < expr.MAX_DEPTH
    assert max(tokens) * 5 < expr.MAX_TOKENS
    assert max(numbers) * 3 < expr.MAX_NUMBER_CHARS


# --- property: deep and wide expressions never escape as anything but ExprError ---------

_leaf = st.sampled_from(
    ["node.memory_available_ratio", "1", "0x1F", "2.5", "5m", "true", "'x'", "HW_SLOWDOWN"]
)
_OPS = [" and ", " or ", " + ", " < ", " & ", " == "]


def _grow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(st.sampled_from(["not (", "-(", "abs("]), children).map(
            lambda t: f"{t[0]}{t[1]})"
        ),
        st.tuples(st.lists(children, min_size=2, max_size=6), st.sampled_from(_OPS)).map(
            lambda t: t[1].join(f"({part})" for part in t[0])
        ),
    )


_deep = st.recursive(_leaf, _grow, max_leaves=200)
_small = st.recursive(_leaf, _grow, max_leaves=12)


@st.composite
def with_macros(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    """An expression over a chain of up to 50 macros, each naming the one below 1-4 times
    (so nodes grow up to 4 ** 50 and depth with every link)."""
    macros: dict[str, str] = {}
    below = "true"
    for i in range(draw(st.integers(0, 50))):
        body = draw(st.sampled_from(_OPS)).join(
            [f"({draw(_small)})", *[below] * draw(st.integers(1, 4))]
        )
        macros[f"m{i}"] = f"not ({body})" if draw(st.booleans()) else body
        below = f"m{i}"
    return f"({draw(_deep)}) or {below}", macros


_big_number = st.one_of(
    st.integers(1, 500).map(lambda n: "0x" + "f" * n), st.integers(1, 500).map(lambda n: "9" * n)
)


@st.composite
def extremes(draw: st.DrawFn) -> str:
    """Runs of up to 1,500 prefix operators around up to 3,000 terms, some of them numbers
    of up to 500 digits: what used to overflow a float or Python's recursion limit."""
    runs = draw(
        st.lists(
            st.tuples(st.sampled_from(["not ", "-", "abs(", "(", "not ("]), st.integers(0, 1500)),
            max_size=3,
        )
    )
    term = draw(st.one_of(_leaf, _big_number))
    core = draw(st.sampled_from(_OPS)).join([term] * draw(st.integers(1, 3000)))
    opened = sum(n for op, n in runs if op.endswith("("))
    return "".join(op * n for op, n in runs) + f"({core})" + ")" * opened


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_macros(), st.integers(1, 80), extremes())
def test_deep_and_wide_expressions_fail_only_as_expr_errors(
    case: tuple[str, dict[str, str]], repeat: int, extreme: str
) -> None:
    text, macros = case
    compiler = Compiler(CATALOG, macros=macros)
    wide, deep = " and ".join([text] * repeat), "not " * repeat + f"({text})"
    for candidate in (text, wide, deep, extreme):
        try:
            compiled = compiler.compile(candidate)  # anything but ExprError fails this test
        except ExprError as e:
            assert e.message  # noqa: PT017 - a property over many inputs, not one raise
            continue
        value = compiled(Env(SignalStore(clock=VirtualClock(0)), "node", 10.0))
        assert value is None or isinstance(value, bool | float | int | str | list)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_macros(), extremes())
def test_deep_and_wide_rule_files_fail_only_as_rule_errors(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, dict[str, str]], extreme: str
) -> None:
    text, macros = case
    f = rule_file(tmp_path_factory.mktemp("r"), f"{text} or {extreme}", macros)
    for e in load_rules([f]).errors:  # load_rules raising anything fails this test
        assert (e.file, e.line > 0) == (str(f), True)
