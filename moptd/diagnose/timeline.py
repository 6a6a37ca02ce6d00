"""A timeline of observations: what replay feeds the live engine on a virtual clock.

Who builds one (moptd.bundle reads a bundle into it) lives above diagnosis; replay and the
rule tests only consume it, so diagnosis imports no reader, collector or GPU binding.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from moptd.located import LocatedError
from moptd.observations import Batch, Event


class TimelineError(LocatedError):
    """Evidence that cannot be read into a timeline: names the file and line (0: the file
    as a whole). moptd.bundle.BundleError is the one raised today."""


Observation = tuple[float, str, Batch]  # (time, source, what the source saw)


@dataclass
class Timeline:
    path: Path
    meta: dict[str, object] = field(default_factory=dict)
    observations: list[Observation] = field(default_factory=list)  # in time order
    events: list[Event] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    missing_namespaces: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    # what was read: one entry per input file or pasted section (moptd.bundle.intake)
    read: list[dict[str, object]] = field(default_factory=list)
    # No wall-clock time anywhere in the evidence: the times are relative (to the kernel's
    # boot where ``relative_to`` says "kernel boot", else only the order counts) and must
    # never be printed as dates (they would read as 1970).
    untimed: bool = False
    relative_to: str = ""
    # A long stream read as it is replayed (a bundle's gpu/samples.jsonl): each call gives
    # a new iterator over it, in time order, from lazy_first to lazy_last. At one time its
    # observations come after those of the sources in lazy_follows and before the others,
    # where they would be had it been read into ``observations``.
    lazy: Callable[[], Iterator[Observation]] | None = None
    lazy_first: float | None = None
    lazy_last: float | None = None
    lazy_follows: frozenset[str] = frozenset()

    def iter_observations(self) -> Iterator[Observation]:
        """Every observation in time order, the lazy stream merged in."""
        if self.lazy is None:
            return iter(self.observations)
        before = [o for o in self.observations if o[1] in self.lazy_follows]
        after = [o for o in self.observations if o[1] not in self.lazy_follows]
        # merge is stable across its inputs: at one time, before, then lazy, then after
        return heapq.merge(before, self.lazy(), after, key=_time)

    def span(self) -> tuple[float, float] | None:
        """The first and last time of the evidence, without reading the lazy stream."""
        times = [t for o in (self.observations[:1], self.observations[-1:]) for t, _, _ in o]
        times += [e.t for e in (self.events[:1] + self.events[-1:])]
        times += [t for t in (self.lazy_first, self.lazy_last) if t is not None]
        return (min(times), max(times)) if times else None

    def steps(self) -> list[float]:
        """Every time stamp (reads a lazy stream through: replay counts them as it goes)."""
        times = {t for t, _, _ in self.iter_observations()} | {e.t for e in self.events}
        return sorted(times)


def _time(o: Observation) -> float:
    return o[0]
