"""The serving engines moptd reads, registered in one place: ``REGISTRY``.

Each engine is one module here declaring an ``Engine`` (moptd/serving/engines/contract.py):
its name, default metrics path, the names of its series and the fields they map onto, the
pages it serves in another format, its per-read counters and its own log lines. The config
check (spec.py), the collector, the log parser and docs/serving.md derive from the registry;
a new engine is one module and one entry below (and its tests and docs).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from moptd.serving.engines import sglang, trtllm, vllm
from moptd.serving.engines.contract import HISTOGRAMS, Engine, EngineView
from moptd.serving.engines.prometheus import PageMapping
from moptd.serving.engines.trtllm import view_from_trtllm_stats
from moptd.serving.logrecord import MessageParser
from moptd.serving.promtext import NO_LIMITS, PromSample, ScrapeLimits, parse

REGISTRY: dict[str, Engine] = {e.name: e for e in (vllm.ENGINE, sglang.ENGINE, trtllm.ENGINE)}
ENGINES = tuple(REGISTRY)

_PAGES = PageMapping(tuple(REGISTRY.values()))

__all__ = [
    "ENGINES",
    "HISTOGRAMS",
    "REGISTRY",
    "Engine",
    "EngineView",
    "add_running_totals",
    "detect_engine",
    "log_parsers",
    "read_page",
    "view_from_samples",
    "view_from_trtllm_stats",
]


def view_from_samples(samples: Iterable[PromSample]) -> EngineView:
    """A Prometheus page, whichever engine's (a bundle's saved page names none)."""
    return _PAGES.view(samples)


def detect_engine(samples: Iterable[PromSample]) -> str:
    return _PAGES.detect(samples)


def read_page(
    engine: str, metrics_path: str, body: bytes, limits: ScrapeLimits = NO_LIMITS
) -> EngineView:
    """An endpoint's /metrics body: the engine's own reader for that path, else Prometheus
    text within ``limits`` (PromLimitError past one)."""
    reader = REGISTRY[engine].page_readers.get(metrics_path)
    if reader is not None:
        return reader(body)
    return view_from_samples(parse(body.decode("utf-8"), limits))


def add_running_totals(engine: str, view: EngineView, totals: MutableMapping[str, float]) -> None:
    """Turn the engine's per-read counts into the cumulative fields rules expect, adding
    each read to ``totals`` (one endpoint's, kept by the caller between reads)."""
    for per_read, total in REGISTRY[engine].running_totals.items():
        if per_read in view.scalars:
            totals[total] = totals.get(total, 0.0) + view.scalars.pop(per_read)
            view.scalars[total] = totals[total]


def log_parsers() -> tuple[tuple[str, MessageParser], ...]:
    """Every engine's own log-line parsers, in registry order."""
    return tuple(p for e in REGISTRY.values() for p in e.log_parsers)
