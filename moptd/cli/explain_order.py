"""Which finding `moptd explain` shows first: causes before their consequences, then severity.

The knowledge is data (the tables below), read by `incidents()`:
- a finding's own `caused_by` (a link the rules drew across subjects: an engine's stall
  after a fault of its GPU, moptd.diagnose.links) comes first;
- `NODE_CAUSES`: node-wide causes and the findings they explain on any subject;
- `SAME_SUBJECT`: causes and the findings they explain on the same GPU or serving endpoint;
- `LAYER_ORDER`: the order of layers when nothing else decides (a broken driver stack before
  the hardware it hides, the hardware before the serving process that runs on it).

A link is only drawn where the cause makes the consequence expected (NVIDIA's Xid catalog,
the runbooks): an Xid 119 GSP timeout asks for the reset GPU_RESET_REQUIRED reports, an API
mismatch keeps /dev/nvidia-uvm from being created. Where a consequence could have another
cause it is still listed under the first cause, and its own block stays one command away.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from moptd.diagnose.codes import CODES
from moptd.proc.pci import pci_key

_DRIVER_STACK = frozenset(
    {
        "UVM_NOT_LOADED",
        "DEVICE_NODE_PROBLEM",
        "PERSISTENCE_MODE_OFF",
        "CDI_SPEC_STALE",
        "CONTAINER_RUNTIME_NOT_CONFIGURED",
    }
)

# node-wide cause -> what it explains wherever it shows
NODE_CAUSES: dict[str, frozenset[str]] = {
    "SECURE_BOOT_BLOCKED": frozenset({"DRIVER_NOT_LOADED", "MODULE_KERNEL_MISMATCH"})
    | _DRIVER_STACK,
    "MODULE_KERNEL_MISMATCH": frozenset({"DRIVER_NOT_LOADED"}) | _DRIVER_STACK,
    "DRIVER_NOT_LOADED": _DRIVER_STACK,
    "DRIVER_VERSION_MISMATCH": _DRIVER_STACK,
}

# cause -> what it explains on the same subject (the same GPU by subject, index or bus id)
_XID_FOLLOW_UPS = frozenset({"GPU_RESET_REQUIRED", "XID_APPLICATION_FAULT"})
SAME_SUBJECT: dict[str, frozenset[str]] = {
    "GPU_LOST": _XID_FOLLOW_UPS
    | {"ECC_UNCORRECTABLE", "NVLINK_ERROR", "GSP_FIRMWARE_ERROR", "ROW_REMAP_PENDING"},
    "ROW_REMAP_FAILURE": _XID_FOLLOW_UPS | {"ROW_REMAP_PENDING", "ECC_UNCORRECTABLE"},
    "ECC_UNCORRECTABLE": _XID_FOLLOW_UPS | {"ROW_REMAP_PENDING"},
    "GSP_FIRMWARE_ERROR": _XID_FOLLOW_UPS,
    "NVLINK_ERROR": _XID_FOLLOW_UPS,
    "ROW_REMAP_PENDING": frozenset({"GPU_RESET_REQUIRED"}),
    "HOST_OOM_KILL": frozenset({"ENGINE_DEAD", "SERVING_DOWN"}),
    "CUDA_OOM": frozenset({"ENGINE_DEAD", "SERVING_DOWN"}),
    "ENGINE_DEAD": frozenset({"SERVING_DOWN", "SCHEDULER_STALL"}),
    "PORT_CONFLICT": frozenset({"SERVING_DOWN"}),
    "TOKENIZER_MISSING": frozenset({"SERVING_DOWN", "ENGINE_DEAD"}),
    # the engine could not start or lost its CUDA context: it then dies and stops answering
    "KV_CACHE_CAPACITY_INSUFFICIENT": frozenset({"ENGINE_DEAD", "SERVING_DOWN"}),
    "CUDA_ILLEGAL_ADDRESS": frozenset({"ENGINE_DEAD", "SERVING_DOWN"}),
    "CUDA_ARCH_UNSUPPORTED": frozenset({"ENGINE_DEAD", "SERVING_DOWN"}),
    "CUDA_DRIVER_TOO_OLD": frozenset({"ENGINE_DEAD", "SERVING_DOWN"}),
    "TRT_ENGINE_INCOMPATIBLE": frozenset({"ENGINE_DEAD", "SERVING_DOWN"}),
}

LAYER_ORDER = (
    "driver",
    "hardware",
    "container",
    "host",
    "compiler",
    "memory",
    "model",
    "framework",
    "moptd",
)
SEVERITY_ORDER = ("critical", "warning", "info")


def layer_of(code: str) -> str:
    info = CODES.get(code)
    return info.layer if info else "moptd"


def severity_rank(f: dict[str, Any]) -> int:
    sev = str(f.get("severity", "info"))
    return SEVERITY_ORDER.index(sev) if sev in SEVERITY_ORDER else len(SEVERITY_ORDER)


def _is_node_cause(f: dict[str, Any]) -> bool:
    return str(f.get("code")) in NODE_CAUSES


def _keys(f: dict[str, Any]) -> set[str]:
    """The spellings of a finding's subject that another finding on it may use."""
    keys = {str(f.get("subject", ""))}
    if f.get("pci_bus_id"):
        keys.add("pci:" + pci_key(str(f["pci_bus_id"])))
    return keys


def linked(cause: dict[str, Any], other: dict[str, Any]) -> bool:
    """`other` says it follows from `cause` (its caused_by names cause's code and subject,
    and its rule where both say one)."""
    by = other.get("caused_by")
    if not isinstance(by, dict):
        return False
    if by.get("code") != cause.get("code") or by.get("subject") != cause.get("subject"):
        return False
    return not (by.get("rule") and cause.get("rule") and by.get("rule") != cause.get("rule"))


def explains(cause: dict[str, Any], other: dict[str, Any]) -> bool:
    if linked(cause, other):
        return True
    code, other_code = str(cause.get("code")), str(other.get("code"))
    if other_code in NODE_CAUSES.get(code, frozenset()):
        return True
    return other_code in SAME_SUBJECT.get(code, frozenset()) and bool(_keys(cause) & _keys(other))


@dataclass
class Incident:
    """A root finding and what follows from it; `group` holds the root's twins: the same
    code and verdict on other subjects (eight GPUs in one power brake)."""

    root: dict[str, Any]
    group: list[dict[str, Any]] = field(default_factory=list)
    consequences: list[dict[str, Any]] = field(default_factory=list)

    @property
    def findings(self) -> list[dict[str, Any]]:
        return [*self.group, *self.consequences]

    @property
    def critical(self) -> bool:
        return any(f.get("severity") == "critical" for f in self.findings)


def _sort_key(f: dict[str, Any]) -> tuple[int, int, int, int, str, str]:
    layer = layer_of(str(f.get("code")))
    rank = LAYER_ORDER.index(layer) if layer in LAYER_ORDER else len(LAYER_ORDER)
    firing = 0 if f.get("state", "firing") == "firing" else 1
    return (
        0 if _is_node_cause(f) else 1,
        firing,
        severity_rank(f),
        rank,
        str(f.get("code")),
        str(f.get("subject")),
    )


def _twin_key(f: dict[str, Any]) -> tuple[str, ...]:
    """Findings that read the same and need the same actions but for the subject."""
    return (
        str(f.get("code")),
        str(f.get("rule")),
        str(f.get("severity")),
        str(f.get("state", "firing")),
        "/".join(map(str, f.get("path") or [])),
        str(len(f.get("actions") or [])),
    )


def incidents(findings: Iterable[dict[str, Any]]) -> list[Incident]:
    """Roots in reading order, each with its twins and consequences."""
    ordered = sorted(findings, key=_sort_key)
    explained: dict[int, int] = {}  # id(consequence) -> index of its cause in `ordered`
    for i, f in enumerate(ordered):
        # the cause a link names wins over the tables' guesses
        link = next((j for j, c in enumerate(ordered) if j != i and linked(c, f)), None)
        if link is not None:
            explained[id(f)] = link
            continue
        for j, cause in enumerate(ordered):
            if i != j and explains(cause, f) and not explains(f, cause):
                # a cause that is itself explained hands the consequence to its own root
                explained[id(f)] = j
                break

    def root_of(f: dict[str, Any]) -> dict[str, Any]:
        seen = {id(f)}
        while id(f) in explained:
            f = ordered[explained[id(f)]]
            if id(f) in seen:
                break
            seen.add(id(f))
        return f

    out: list[Incident] = []
    by_root: dict[int, Incident] = {}
    twins: dict[tuple[str, ...], Incident] = {}
    for f in ordered:
        root = root_of(f)
        if root is not f:
            continue
        key = _twin_key(f)
        if key in twins:
            twins[key].group.append(f)
            by_root[id(f)] = twins[key]
            continue
        inc = Incident(root=f, group=[f])
        twins[key] = inc
        by_root[id(f)] = inc
        out.append(inc)
    for f in ordered:
        root = root_of(f)
        if root is not f:
            by_root[id(root)].consequences.append(f)
    return sorted(out, key=_incident_key)


def _incident_key(inc: Incident) -> tuple[int, int, int, int, str, str]:
    """An incident reads as its most pressing finding: firing and severe before resolved."""
    node, _, _, layer, code, subject = _sort_key(inc.root)
    firing = 0 if any(f.get("state", "firing") == "firing" for f in inc.findings) else 1
    severity = min(severity_rank(f) for f in inc.findings)
    return (node, firing, severity, layer, code, subject)
