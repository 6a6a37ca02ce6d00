"""What an engine module declares (``Engine``) and what reading a page gives (``EngineView``).

An engine is data: the names of its Prometheus series and the engine-neutral field each
maps onto, the fix-ups its names need, the pages it serves in another format, and the
parsers of its own log lines. Nothing outside moptd/serving/engines/ asks which engine it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from moptd.serving.histogram import Histogram
from moptd.serving.logrecord import MessageParser

HISTOGRAMS = ("ttft", "itl", "e2e", "queue_time")

Agg = Literal["sum", "max"]
# wire name -> (field, label that splits it or "", aggregation over the series)
Scalars = Mapping[str, tuple[str, str, Agg]]


@dataclass
class EngineView:
    """What one scrape says about one serving endpoint, in engine-neutral terms."""

    scalars: dict[str, float] = field(default_factory=dict)
    by_label: dict[str, dict[str, float]] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)
    model: str = ""
    engine_series: int = 0  # engine-specific samples seen; 0 with vLLM --disable-log-stats

    def get(self, name: str) -> float | None:
        return self.scalars.get(name)


@dataclass(frozen=True)
class Engine:
    name: str  # the `engine:` value of an endpoint or the managed process
    title: str  # as the docs name it
    metrics_path: str  # where its Prometheus text page is, by default
    prefixes: tuple[str, ...]  # its own series start so (after ``aliases``)
    # a prefix some scrapers write instead (vllm_ for vllm:) -> the one in ``prefixes``
    aliases: Mapping[str, str] = field(default_factory=dict)
    scalars: Scalars = field(default_factory=dict)
    histograms: Mapping[str, str] = field(default_factory=dict)  # base name -> HISTOGRAMS
    info_series: str = ""  # a series whose labels are the engine's cache configuration
    fold: Callable[[EngineView], None] | None = None  # after a page: merge renamed fields
    # metrics_path -> reader, for the pages that are not Prometheus text
    page_readers: Mapping[str, Callable[[bytes], EngineView]] = field(default_factory=dict)
    # a field that counts since the previous read -> the cumulative field it adds up to
    running_totals: Mapping[str, str] = field(default_factory=dict)
    # (substring every matching line contains, parser of the message): its own log lines
    log_parsers: tuple[tuple[str, MessageParser], ...] = ()
