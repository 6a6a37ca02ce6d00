"""A timeline of observations: what replay feeds the live engine on a virtual clock.

Who builds one (moptd.bundle reads a bundle into it) lives above diagnosis; replay and the
rule tests only consume it, so diagnosis imports no reader, collector or GPU binding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from moptd.located import LocatedError
from moptd.observations import Batch, Event


class TimelineError(LocatedError):
    """Evidence that cannot be read into a timeline: names the file and line (0: the file
    as a whole). moptd.bundle.BundleError is the one raised today."""


@dataclass
class Timeline:
    path: Path
    meta: dict[str, object] = field(default_factory=dict)
    observations: list[tuple[float, str, Batch]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    missing_namespaces: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    # No wall-clock time anywhere in the evidence: the times are relative (to the kernel's
    # boot where ``relative_to`` says "kernel boot", else only the order counts) and must
    # never be printed as dates (they would read as 1970).
    untimed: bool = False
    relative_to: str = ""

    def steps(self) -> list[float]:
        times = {t for t, _, _ in self.observations} | {e.t for e in self.events}
        return sorted(times)
