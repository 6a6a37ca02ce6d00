"""`moptd rules check`: everything the loader refuses, plus checks across the whole set.

The loader already reports schema errors, unknown signals, lists, macros, functions and
labels, type errors (a counter function on a gauge, an event stream outside count()),
macro cycles, bad durations, unreachable branches and codes outside the catalog.

What the checks here add is refused by `rules check` only: a set that has them still loads
(a reload is not refused for them), and at run time a rule that raises fails alone
(RULE_EVALUATION_FAILED).
"""

from __future__ import annotations

import io
import math
import tokenize
from collections.abc import Iterator, Sequence
from pathlib import Path

from moptd.diagnose.loader import RuleError, load_rules
from moptd.diagnose.model import Branch, Rule


def lint(paths: Sequence[str | Path]) -> tuple[list[RuleError], int]:
    """(errors, number of rules). Errors carry file and line."""
    loaded = load_rules(paths)
    errors = list(loaded.errors)
    for rule in loaded.ruleset.rules:
        if not rule.verdicts():
            errors.append(RuleError(rule.file, rule.line, f"rule {rule.id} reaches no verdict"))
        errors.extend(_infinite_numbers(rule))
    if not loaded.ruleset.files and not errors:
        errors.append(RuleError(", ".join(map(str, paths)), 0, "no *.rules.yaml files found"))
    return errors, len(loaded.ruleset.rules)


def _infinite_numbers(rule: Rule) -> Iterator[RuleError]:
    """A number written so large that it is infinite as a float (1e999): signals are floats,
    so a bit mask of it raises OverflowError on every evaluation and a comparison with it is
    constant. (A condition only: evidence and macros are not looked into.)"""
    stack: list[Branch] = list(rule.branches)
    while stack:
        b = stack.pop()
        stack.extend(b.children)
        if b.cond is None:
            continue
        for literal in _number_literals(b.cond.text):
            if not _finite(literal):
                yield RuleError(
                    rule.file,
                    b.line,
                    f"rule {rule.id}: branch {b.id}: the number {literal} is infinite as a "
                    "float: a comparison with it is constant, a bit mask of it raises",
                )


def _number_literals(text: str) -> list[str]:
    """The number tokens of a condition (strings are not looked into; `10m` is 10, m)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return []  # the compiler accepted it; what cannot be tokenised is not checked
    return [t.string for t in tokens if t.type == tokenize.NUMBER]


def _finite(literal: str) -> bool:
    try:
        if literal[:2].lower() in ("0x", "0o", "0b"):
            return math.isfinite(float(int(literal, 0)))
        return math.isfinite(float(literal))
    except OverflowError:
        return False  # an integer too large for a float
    except ValueError:
        return True  # not a real number (1j): the compiler's concern, not this check's
