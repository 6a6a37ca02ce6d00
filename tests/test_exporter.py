"""/metrics rendering: the fast text renderer gives exactly prometheus_client's output."""

from __future__ import annotations

import asyncio
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors.host import HostCollector
from moptd.collectors.nvml import NvmlCollector
from moptd.daemon.exporter import SnapshotCollector, TextRenderer
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
