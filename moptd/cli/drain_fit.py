"""The drain step that works on this host.

A rule's `drain_node` step is written for Kubernetes (`kubectl drain $(hostname) ...`). On a
host that Kubernetes does not schedule, that first action of every hardware block cannot
work; at 3 a.m. it costs the minutes spent finding out. So `explain` shows the drain of what
schedules work here: Kubernetes, Slurm, the engine moptd runs itself, or, with none found,
what a drain is for in words. A bundle or a paste comes from a host moptd cannot look at:
there the step names the alternatives. The table, with its sources, is
moptd/catalog/drain.yaml; this module only reads the host (paths under the host root, the
environment) and fills the table in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from moptd import yamlsafe

TABLE = Path(__file__).resolve().parent.parent / "catalog" / "drain.yaml"
SCHEDULERS = ("kubernetes", "slurm")  # looked for in this order


@dataclass(frozen=True, slots=True)
class Host:
    """What schedules work onto the host: `kind` is kubernetes, slurm, managed, none or
    unknown; `why` says what showed it; `node` is the name the scheduler knows it by."""

    kind: str
    why: str
    node: str = ""
    managed: str = ""  # the engine moptd runs, by name ("" without one)


@cache
def table() -> dict[str, Any]:
    loaded = yamlsafe.load(TABLE.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict):
        raise ValueError(f"{TABLE}: not a mapping")
    return loaded


def detect(root: Path, environ: Mapping[str, str], managed: str = "") -> Host:
    """This host's scheduler, from its files (under the host root) and the environment."""
    t = table()
    for kind in SCHEDULERS:
        entry = t[kind]
        seen = [f"${name}" for name in entry.get("env") or [] if environ.get(name)]
        seen += [f"/{p}" for p in entry.get("signs") or [] if (root / p).exists()]
        if seen:
            node_env = str(entry.get("node_env") or "")
            node = environ.get(node_env, "") if node_env else ""
            return Host(kind, f"{' and '.join(seen[:2])} present", node or entry["node_default"])
    if managed:
        return Host("managed", "moptd runs the engine; no Kubernetes or Slurm found", "", managed)
    signs = [f"/{p}" for k in SCHEDULERS for p in t[k].get("signs") or []]
    return Host("none", f"none of {', '.join(signs)} present")


def live_host(host_root: Path, managed: str = "") -> Host:
    return detect(host_root, os.environ, managed)


UNKNOWN = Host("unknown", "the host a bundle or paste came from cannot be looked at")


def drain_step(host: Host, code: str) -> tuple[str, bool]:
    """The drain step's text, and whether it is a command to paste."""
    entry = table()[host.kind]
    if "command" in entry:
        text = str(entry["command"]).format(node=host.node, code=code, name=host.managed)
        return text, True
    return " ".join(str(entry["text"]).split()).format(code=code), False


KUBECTL_DRAIN = "kubectl drain "


def _node_drain(step: dict[str, Any]) -> bool:
    """A rule's node drain: its `kubectl drain` command. A drain in words ("Stop scheduling
    work on this GPU and let running work finish", Xid 154's Drain and Reset) is the GPU's,
    not the node's, and stays as the rule says."""
    return step.get("kind") == "drain_node" and str(step.get("text", "")).startswith(KUBECTL_DRAIN)


def fit(f: dict[str, Any], host: Host) -> dict[str, Any]:
    """The finding with its node-drain steps (action_steps and actions) fitted to the host,
    and `drain` saying which host it was fitted to and why."""
    steps = f.get("action_steps")
    if not isinstance(steps, list) or not any(_node_drain(s) for s in steps):
        return f
    text, command = drain_step(host, str(f.get("code", "")))
    out = dict(f)
    out["action_steps"] = [
        {**s, "text": text, "command": command} if _node_drain(s) else s for s in steps
    ]
    out["actions"] = [
        f"drain_node: {text}" if str(a).startswith(f"drain_node: {KUBECTL_DRAIN}") else a
        for a in f.get("actions") or []
    ]
    out["drain"] = {"host": host.kind, "why": host.why}
    return out
