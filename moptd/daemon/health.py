"""Sources moptd could not read: what their silence must not be taken for.

An unreadable kernel log (a user without CAP_SYSLOG under kernel.dmesg_restrict=1, a
sandbox without /dev/kmsg) leaves every Xid unseen: no finding then means nothing, not
health. /v1/health is degraded while it lasts, and `explain` and `status` say it in their
header instead of an all-clear (issue 31).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

KERNEL_BLIND = "kernel log not readable: Xids unknown"
# The collectors whose failure hides a class of evidence, and what is unknown without them.
BLINDING: Mapping[str, str] = {"kernel": KERNEL_BLIND}
UNREAD = ("failed", "unavailable")


def blind_sources(health: Iterable[Mapping[str, object]]) -> list[str]:
    """One line per source that could not be read, with the collector's reason, from the
    collectors' health records (CollectorHealth.as_dict() or /v1/health's entries)."""
    out = []
    for h in health:
        said = BLINDING.get(str(h.get("name")))
        if said is not None and h.get("state") in UNREAD:
            reason = str(h.get("reason") or "").strip()
            out.append(f"{said} ({reason})" if reason else said)
    return out
