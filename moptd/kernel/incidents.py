"""Group related Xids of one GPU into incidents.

A burst of Xids is one incident until the GPU has been quiet for ``gap`` seconds (3
minutes, the grouping NVIDIA's fleet tooling uses); a line that says "caused by previous
Xid N" joins the incident holding Xid N even after a longer silence, because the driver
itself says they are one event.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

DEFAULT_GAP = 180.0


@dataclass(slots=True)
class Incident:
    id: str
    first_t: float | None
    last_t: float | None
    codes: set[int] = field(default_factory=set)
    count: int = 0


class IncidentTracker:
    def __init__(self, gap: float = DEFAULT_GAP, max_open: int = 1024) -> None:
        self.gap = gap
        self.max_open = max_open
        self._open: OrderedDict[str, Incident] = OrderedDict()
        self._serial = 0

    def assign(self, key: str, t: float | None, code: int, caused_by: int | None = None) -> str:
        """The incident id of one Xid on one GPU (``key``: its subject)."""
        inc = self._open.get(key)
        if inc is not None and not self._joins(inc, t, caused_by):
            inc = None
        if inc is None:
            self._serial += 1
            stamp = f"{t:.0f}" if t is not None else f"n{self._serial}"
            inc = Incident(f"{key}/{stamp}", t, t)
            self._open[key] = inc
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
        inc.codes.add(code)
        inc.count += 1
        if t is not None and (inc.last_t is None or t > inc.last_t):
            inc.last_t = t
        self._open.move_to_end(key)
        return inc.id

    def _joins(self, inc: Incident, t: float | None, caused_by: int | None) -> bool:
        if caused_by is not None and caused_by in inc.codes:
            return True
        if t is None or inc.last_t is None:
            return True  # no clock (a paste without times): one incident per GPU
        return t - inc.last_t <= self.gap

    def get(self, key: str) -> Incident | None:
        return self._open.get(key)
