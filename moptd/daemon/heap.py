"""The start-up heap leaves the garbage collector's walks (``gc.freeze()``).

Once moptd runs, its start-up heap (modules, the signal catalog, compiled rules, parser
tables: about 45,000 objects) never becomes garbage, yet every full (generation 2)
collection walked it again. Against a serving endpoint whose label values rotate, with the
store holding its 20,000 serving series, one full collection took 26-45 ms on the event
loop (in-process, 2-core VM), the largest part of the /metrics p99 (BENCHMARKS.md, "The
/metrics tail under a hostile endpoint"). Frozen after the first collection pass, the same
collection takes about 4 ms. What is frozen is never collected: a collection runs just
before, so only the live start-up heap is frozen, once.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_start_up_heap() -> int:
    """Collect, then move every object tracked now to the permanent generation; the count."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("start-up heap frozen: %d objects out of the collector's walks", frozen)
    return frozen
