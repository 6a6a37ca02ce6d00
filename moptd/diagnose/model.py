"""Rules, verdicts, actions and findings: the data the loader builds and the engine reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from moptd.diagnose.codes import Severity

if TYPE_CHECKING:  # annotations only: `moptd explain` reads the model without the compiler
    from moptd.diagnose.expr import Expr

ACTION_KINDS = (
    "inspect",
    "restart_serving",
    "reset_gpu",
    "reboot_node",
    "drain_node",
    "replace_hardware",
    "update_software",
    "change_config",
)
Scope = Literal["node", "gpu", "serving"]
State = Literal["pending", "firing", "resolved"]


@dataclass(frozen=True, slots=True)
class Action:
    kind: str
    text: str  # the concrete command or instruction
    is_command: bool = True

    def render(self) -> str:
        return f"{self.kind}: {self.text}"


@dataclass(frozen=True, slots=True)
class Verdict:
    code: str
    severity: Severity
    summary: str
    actions: tuple[Action, ...]
    runbook: str
    falsepositives: tuple[str, ...] = ()
    evidence: tuple[tuple[str, Expr], ...] = ()


@dataclass(frozen=True, slots=True)
class Branch:
    id: str  # the path element `explain` prints: "<rule id>/<branch id>"
    cond: Expr | None  # None: the else branch
    verdict: Verdict | None
    children: tuple[Branch, ...]
    line: int
    ok: str | None = None  # a leaf that means "healthy", with the reason
    # ok leaf only: the fault was taken back (Xid 154 back to None): resolve at once,
    # without keep_firing_for
    resolves: bool = False


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    title: str
    layer: str
    scope: Scope
    status: str
    for_: float
    keep_firing_for: float
    branches: tuple[Branch, ...]
    evidence: tuple[tuple[str, Expr], ...]
    file: str
    line: int
    enabled: bool = True
    description: str = ""
    tags: tuple[str, ...] = ()
    signals: frozenset[str] = frozenset()
    # codes whose open finding on the same subject leaves this rule's match without one
    inhibited_by: tuple[str, ...] = ()

    def verdicts(self) -> list[Verdict]:
        out: list[Verdict] = []
        stack = list(self.branches)
        while stack:
            b = stack.pop()
            if b.verdict is not None:
                out.append(b.verdict)
            stack.extend(b.children)
        return out


@dataclass(frozen=True, slots=True)
class Link:
    """A cross-layer cause (moptd.diagnose.links): a finding of a `consequence` code follows
    from one of a `cause` code on the subject `join` names."""

    id: str
    title: str
    consequence: frozenset[str]  # codes of the finding that follows
    cause: tuple[str, ...]  # codes of the finding it follows from
    join: str  # how the subjects relate: a key of moptd.diagnose.links.JOINS
    within: float  # seconds before the consequence began the cause may have resolved
    file: str
    line: int
    cond: Expr | None = None  # evaluated on the consequence's subject (its scope)
    description: str = ""
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...]
    files: tuple[str, ...] = ()
    links: tuple[Link, ...] = ()

    def by_id(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)


@dataclass(slots=True)
class Finding:
    """One (rule, subject) pair through its lifecycle."""

    rule: str
    subject: str
    code: str
    severity: Severity
    state: State
    summary: str = ""
    pending_since: float = 0.0
    first_seen: float | None = None  # when it started firing
    last_seen: float = 0.0  # last step its condition held
    resolved_at: float | None = None
    pci_bus_id: str | None = None
    evidence: dict[str, object] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    runbook: str = ""
    fire_times: list[float] = field(default_factory=list)  # for flap damping
    # the finding this one follows from (moptd.diagnose.links): code, subject, rule, link,
    # since; and, on a cause, the open findings that follow from it
    caused_by: dict[str, object] | None = None
    consequences: list[dict[str, object]] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "code": self.code,
            "subject": self.subject,
            "severity": self.severity,
            "rule": self.rule,
            "state": self.state,
            "summary": self.summary,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "evidence": self.evidence,
            "path": self.path,
            "actions": self.actions,
            "runbook": self.runbook,
        }
        if self.pci_bus_id:
            out["pci_bus_id"] = self.pci_bus_id
        if self.resolved_at is not None:
            out["resolved_at"] = self.resolved_at
        if self.caused_by is not None:
            out["caused_by"] = dict(self.caused_by)
        if self.consequences:
            out["consequences"] = [dict(c) for c in self.consequences]
        return out


@dataclass(frozen=True, slots=True)
class Transition:
    """A finding changed state: handed to the findings store and the log."""

    t: float
    rule: str
    subject: str
    code: str
    severity: Severity
    old: str  # "inactive", "pending", "firing"
    new: str  # "pending", "firing", "resolved", "inactive"
    summary: str = ""
