"""JSON views of the daemon's state, shared by the API and `moptd status --offline`."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from moptd import __version__
from moptd.catalog import CATALOG
from moptd.catalog.gpu import CLOCK_EVENT_REASONS
from moptd.daemon.runtime import CollectorHealth
from moptd.observations import Value, subject_id
from moptd.store import SignalStore


def decode_clock_event_reasons(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


_GPU_FIELDS = (
    "util",
    "mem_util",
    "memory_used",
    "memory_total",
    "temperature",
    "power",
    "power_limit",
    "sm_clock",
    "sm_clock_max",
    "mem_clock",
    "pstate",
    "clock_event_reasons",
    "pcie_link_gen",
    "pcie_link_gen_max",
    "pcie_link_width",
    "pcie_link_width_max",
    "ecc_volatile_uncorrected",
    "remap_pending",
    "remap_failure",
    "recovery_action",
    "persistence_mode",
    "lost",
)
_NODE_FIELDS = (
    "memory_total",
    "memory_available",
    "swap_total",
    "swap_used",
    "cpu_util",
    "cpu_count",
    "load1",
    "swappiness",
)


def _num(v: Value) -> float | int | str | None:
    """A value for /v1/status: NaN and infinities are null (unknown), since JSON has no
    spelling for them and the status view's readers do arithmetic on what is a number."""
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        if v.is_integer():
            return int(v)
    return v


# Prometheus's own spellings, which its HTTP API also sends as strings
_NON_FINITE = {math.inf: "+Inf", -math.inf: "-Inf"}


def snapshot_value(v: Value) -> float | int | str | None:
    """A value for /v1/snapshot: a number stays one; NaN, +Inf and -Inf become the
    strings "NaN", "+Inf" and "-Inf" (an engine does report +Inf), so the answer is
    strict JSON and still says which one it was."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else _NON_FINITE[v]
    return _num(v)


def _fresh(store: SignalStore, signal: str, subject: str) -> list[tuple[dict[str, str], float]]:
    """Label sets of a signal on a subject whose value was seen in the driver collector's
    latest pass (older label sets, say a version before an upgrade, are history)."""
    out = []
    series = store.series_for(signal, subject)
    newest = max((s.last_seen for _, s in series), default=0.0)
    for labels, s in series:
        value = s.last()
        if value is not None and s.last_seen >= newest - 1.0:
            out.append((dict(labels), value))
    return out


def driver_view(store: SignalStore) -> dict[str, Any]:
    """The driver stack as the driver collector last saw it (empty before its first pass)."""

    def versions(signal: str) -> list[str]:
        return sorted({lab.get("version", "") for lab, _ in _fresh(store, signal, "node")})

    return {
        "kernel_module_version": versions("driver.kernel_module_version"),
        "user_space_version": versions("driver.user_space_version"),
        "versions_match": _num(store.latest("driver.nvml_version_match", "node")),
        "modules": {
            lab.get("module", ""): bool(v)
            for lab, v in _fresh(store, "driver.module_loaded", "node")
        },
        "device_nodes": {
            lab.get("node", ""): bool(v)
            for lab, v in _fresh(store, "driver.dev_node_present", "node")
        },
        "device_nodes_accessible": {
            f"{lab.get('node', '')} ({lab.get('user', '')})": bool(v)
            for lab, v in _fresh(store, "driver.dev_node_accessible", "node")
        },
        "persistenced_running": _num(store.latest("driver.persistenced_running", "node")),
        "persistence_mode": {
            subject_id(s): _num(store.latest("gpu.persistence_mode", s))
            for s in store.subjects("gpu")
            if store.latest("gpu.persistence_mode", s) is not None
        },
        "gsp_firmware": {
            subject_id(s): [
                lab.get("version", "") for lab, _ in _fresh(store, "driver.gsp_firmware_version", s)
            ]
            for s in store.subjects("gpu")
            if store.series_for("driver.gsp_firmware_version", s)
        },
        "tainted": _num(store.latest("driver.tainted", "node")),
        "secure_boot": _num(store.latest("driver.secure_boot", "node")),
    }


def container_view(store: SignalStore) -> dict[str, dict[str, Any]]:
    """The container engines the container collector found installed or answering: what
    asking their daemon gave, in words, and their nvidia runtime and CDI (where known)."""
    out: dict[str, dict[str, Any]] = {}
    for labels, series in store.series_for("container.engine_present", "node"):
        status = store.text("container.engine_status", "node", labels)
        if status is None:
            continue  # not installed, nothing asked: not worth a line
        engine: dict[str, Any] = {"status": status, "answers": series.last() == 1}
        for signal, key in (
            ("container.nvidia_runtime_configured", "nvidia_runtime"),
            ("container.cdi_enabled", "cdi"),
        ):
            value = store.latest(signal, "node", labels)
            if isinstance(value, float):
                engine[key] = value == 1
        out[dict(labels).get("engine", "")] = engine
    return dict(sorted(out.items()))


def gpus_view(store: SignalStore) -> list[dict[str, Any]]:
    """Each GPU's identity (subject, index, UUID, name, PCI address) and latest readings."""
    gpus = []
    for subject in store.subjects("gpu"):
        attrs = store.attrs(subject)
        g: dict[str, Any] = {
            "subject": subject,
            "index": subject_id(subject),
            "uuid": attrs.get("uuid"),
            "name": attrs.get("name"),
            "pci_bus_id": attrs.get("pci_bus_id"),
        }
        for f in _GPU_FIELDS:
            g[f] = _num(store.latest(f"gpu.{f}", subject))
        mask = g.get("clock_event_reasons")
        g["clock_events"] = decode_clock_event_reasons(int(mask)) if isinstance(mask, int) else []
        gpus.append(g)
    return gpus


def status_view(
    store: SignalStore, health: Iterable[CollectorHealth], started_at: float | None = None
) -> dict[str, Any]:
    gpus = gpus_view(store)
    node = {f: _num(store.latest(f"node.{f}", "node")) for f in _NODE_FIELDS}
    return {
        "version": __version__,
        "time": time.time(),
        "started_at": started_at,
        "collectors": [h.as_dict() for h in health],
        "gpus": gpus,
        "node": node,
        "driver": driver_view(store),
        "containers": container_view(store),
        "units": {f"gpu.{f}": CATALOG[f"gpu.{f}"].unit for f in _GPU_FIELDS}
        | {f"node.{f}": CATALOG[f"node.{f}"].unit for f in _NODE_FIELDS},
        "store": store.stats(),
    }


def snapshot_view(store: SignalStore, only: str | None = None) -> dict[str, Any]:
    """The latest value of every signal, per subject (gpu:N, node, serving:NAME, ...)."""
    snap = store.snapshot()
    subjects: dict[str, dict[str, Any]] = {}
    for s in snap.samples:
        if only is not None and s.subject != only:
            continue
        entry = subjects.setdefault(
            s.subject, {"attrs": snap.attrs.get(s.subject, {}), "signals": {}}
        )
        value = snapshot_value(s.value)
        if s.labels:
            entry["signals"].setdefault(s.signal, []).append(
                {"labels": dict(s.labels), "value": value}
            )
        else:
            entry["signals"][s.signal] = value
    if only is not None and only not in subjects:
        subjects[only] = {"attrs": snap.attrs.get(only, {}), "signals": {}}
    return {"taken_at": snap.taken_at, "subjects": dict(sorted(subjects.items()))}


def rules_view(rules: Any) -> dict[str, Any]:
    """The rule set in force (a moptd.diagnose RuleService)."""
    out = []
    for r in rules.ruleset.rules:
        out.append(
            {
                "id": r.id,
                "title": r.title,
                "layer": r.layer,
                "scope": r.scope,
                "status": r.status,
                "enabled": r.enabled,
                "for_seconds": r.for_,
                "keep_firing_for_seconds": r.keep_firing_for,
                "codes": sorted({v.code for v in r.verdicts()}),
                "file": r.file,
                "line": r.line,
            }
        )
    return {
        "files": list(rules.ruleset.files),
        "rules": out,
        "links": links_view(rules.ruleset.links),
        "errors": [str(e) for e in getattr(rules, "errors", [])],
    }


def links_view(links: Iterable[Any]) -> list[dict[str, Any]]:
    """The links in force (``links:`` in rule files, moptd.diagnose.links), in the order
    they are tried: the first that holds is the one made. /v1/rules and `rules check`."""
    return [
        {
            "id": lk.id,
            "title": lk.title,
            "consequence": sorted(lk.consequence),
            "cause": list(lk.cause),
            "join": lk.join,
            "within_seconds": lk.within,
            "if": lk.cond.text if lk.cond is not None else None,
            "enabled": lk.enabled,
            "file": lk.file,
            "line": lk.line,
        }
        for lk in links
    ]
