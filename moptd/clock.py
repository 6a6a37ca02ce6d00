"""Injectable clocks: the daemon runs on the system clock, replay and tests on virtual time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock time in Unix seconds."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class VirtualClock:
    """A clock that only moves when told to; replay steps it through a bundle's time stamps."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual clock cannot go back from {self._now} to {t}")
        self._now = t

    def advance(self, seconds: float) -> None:
        self.set(self._now + seconds)


def next_on_grid(now: float, interval: float) -> float:
    """The first multiple of `interval` after `now` (monotonic seconds). Loops that wake on
    the same grid wake together: on a VM every wake-up of the event loop or a thread costs
    a few hundred µs of CPU, more than most of the work done after it."""
    return (now // interval + 1) * interval
