"""/metrics rendering: the fast text renderer gives exactly prometheus_client's output."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors.host import HostCollector
from moptd.collectors.nvml import NvmlCollector
from moptd.daemon.exporter import MetricsEndpoint, SnapshotCollector, TextRenderer, accepts_gzip
from moptd.observations import Batch, Sample, labels_of
from moptd.store import SignalStore
from tests.conftest import FIXTURES, require_tool

RECORDING = FIXTURES / "h200" / "nvml_recording_h200.jsonl"


def reference(store: SignalStore) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(store))
    return generate_latest(registry)


def eight_gpu_store() -> SignalStore:
    clock = VirtualClock(1_795_969_300.0)
    store = SignalStore(clock)
    opts = {"backend": "recorded", "recording": str(RECORDING), "replicate": 8,
            "xid_events": False}
    nvml = NvmlCollector(CollectorContext(options=opts, clock=clock))

    async def fill() -> None:
        await nvml.start()
        for _ in range(3):
            store.ingest("nvml", await nvml.collect())
            await nvml.settle()  # the virtual clock jumps: let the next reads finish first
            store.ingest("host", await HostCollector(CollectorContext()).collect())
            clock.advance(1)
        await nvml.stop()

    asyncio.run(fill())
    return store


def test_text_renderer_equals_prometheus_client_on_eight_recorded_gpus():
    store = eight_gpu_store()
    fast = TextRenderer().render(store.snapshot())
    assert fast == reference(store)
    assert fast.count(b'moptd_gpu_utilization_ratio{gpu="7"') == 1


def test_renderer_cache_follows_attribute_changes():
    store = SignalStore(VirtualClock(0))
    renderer = TextRenderer()
    b = Batch([Sample("gpu.util", "gpu:0", 0.5)])
    b.describe("gpu:0", uuid="GPU-a")
    store.ingest("x", b)
    assert b'uuid="GPU-a"' in renderer.render(store.snapshot())
    b2 = Batch([Sample("gpu.util", "gpu:0", 0.5)])
    b2.describe("gpu:0", uuid="GPU-b")
    store.ingest("x", b2)
    text = renderer.render(store.snapshot())
    assert b'uuid="GPU-b"' in text
    assert b'uuid="GPU-a"' not in text


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=10), st.floats(allow_nan=False)), max_size=5),
       st.text(max_size=20))
def test_escaping_matches_prometheus_client(paths, uuid):
    store = SignalStore(VirtualClock(0))
    b = Batch([Sample("node.disk_available", "node", v, labels_of(path=p)) for p, v in paths])
    b.add("gpu.util", "gpu:0", 0.25)
    b.describe("gpu:0", uuid=uuid)
    store.ingest("x", b)
    assert TextRenderer().render(store.snapshot()) == reference(store)


def test_promtool_accepts_the_eight_gpu_exposition(tmp_path):
    promtool = require_tool("promtool")
    text = TextRenderer().render(eight_gpu_store().snapshot())
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_series_named_twice_is_written_once_with_the_later_value(tmp_path):
    """A managed vLLM's KV capacity comes from its page (cache_config_info) and its log
    ("GPU KV cache size") in one serving batch: the exposition must not repeat the series
    (Prometheus drops a scrape's repeats with a warning; promtool rejects them)."""
    store = SignalStore(VirtualClock(0))
    b = Batch()
    b.add("serving.kv_cache_capacity_tokens", "serving:tiny", 1920.0)
    b.add("serving.requests_running", "serving:tiny", 3.0)
    b.add("serving.kv_cache_capacity_tokens", "serving:tiny", 2048.0)
    store.ingest("serving", b)
    other = Batch([Sample("serving.kv_cache_capacity_tokens", "serving:tiny", 4096.0)])
    store.ingest("serving-log", other)
    text = TextRenderer().render(store.snapshot())
    assert text == reference(store)
    lines = [ln for ln in text.decode().splitlines()
             if ln.startswith("moptd_serving_kv_cache_capacity_tokens{")]
    assert len(lines) == 1, lines
    assert lines[0].endswith(" 4096.0")  # the later source, as the store's series holds
    assert store.latest("serving.kv_cache_capacity_tokens", "serving:tiny") == 4096.0
    promtool = require_tool("promtool")
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          timeout=30)
    assert b"duplicate" not in proc.stdout + proc.stderr


# --- the first scrape, and gzip ----------------------------------------------------------


def test_every_collector_is_in_the_first_scrape_before_it_has_run(tmp_path):
    """A scrape right after a restart names every enabled collector: success NaN while a
    collector has not run (no `== 0` alert matches it), never an absent series."""
    from moptd.collectors import registry
    from moptd.config import load_config
    from moptd.daemon.app import make_runtime

    cfg = tmp_path / "moptd.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\n")
    config = load_config(cfg, registry())
    store = SignalStore()
    runtime = make_runtime(config, store)

    async def started() -> bytes:
        await runtime.start(loops=False)
        try:
            return TextRenderer().render(store.snapshot())
        finally:
            await runtime.stop()

    text = asyncio.run(started()).decode()
    success = {
        line.split('collector="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
        for line in text.splitlines()
        if line.startswith("moptd_collector_success{")
    }
    assert set(success) == set(runtime.collectors), text
    for name, value in success.items():
        state = runtime.health[name].state
        want = {"pending": "NaN", "unavailable": "0.0", "failed": "0.0"}[state]
        assert value == want, (name, state, value)


@pytest.mark.parametrize(
    ("header", "gzip_ok"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),  # what Prometheus and curl --compressed send
        ("GZIP;q=0.5", True),
        ("x-gzip", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip;q=0, *", False),
        ("deflate", False),
        ("", False),
        ("identity", False),
        ("*;q=0", False),
        ("gzip;q=nonsense", False),
    ],
)
def test_accept_encoding_negotiation(header, gzip_ok):
    assert accepts_gzip(header) is gzip_ok


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_accept_encoding_never_raises(header):
    assert accepts_gzip(header) in (True, False)


def test_metrics_endpoint_gzips_when_asked_and_only_then():
    """Over a real socket: the gzip body decompresses to the plain one, byte for byte."""
    import gzip
    import urllib.request

    from aiohttp import web

    store = eight_gpu_store()
    endpoint = MetricsEndpoint(store)

    async def serve() -> tuple[bytes, dict[str, str], bytes, dict[str, str]]:
        app = web.Application()
        app.router.add_get("/metrics", endpoint.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]

        def fetch(headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.read(), dict(resp.headers)

        try:
            zipped = await asyncio.to_thread(fetch, {"Accept-Encoding": "gzip"})
            plain = await asyncio.to_thread(fetch, {})
        finally:
            await runner.cleanup()
        return zipped[0], zipped[1], plain[0], plain[1]

    zbody, zheaders, body, headers = asyncio.run(serve())
    assert zheaders["Content-Encoding"] == "gzip"
    assert "Content-Encoding" not in headers
    assert gzip.decompress(zbody) == body
    assert len(zbody) * 3 < len(body), (len(zbody), len(body))
    assert zheaders["Vary"] == "Accept-Encoding"
