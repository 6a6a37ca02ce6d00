"""The load-time bound on what a rule set makes a tick read.

The per-expression limits (moptd/diagnose/expr.py: tokens, nodes, depth) bound the work of
one evaluation, but not what a tick costs: one GPU rule at those limits ORs 135 window
functions over an hour and was accepted; it added 43 ms to every tick on the event loop
(8 GPUs, bench/rule_cost.py), four such rules 237 ms. What a tick pays for is each distinct
windowed read (`max(gpu.power, 1h)`, `count(kernel.xid, 10m)`, ...) once per subject of its
scope: reads written the same way are shared through the tick's memo. So the rule set in
force is bounded by its reads a tick on a reference host, 8 GPUs and one serving endpoint:
each distinct GPU read counts 8, a serving or node read 1, at most ``MAX_TICK_READS`` in
all. The shipped set makes 432 (43 GPU, 45 serving, 43 node reads); what is left is 16 more
GPU reads, or 128 serving or node ones. (The bound was 512 when the set made 373; the kernel
rules of issue 29 added 13 node reads, and the bound rose by 32 to keep an operator's room for
16 GPU reads: 32 reads are about 10 ms on the reference host, and the tick runs off the event
loop within `rules.tick_budget` since issue 18. The daemon-log, AER and NVLink kernel rules
and the NVLink5 decode then added 20 node, 2 serving and 2 GPU reads, and it rose by 16 to 560
for the same room.) A rule that would pass the bound is refused with
its file and line; the rules before it (the shipped ones come first) stay in force.
"""

from __future__ import annotations

from collections.abc import Iterator

from moptd.diagnose.expr import Expr
from moptd.diagnose.model import Branch, Rule

MAX_TICK_READS = 560
SUBJECTS = {"gpu": 8}  # subjects of a scope on the reference host; 1 for the others


def rule_exprs(rule: Rule) -> Iterator[Expr]:
    yield from (e for _, e in rule.evidence)
    stack: list[Branch] = list(rule.branches)
    while stack:
        b = stack.pop()
        if b.cond is not None:
            yield b.cond
        if b.verdict is not None:
            yield from (e for _, e in b.verdict.evidence)
        stack.extend(b.children)


def rule_reads(rule: Rule) -> frozenset[str]:
    return frozenset().union(*(e.reads for e in rule_exprs(rule)))


def tick_reads(reads: dict[str, set[str]]) -> int:
    """Reads a tick makes on the reference host, given each scope's distinct reads."""
    return sum(len(r) * SUBJECTS.get(scope, 1) for scope, r in reads.items())


def bound_reads(rules: list[Rule]) -> tuple[list[Rule], list[tuple[Rule, str]]]:
    """The rules kept in order, and each refused one with why."""
    held: dict[str, set[str]] = {}
    kept: list[Rule] = []
    refused: list[tuple[Rule, str]] = []
    for rule in rules:
        scope = held.setdefault(rule.scope, set())
        new = rule_reads(rule) - scope
        total = tick_reads(held) + len(new) * SUBJECTS.get(rule.scope, 1)
        if total > MAX_TICK_READS:
            refused.append(
                (
                    rule,
                    f"rule {rule.id}: its {len(new)} distinct windowed reads of "
                    f"{rule.scope} signals would take the rule set to {total} reads a tick "
                    f"on 8 GPUs and one endpoint (the limit is {MAX_TICK_READS})",
                )
            )
            continue
        scope |= new
        kept.append(rule)
    return kept, refused
