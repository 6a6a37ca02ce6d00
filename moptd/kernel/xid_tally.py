"""Xid occurrences per GPU and code, counted once whichever source reported them.

The kernel log (an NVRM Xid line) and NVML events (``nvmlEventTypeXidCriticalError``) both
report an Xid; where both are open, most occurrences arrive twice, a moment apart. An
occurrence from one source is the same one as an occurrence from the other on the same
GPU subject and code within ``MATCH_WINDOW`` seconds, each pairing at most once; so a
burst seen by both counts as many as the source that saw more, and an Xid seen only
through NVML (where /dev/kmsg is closed to moptd) counts too.

One collector reports the counter (``gpu.xid_errors``, ``gpu.xid_last_time``), so that
/metrics never holds two series for it: the kernel collector while it follows the kernel
log, the NVML collector otherwise.
"""

from __future__ import annotations

import threading
from collections import deque

from moptd.observations import Batch, labels_of

# NVML delivers an Xid event within milliseconds of the driver's line, and the kernel's
# time of the line is its own clock read at printk: seconds apart at most. Repeats of one
# Xid on one GPU (an Xid 13 per faulting warp) pair one to one, so a wide window costs
# nothing but an exact pairing order.
MATCH_WINDOW = 10.0
MAX_UNMATCHED = 4096  # per GPU and code: a storm from one source alone stays bounded

KERNEL = "kernel"
NVML = "nvml"


class XidTally:
    def __init__(self, window: float = MATCH_WINDOW) -> None:
        self.window = window
        self.counts: dict[tuple[str, int], int] = {}
        self.last_time: dict[str, float] = {}
        self.kernel_following = False  # the kernel collector reports the counter
        # occurrences not yet paired, oldest first: (source, time)
        self._unmatched: dict[tuple[str, int], deque[tuple[str, float]]] = {}
        self._lock = threading.Lock()

    def add(self, source: str, subject: str, code: int, t: float) -> bool:
        """One occurrence; False when it is one the other source already reported."""
        key = (subject, code)
        with self._lock:
            self.last_time[subject] = max(t, self.last_time.get(subject, t))
            pending = self._unmatched.setdefault(key, deque(maxlen=MAX_UNMATCHED))
            while pending and pending[0][1] < t - self.window:
                pending.popleft()  # too old to pair with this one or any later
            for i, (other, t_other) in enumerate(pending):
                if other != source and abs(t - t_other) <= self.window:
                    del pending[i]
                    return False
            pending.append((source, t))
            self.counts[key] = self.counts.get(key, 0) + 1
            return True

    def report(self, batch: Batch) -> None:
        """The counter and last times, as samples (by the one collector reporting them)."""
        with self._lock:
            counts = sorted(self.counts.items())
            last = list(self.last_time.items())
        for (subject, code), n in counts:
            batch.add("gpu.xid_errors", subject, float(n), labels_of(xid=str(code)))
        for subject, t in last:
            batch.add("gpu.xid_last_time", subject, t)
