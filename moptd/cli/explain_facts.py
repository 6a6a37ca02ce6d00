"""What `moptd explain` adds to each finding from the rule that made it and its events.

Added to the finding as fields of their own (`--json` gains them; nothing is taken away):
- `action_steps`: the actions in order, each `{kind, text, command}`; `command` says whether
  the rule gave a command to paste or an instruction in words (the engine's findings carry
  the actions as "kind: text" strings only), null where the rule is not in the rule set;
- `decided_by`: the signals the conditions on its decision path read: the events of those
  streams are the evidence that decided it, the others on its subject only happened nearby;
- `attribution`: who hit it, from its kernel events (pid, process, user, container, pod);
- `runbook_command`: the command that prints the runbook shipped with moptd for its code
  (`moptd explain --code CODE --runbook`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moptd.cli.rules_cache import NodeFacts, RuleFacts, StepFacts, rule_nodes
from moptd.cli.runbooks import runbook_path
from moptd.diagnose.model import ACTION_KINDS, RuleSet

if TYPE_CHECKING:
    from moptd.diagnose.loader import Loaded

log = logging.getLogger(__name__)

_WHO = (
    "pid",
    "process",
    "user",
    "container",
    "container_runtime",
    "pod_uid",
    "pod",
    "namespace",
    "unit",
)
MAX_ATTRIBUTED = 5


_LOADED: dict[tuple[str, ...], Loaded] = {}


def load_rules_once(paths: Sequence[str | Path]) -> Loaded:
    """load_rules, once a command: `explain --bundle` replays with the rules it then
    annotates with, and parsing them twice was a tenth of its time."""
    from moptd.diagnose.loader import load_rules

    key = tuple(map(str, paths))
    if key not in _LOADED:
        _LOADED[key] = load_rules(list(paths))
    return _LOADED[key]


def load_ruleset(paths: Sequence[str | Path]) -> RuleSet | None:
    """The rules as the CLI can read them; None (and annotations without them) where they
    cannot be loaded: explain still shows what the daemon said."""
    try:
        return load_rules_once(paths).ruleset
    except (OSError, ValueError) as exc:
        log.debug("explain: rules not loaded: %s", exc)
        return None


def split_action(action: str) -> tuple[str, str]:
    kind, sep, text = action.partition(": ")
    if sep and kind in ACTION_KINDS:
        return kind, text
    return "", action


def _nodes(rules: RuleSet | RuleFacts | None, rule_id: str) -> dict[str, NodeFacts]:
    """The decision tree's nodes of one rule, from the rule set or its cached facts."""
    if rules is None:
        return {}
    if isinstance(rules, dict):
        return rules.get(rule_id, {})
    rule = rules.by_id(rule_id)
    return rule_nodes(rule.branches, rule.id) if rule is not None else {}


def annotate(f: dict[str, Any], rules: RuleSet | RuleFacts | None) -> dict[str, Any]:
    """`rules`: the rule set, or what explain reads of it (moptd/cli/rules_cache.py)."""
    out = dict(f)
    path = [str(p) for p in f.get("path") or []]
    nodes = _nodes(rules, str(f.get("rule")))
    taken = [nodes[p] for p in path if p in nodes]
    verdict = taken[-1] if taken and len(taken) == len(path) else None
    steps = [split_action(str(a)) for a in f.get("actions") or []]
    declared = verdict.actions if verdict is not None and verdict.actions is not None else ()
    flags = _command_flags(steps, declared)
    out["action_steps"] = [
        {"kind": kind, "text": text, "command": flag}
        for (kind, text), flag in zip(steps, flags, strict=True)
    ]
    signals: set[str] = set()
    for node in taken:
        signals |= node.signals
    out["decided_by"] = sorted(signals)
    out["attribution"] = attribution(deciding_events(out))
    code = str(f.get("code", ""))
    out["runbook_command"] = (
        f"moptd explain --code {code} --runbook" if runbook_path(code) is not None else None
    )
    return out


def _command_flags(
    steps: Sequence[tuple[str, str]], declared: Sequence[StepFacts]
) -> list[bool | None]:
    """Whether each action is a command, from the rule's own list: matched in order by kind
    (and by text where the rule's has no placeholder), so a daemon running another version
    of the rule gets None for what no longer matches, never a guess."""
    flags: list[bool | None] = []
    at = 0
    for kind, text in steps:
        flag = None
        for i in range(at, len(declared)):
            a = declared[i]
            if a.kind == kind and ("{{" in a.text or a.text == text):
                flag, at = a.is_command, i + 1
                break
        flags.append(flag)
    return flags


def deciding_events(f: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of the streams its decision path read (all of them where that is not
    known), and of those the ones whose Xid leads to its own code where there are any."""
    events = [e for e in f.get("events") or [] if isinstance(e, dict)]
    streams = set(f.get("decided_by") or [])
    if streams:
        events = [e for e in events if e.get("stream") in streams]
    code = f.get("code")
    mine = [e for e in events if code in ((e.get("fields") or {}).get("diagnoses") or [])]
    return mine or events


def attribution(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct processes (and their user, container, pod) named by the events."""
    seen: list[dict[str, Any]] = []
    for ev in events:
        fields = ev.get("fields") or {}
        pid = fields.get("pid") if isinstance(fields, dict) else None
        if not isinstance(pid, int) or pid <= 0:  # pid 0: the driver names no process
            continue
        who = {k: fields[k] for k in _WHO if fields.get(k) not in (None, "")}
        if who not in seen:
            seen.append(who)
    return seen
