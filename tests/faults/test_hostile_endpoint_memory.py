"""What a serving endpoint scraped often keeps in moptd's memory (issue 30, item 8: "under
rotating labels below the series cap RSS still creeps").

A real `moptd run` against bench/hostile_endpoint.py's engine (the captured vLLM page and
1,000 new `finished_reason` values a page, scraped every 500 ms) went from 78 to 84 MiB
between its first and fifth minute and stayed there for 15 more (BENCHMARKS.md, "Issue 30:
RSS under rotating label values below the series cap"). The probe inside it
(bench/hostile_rss.py) found that growth in the quantile window: it kept every page's
histograms for `quantile_window` (5 minutes), 600 pages at 500 ms, 2,400 histograms. The
series cap, the label cache and the store's counts were flat.

These tests feed the captured page through the collector's own parse and mapping (as a live
scrape and a replayed bundle do) on a clock that moves 500 ms a page, and count the pages the
window holds: a number, not a time or an RSS.
"""

from __future__ import annotations

import math

from moptd.observations import Batch
from moptd.serving.engines import read_page
from moptd.serving.histogram import Histogram
from moptd.serving.promtext import ScrapeLimits
from moptd.serving.signals import PAGES_PER_WINDOW, HistogramWindow, fill_view
from tests.conftest import FIXTURES

PAGE = (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_idle.txt").read_text()
WINDOW = 300.0  # the collector's default quantile_window
BOUND = 2 * PAGES_PER_WINDOW + 2  # what HistogramWindow.add keeps at most, however fast


def rotating_page(n: int) -> bytes:
    """The captured page, then 1,000 finished_reason values no earlier page had
    (bench/hostile_endpoint.py's page)."""
    extra = "".join(
        f'vllm:request_success_total{{engine="0",finished_reason="r{n}-{i}",'
        f'model_name="tinyllama"}} 1.0\n'
        for i in range(1000)
    )
    return (PAGE + extra).encode()


def test_a_page_every_500ms_keeps_a_bounded_quantile_window() -> None:
    window = HistogramWindow(WINDOW)
    now = 1000.0
    held = []
    for n in range(1, 721):  # 6 minutes of pages: the window and a minute more
        view = read_page("vllm", "/metrics", rotating_page(n), ScrapeLimits())
        b = Batch()
        fill_view(b, "serving:hostile", view, window, now)
        held.append(len(window.history))
        now += 0.5
    # the page's four histograms are there (the window has something to keep)
    assert view.histograms, "the captured page lost its histograms"
    # the tree before kept every page of the window: 601 pages, 2,400 histograms, 7 MiB
    assert max(held) <= BOUND, (max(held), BOUND)
    # and the window is full, not emptied: its oldest page is the window's start
    assert len(window.history) >= PAGES_PER_WINDOW // 2
    assert window.history[0][0] <= now - 0.5 - WINDOW


def counting(n: int) -> dict[str, Histogram]:
    """A histogram that saw one more observation (of 0.5 s) on each page."""
    return {"ttft": Histogram({1.0: float(n), math.inf: float(n)}, float(n), 0.5 * n)}


def test_the_quantiles_still_cover_the_whole_window() -> None:
    # 500 ms pages: what the window counts is the last 300 s and at most window / 60 more
    window = HistogramWindow(WINDOW)
    for n in range(2000):
        recent = window.add(n * 0.5, counting(n))
        if n * 0.5 >= WINDOW:
            seen = recent["ttft"].count
            assert 600 <= seen <= 600 + 2 * (WINDOW / PAGES_PER_WINDOW), (n, seen)


def test_the_default_interval_keeps_every_page() -> None:
    # a page every 5 s (the collector's default interval): as before, every page is kept
    window = HistogramWindow(WINDOW)
    for n in range(200):
        recent = window.add(n * 5.0, counting(n))
    assert len(window.history) == 61
    assert recent["ttft"].count == 60
