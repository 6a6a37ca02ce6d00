"""The /metrics tail under a hostile serving endpoint (issue 18, item 4's latency half).

The page of an endpoint whose label values rotate (the captured vLLM page and 1,000
`vllm:request_success_total` lines with values no earlier page had) is parsed and mapped
onto samples in the collector's thread, never on the event loop: measured with a real
aiohttp endpoint and the real collector. And the daemon freezes its start-up heap once its
first collection pass is done, so full collections no longer walk it (gc.freeze); checked
on a real `moptd run`. BENCHMARKS.md, "The /metrics tail under a hostile endpoint", has
the figures.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

import moptd.collectors.serving as serving_collector
from moptd.collector import CollectorContext
from moptd.collectors.serving import ServingCollector
from moptd.daemon.heap import freeze_start_up_heap
from tests.conftest import FIXTURES
from tests.faults.conftest import start_daemon

PAGE = (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_idle.txt").read_text()


class Rotating:
    def __init__(self) -> None:
        self.pages = 0

    async def metrics(self, _request: web.Request) -> web.Response:
        self.pages += 1
        n = self.pages
        extra = "".join(
            f'vllm:request_success_total{{engine="0",finished_reason="r{n}-{i}",'
            f'model_name="tinyllama"}} 1.0\n'
            for i in range(1000)
        )
        return web.Response(text=PAGE + extra)


@pytest.fixture
async def endpoint() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/metrics", Rotating().metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_the_hostile_page_is_parsed_and_mapped_off_the_event_loop(
    endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    real = serving_collector.fill_view

    def recording(*args: object, **kwargs: object) -> None:
        threads.append(threading.current_thread().name)
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(serving_collector, "fill_view", recording)
    options = {"endpoints": [{"name": "h", "url": endpoint, "probes": []}], "scrape_timeout": 2}
    c = ServingCollector(CollectorContext(options=options, state_dir=tmp_path))
    await c.start()
    try:
        for _ in range(3):
            b = await c.collect()
            rotating = [
                s for s in b.samples if dict(s.labels).get("finished_reason", "")[:1] == "r"
            ]
            assert len(rotating) >= 1000, "the hostile lines did not reach the batch"
    finally:
        await c.stop()
    loop_thread = threading.current_thread().name
    assert len(threads) == 3
    assert loop_thread not in threads, threads


def test_the_start_up_heap_is_frozen_once() -> None:
    before = gc.get_freeze_count()
    try:
        frozen = freeze_start_up_heap()
        assert frozen >= before
        assert frozen > 1000  # the interpreter and moptd's modules at least
        # what is allocated later is still collected
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()


@pytest.mark.slow
def test_the_daemon_freezes_its_start_up_heap(tmp_path: Path) -> None:
    config = {"collectors": {name: {"enabled": False} for name in ("kernel", "nvml", "container")}}
    d = start_daemon(tmp_path, config)
    try:
        for _ in range(100):
            if "start-up heap frozen" in d.log():
                break
            time.sleep(0.1)
        assert "start-up heap frozen" in d.log(), d.log()[-3000:]
    finally:
        d.stop()
