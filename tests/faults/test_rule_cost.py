"""A rule set cannot make a tick expensive (issue 18, items 2 and 5: the rule-cost case).

One GPU rule within every per-expression limit (500 tokens, 1,000 nodes, 32 levels) ORed
135 window functions over an hour through three macros and was accepted: 45 ms more on
every tick, on the event loop, with 8 GPUs (bench/rule_cost.py; BENCHMARKS.md, "The
costliest rule set the load bound accepts"). The loader now bounds the windowed reads a
tick makes on 8 GPUs and one endpoint (moptd/diagnose/rule_cost.py); the rule that would pass it is
refused with its file and line, and the rules before it, the shipped ones, stay.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.rule_cost import MAX_TICK_READS, SUBJECTS, rule_reads

SIGNALS = ("gpu.temperature", "gpu.power", "gpu.util", "gpu.sm_clock", "gpu.mem_util")


def terms(n: int, first: int = 0) -> list[str]:
    # one window length per term, so no two terms are the same read
    return [
        f"max({SIGNALS[k % len(SIGNALS)]}, {3600 - k}s) > 1e12" for k in range(first, first + n)
    ]


def rule(rid: str, cond_macros: list[str]) -> dict[str, object]:
    return {
        "id": rid,
        "title": "a costly rule",
        "description": "reads many windows",
        "layer": "hardware",
        "scope": "gpu",
        "status": "experimental",
        "decide": [
            {
                "id": "any",
                "if": " or ".join(cond_macros),
                "verdict": {
                    "code": "THERMAL_THROTTLE",
                    "summary": "{{subject}}",
                    "actions": [{"kind": "inspect", "instruction": "none"}],
                    "runbook": "https://docs.nvidia.com/deploy/nvml-api/",
                },
            }
        ],
    }


def write(d: Path, reads: int, first: int = 0, rid: str = "costly") -> Path:
    """A rule file whose one rule makes `reads` distinct windowed reads, 40 per macro."""
    macros, names = {}, []
    for m, start in enumerate(range(first, first + reads, 40)):
        name = f"{rid.replace('-', '_')}_m{m}"
        macros[name] = " or ".join(terms(min(40, first + reads - start), start))
        names.append(name)
    d.mkdir(exist_ok=True)
    path = d / f"{rid}.rules.yaml"
    path.write_text(
        yaml.safe_dump(
            {"schema": "moptd.rules/v1", "macros": macros, "rules": [rule(rid, names)]},
            sort_keys=False,
        )
    )
    return path


def shipped_tick_reads() -> int:
    held: dict[str, set[str]] = {}
    for r in load_rules([default_rules_dir()]).ruleset.rules:
        held.setdefault(r.scope, set()).update(rule_reads(r))
    return sum(len(v) * SUBJECTS.get(k, 1) for k, v in held.items())


def test_a_rule_within_the_expression_limits_but_costly_is_refused(tmp_path):
    path = write(tmp_path / "rules.d", 135)
    loaded = load_rules([default_rules_dir(), tmp_path / "rules.d"])
    shipped = load_rules([default_rules_dir()])
    assert [r.id for r in loaded.ruleset.rules] == [r.id for r in shipped.ruleset.rules]
    (err,) = loaded.errors
    assert err.file == str(path)
    assert err.line > 1
    assert "rule costly: its 135 distinct windowed reads of gpu signals" in err.message
    assert f"the limit is {MAX_TICK_READS}" in err.message


def test_a_rule_set_up_to_the_bound_loads(tmp_path):
    spare = (MAX_TICK_READS - shipped_tick_reads()) // SUBJECTS["gpu"]
    assert spare >= 16, "the shipped rules leave room for an operator's own GPU rules"
    write(tmp_path / "rules.d", spare)
    loaded = load_rules([default_rules_dir(), tmp_path / "rules.d"])
    assert loaded.errors == []
    assert "costly" in [r.id for r in loaded.ruleset.rules]
    write(tmp_path / "more.d", 1, first=spare, rid="one-more")
    loaded = load_rules([default_rules_dir(), tmp_path / "rules.d", tmp_path / "more.d"])
    assert [e.message.split(":")[0] for e in loaded.errors] == ["rule one-more"]


def test_reads_are_counted_through_macros_and_shared_reads_once(tmp_path):
    write(tmp_path / "a.d", 30, rid="first")
    write(tmp_path / "b.d", 30, rid="second")  # the same 30 reads, written the same way
    loaded = load_rules([tmp_path / "a.d", tmp_path / "b.d"])
    assert loaded.errors == []
    a, b = loaded.ruleset.rules
    assert len(rule_reads(a)) == 30
    assert rule_reads(a) == rule_reads(b)
