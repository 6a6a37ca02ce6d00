"""Map a Prometheus text page onto an ``EngineView`` with every engine's names at once.

A page is read with all engines' tables, not only its endpoint's: a saved page (a bundle)
names no engine, and the names do not collide (``PageMapping`` refuses ones that do). Every
engine field sums over data-parallel engine ranks, except where the engine says ``max``
(KV usage, where the fullest rank is what matters).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from moptd.serving.engines.contract import Agg, Engine, EngineView, Scalars
from moptd.serving.histogram import Histogram
from moptd.serving.promtext import PromLimitError, PromSample

# Distinct upper bounds (le) one histogram may have on a page. vLLM's widest has 23; the
# collector keeps a quantile window of pages (5 min of them), so a page that rotated its
# le values within sample_limit would otherwise keep 20,000 buckets a page, 600 pages long.
MAX_BUCKETS = 256

# The API server's own process, whatever the engine (absent with several API servers:
# multiprocess mode).
PROCESS_SCALARS: Scalars = {
    "process_cpu_seconds_total": ("process_cpu_seconds", "", "sum"),
    "process_start_time_seconds": ("process_start_time", "", "max"),
    "process_resident_memory_bytes": ("process_rss", "", "sum"),
}


class PageMapping:
    """The merged wire-name tables of some engines."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        self.engines = tuple(engines)
        self.scalars: dict[str, tuple[str, str, Agg]] = dict(PROCESS_SCALARS)
        self.histograms: dict[str, str] = {}
        self.info_series: set[str] = set()
        self.aliases: dict[str, str] = {}
        self.prefixes: tuple[str, ...] = ()
        owner = dict.fromkeys(PROCESS_SCALARS, "process")
        for e in self.engines:
            for name in (*e.scalars, *e.histograms):
                if name in owner:
                    raise ValueError(f"engine {e.name}: {name} is {owner[name]}'s already")
                owner[name] = e.name
            self.scalars.update(e.scalars)
            self.histograms.update(e.histograms)
            if e.info_series:
                self.info_series.add(e.info_series)
            self.aliases.update(e.aliases)
            self.prefixes += e.prefixes
        self._alias_prefixes = tuple(self.aliases)

    def canonical(self, name: str) -> str:
        # A scraper that sent Prometheus 2.x's Accept header gets vllm_ for vllm:; moptd
        # sends none, but a saved page (a bundle) may come from such a scraper.
        if not name.startswith(self._alias_prefixes):  # most names: one C-level test
            return name
        for alias, prefix in self.aliases.items():
            if name.startswith(alias):
                return prefix + name[len(alias) :]
        return name

    def view(self, samples: Iterable[PromSample]) -> EngineView:
        view = EngineView()
        aggs: dict[str, Agg] = {}
        canonical, prefixes, scalars = self.canonical, self.prefixes, self.scalars
        for s in samples:
            name = canonical(s.name)
            if name.startswith(prefixes):
                view.engine_series += 1
                if not view.model:
                    for k, v in s.labels:
                        if k == "model_name":
                            view.model = v
            spec = scalars.get(name)
            if spec is not None:
                if math.isnan(s.value):
                    continue
                fld, split, agg = spec
                if split:
                    key = next((v for k, v in s.labels if k == split), "")
                    bucket = view.by_label.setdefault(fld, {})
                    bucket[key] = bucket.get(key, 0.0) + s.value
                else:
                    _accumulate(view.scalars, aggs, fld, s.value, agg)
                continue
            if name in self.info_series:
                view.cache_config = {k: v for k, v in s.labels if k not in ("engine", "model_name")}
                continue
            base, _, suffix = name.rpartition("_")
            if suffix in ("bucket", "count", "sum"):
                hname = self.histograms.get(base)
                if hname is not None:
                    h = view.histograms.setdefault(hname, Histogram())
                    if suffix == "bucket":
                        le = next((v for k, v in s.labels if k == "le"), None)
                        if le is not None:
                            h.add_bucket(math.inf if le in ("+Inf", "Inf") else float(le), s.value)
                            if len(h.buckets) > MAX_BUCKETS:
                                raise PromLimitError(
                                    0, "bucket_limit", f"{base} has more than {MAX_BUCKETS} buckets"
                                )
                    elif suffix == "count":
                        h.count += s.value
                    else:
                        h.sum += s.value
        for e in self.engines:
            if e.fold is not None:
                e.fold(view)
        return view

    def detect(self, samples: Iterable[PromSample]) -> str:
        """The engine whose series come first on the page, or ""."""
        for s in samples:
            for e in self.engines:
                if s.name.startswith((*e.prefixes, *e.aliases)):
                    return e.name
        return ""


def _accumulate(out: dict[str, float], aggs: dict[str, Agg], fld: str, v: float, agg: Agg) -> None:
    if fld not in out:
        out[fld] = v
        aggs[fld] = agg
    elif agg == "sum":
        out[fld] += v
    else:
        out[fld] = max(out[fld], v)
