"""`moptd rules check`: everything the loader refuses, plus checks across the whole set.

The loader already reports schema errors, unknown signals, lists, macros, functions and
labels, type errors (a counter function on a gauge, an event stream outside count()),
macro cycles, bad durations, unreachable branches, codes outside the catalog and expressions
over the cost limits (docs/rules.md "Limits").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from moptd.diagnose.loader import RuleError, load_rules


def lint(paths: Sequence[str | Path]) -> tuple[list[RuleError], int]:
    """(errors, number of rules). Errors carry file and line."""
    loaded = load_rules(paths)
    errors = list(loaded.errors)
    for rule in loaded.ruleset.rules:
        if not rule.verdicts():
            errors.append(RuleError(rule.file, rule.line, f"rule {rule.id} reaches no verdict"))
    if not loaded.ruleset.files and not errors:
        errors.append(RuleError(", ".join(map(str, paths)), 0, "no *.rules.yaml files found"))
    return errors, len(loaded.ruleset.rules)
