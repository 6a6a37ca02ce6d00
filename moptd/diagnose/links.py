"""Cross-layer causes: a finding on one subject caused by a finding on another.

A link (``links:`` in a rule file) names the codes of a consequence, the codes of its
cause and how the cause's subject relates to the consequence's (``join``): for
``serving_gpus``, a GPU the serving endpoint runs on. After each evaluation,
:func:`link_findings` gives every open finding of a consequence code, not yet linked, the
cause it follows from: a firing or resolved finding of a cause code on one of those
subjects, which started no later than the consequence fired and was still open at most
``within`` before the consequence began. The consequence carries ``caused_by``; an open
cause lists its open ``consequences``.

It reads only the lifecycle's findings, the store (which GPUs an endpoint runs on) and
the time, so the diagnosis stays a pure function of the store and the clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from moptd.diagnose.expr import Env, truth
from moptd.diagnose.model import Finding, Link
from moptd.observations import subject_id
from moptd.proc.pci import normalize_pci
from moptd.store import SignalStore

# How a cause's subject relates to its consequence's: the one list the loader, the rule
# schema (tools/gen_docs.py) and the docs take the `join:` values from.
JOINS: dict[str, str] = {
    "serving_gpus": "the cause is on a GPU the consequence's serving endpoint runs on "
    "(serving.gpu, or NVML's process list for the processes of serving.process)",
}
STALE_AFTER = 300.0  # as a signal read: an older sample of the engine's GPUs is unknown
_UUID_STREAMS = ("kernel.xid", "kernel.gpu_fallen_off_bus")  # their events carry a uuid


def serving_gpus(
    store: SignalStore,
    subject: str,
    now: float,
    evidence_at: Mapping[str, float] | None = None,
) -> set[str]:
    """The GPUs serving endpoint ``subject`` runs on, as fresh evidence says: subjects
    ``gpu:N``, or ``uuid:<GPU-...>`` for a UUID (or the prefix CUDA takes) that no GPU
    the store describes carries. From ``serving.gpu`` (the managed process's
    CUDA_VISIBLE_DEVICES) and, for each process of ``serving.process``, the GPUs NVML
    lists it on (``process.gpu_memory``). Empty when nothing says."""
    out: set[str] = set()
    uuids = [(store.attr(g, "uuid") or "", g) for g in store.subjects("gpu")]
    for gpu in _label_values(store, "serving.gpu", subject, "gpu", now, evidence_at):
        if gpu.isdigit():
            out.add(f"gpu:{gpu}")
            continue
        # CUDA takes a unique prefix of a UUID; an ambiguous one names no GPU
        hits = [g for uuid, g in uuids if uuid and uuid.lower().startswith(gpu.lower())]
        if len(hits) == 1:
            out.add(hits[0])
        elif not hits:
            out.add("uuid:" + gpu.lower())
    for pid in _label_values(store, "serving.process", subject, "pid", now, evidence_at):
        for gpu in _label_values(store, "process.gpu_memory", f"process:{pid}", "gpu", now):
            if gpu.isdigit():
                out.add(f"gpu:{gpu}")
    return out


def _label_values(
    store: SignalStore,
    signal: str,
    subject: str,
    label: str,
    now: float,
    evidence_at: Mapping[str, float] | None = None,
) -> list[str]:
    namespace = signal.split(".", 1)[0]
    at = now if evidence_at is None else min(now, evidence_at.get(namespace, now))
    out = []
    for labels, series in store.labelled(signal, subject).items():
        if series.last_seen < at - STALE_AFTER:
            continue
        value = dict(labels).get(label)
        if value:
            out.append(value)
    return out


def _gpu_keys(store: SignalStore, subject: str, pci: str | None) -> set[str]:
    """A GPU by its subject, its normalised PCI address and ``uuid:<uuid>``: a kernel-only
    subject ``gpu:<pci>`` and ``gpu:N`` are the same GPU when the store maps one to the
    other, and a kernel line ("NVRM: GPU at PCI:...: GPU-...") may give the UUID."""
    keys = {subject}
    for text in (pci, store.attr(subject, "pci_bus_id"), subject_id(subject)):
        norm = normalize_pci(text) if text else None
        if norm:
            keys.add(norm)
    uuid = store.attr(subject, "uuid")
    if uuid:
        keys.add("uuid:" + uuid.lower())
    for stream in _UUID_STREAMS:
        for ev in store.events(stream).since(-math.inf, subject):
            found = ev.fields.get("uuid") if ev.fields else None
            if isinstance(found, str) and found:
                keys.add("uuid:" + found.lower())
                break
    return keys


def _same_gpu(keys: set[str], wanted: set[str]) -> bool:
    if keys & wanted:
        return True
    prefixes = [w for w in wanted if w.startswith("uuid:")]
    return any(k.startswith(p) for k in keys if k.startswith("uuid:") for p in prefixes)


def link_findings(
    links: Iterable[Link],
    findings: Mapping[tuple[str, str], Finding],
    history: Iterable[Finding],
    store: SignalStore,
    now: float,
    missing: frozenset[str] = frozenset(),
    evidence_at: Mapping[str, float] | None = None,
) -> None:
    """Set ``caused_by`` on the open findings a link explains, and ``consequences`` on the
    open findings that cause them. A link, once made, holds for the consequence's life."""
    active = [lk for lk in links if lk.enabled]
    if not active:
        return
    candidates = [f for f in findings.values() if f.state == "firing"]
    candidates += [f for f in history if f.first_seen is not None]
    for f in findings.values():
        if f.caused_by is not None:
            continue
        for lk in active:
            if f.code not in lk.consequence:
                continue
            cause = _cause_of(lk, f, candidates, store, now, evidence_at)
            if cause is None:
                continue
            if lk.cond is not None:
                env = Env(store, f.subject, now, f.pci_bus_id, missing, evidence_at=evidence_at)
                if truth(lk.cond(env)) is not True:
                    continue
            f.caused_by = {
                "code": cause.code,
                "subject": cause.subject,
                "rule": cause.rule,
                "link": lk.id,
                "since": cause.first_seen,
            }
            break
    for f in findings.values():
        f.consequences = []
    for f in findings.values():
        by = f.caused_by
        if by is None:
            continue
        cause_f = findings.get((str(by["rule"]), str(by["subject"])))
        if cause_f is not None and cause_f.code == by["code"]:
            cause_f.consequences.append(
                {"code": f.code, "subject": f.subject, "rule": f.rule, "link": by["link"]}
            )


def _cause_of(
    lk: Link,
    f: Finding,
    candidates: list[Finding],
    store: SignalStore,
    now: float,
    evidence_at: Mapping[str, float] | None,
) -> Finding | None:
    """The earliest finding of a cause code on a joined subject that was there in time."""
    if lk.join != "serving_gpus":  # pragma: no cover - the loader admits only JOINS
        return None
    gpus = serving_gpus(store, f.subject, now, evidence_at)
    if not gpus:
        return None
    wanted: set[str] = set()
    for g in gpus:
        wanted |= {g} if g.startswith("uuid:") else _gpu_keys(store, g, None)
    began = f.pending_since
    fired = f.first_seen if f.first_seen is not None else now
    best: Finding | None = None
    for c in candidates:
        if c is f or c.code not in lk.cause:
            continue
        if not _same_gpu(_gpu_keys(store, c.subject, c.pci_bus_id), wanted):
            continue
        if c.pending_since > fired:
            continue  # it came after: not the cause
        if c.resolved_at is not None and c.resolved_at < began - lk.within:
            continue  # over too long before
        rank = (c.pending_since, lk.cause.index(c.code))
        if best is None or rank < (best.pending_since, lk.cause.index(best.code)):
            best = c
    return best
