"""Which findings `moptd explain` shows: the subject asked for (in any of its spellings) and
the time window. Shared by the daemon's /v1/explain and the CLI's offline and bundle views,
so both choose the same findings."""

from __future__ import annotations

from typing import Any

from moptd.proc.pci import normalize_pci


def matches(f: dict[str, Any], asked: str | None, gpus: list[dict[str, Any]]) -> bool:
    """SUBJECT may be a GPU index, gpu:N, a UUID, a PCI bus id, a serving name or node."""
    if not asked:
        return True
    subject = str(f.get("subject", ""))
    a = asked.strip()
    if a in (subject, subject.split(":", 1)[-1]) or f"serving:{a}" == subject:
        return True
    pci = normalize_pci(a)
    if pci is not None and pci in (f.get("pci_bus_id"), normalize_pci(subject.split(":", 1)[-1])):
        return True
    for g in gpus:
        ids = {str(g.get("uuid")), str(g.get("index")), str(g.get("subject"))}
        if g.get("pci_bus_id"):
            ids.add(str(normalize_pci(str(g["pci_bus_id"]))))
        if (a in ids or (pci and pci in ids)) and (
            subject == g.get("subject") or (f.get("pci_bus_id") and f.get("pci_bus_id") in ids)
        ):
            return True
    return False


def changed_since(f: dict[str, Any], since: float) -> bool:
    """A firing finding always; any other if it changed at or after `since`."""
    if f.get("state") == "firing":
        return True
    last = f.get("resolved_at") or f.get("updated_at") or f.get("last_seen") or 0
    return float(last) >= since


def chosen(
    f: dict[str, Any],
    asked: str | None,
    code: str | None,
    since: float | None,
    gpus: list[dict[str, Any]],
) -> bool:
    return (
        matches(f, asked, gpus)
        and (code is None or f.get("code") == code)
        and (since is None or changed_since(f, since))
    )


def unknown_gpu(asked: str | None, gpus: list[dict[str, Any]]) -> str | None:
    """What to say when SUBJECT names a GPU (an index, gpu:N, a GPU- UUID) that this host
    does not have: 'no GPU gpu:7 here ...'; None when it has it or SUBJECT names no GPU
    (a PCI address may be a GPU seen only in kernel lines, so it is not judged here)."""
    if not asked:
        return None
    a = asked.strip()
    index = a.removeprefix("gpu:")
    if not (index.isdigit() or a.upper().startswith("GPU-")):
        return None
    for g in gpus:
        if a in (str(g.get("uuid")), str(g.get("subject"))) or index == str(g.get("index")):
            return None
    # the GPUs an index names (NVML, nvidia-smi); those known only from kernel lines by
    # their PCI address are not what an index asks for
    known = ", ".join(str(g["subject"]) for g in gpus if str(g.get("index", "")).isdigit())
    known = known or "none that NVML or nvidia-smi names"
    shown = f"gpu:{index}" if index.isdigit() else a
    return f"No GPU {shown} on this host (GPUs: {known})."
