"""A serving endpoint that is hostile or broken in ways a page parser alone cannot see
(issue 18, items 4 and 11), against a real `moptd run`.

The endpoint is an aiohttp server on a real loopback socket in this process. It serves the
vLLM CPU page captured in tests/fixtures/vllm-cpu (unchanged) followed by adversarial
lines written by this test, in vLLM's own series names and label sets:

- a `finished_reason` label whose values change on every scrape: before the series cap the
  daemon went from 55 to 1,176 MiB in 150 s and its /metrics reached 50,000 series;
- more samples than `sample_limit`, and a label value longer than
  `label_value_length_limit`: the page is refused whole, as Prometheus fails such a scrape;
- +Inf and -Inf values, which /v1/snapshot wrote as bare Infinity (not JSON); they are
  absent now (tests/faults/test_non_finite_engine_values.py).

Throughout, the daemon's /metrics and API answer (`assert_serving`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.api_helpers import wait_for
from tests.conftest import FIXTURES
from tests.daemon_proc import DaemonProcess
from tests.faults.conftest import api_get, assert_serving, metric_value, start_daemon

pytestmark = pytest.mark.slow

PAGE = (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_idle.txt").read_text()
ROTATING_PER_PAGE = 200
MAX_SERIES = 500  # the daemon's store.max_series in these tests


class HostileEngine:
    """An aiohttp server on 127.0.0.1 (its own thread and event loop) whose /metrics body is
    ``page(n)`` for the n-th scrape (1-based)."""

    def __init__(self, page: Callable[[int], str]) -> None:
        self.page = page
        self.scrapes = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        assert started.wait(10), "the hostile engine did not start"

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        started.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock).start()

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        return web.Response(
            text=self.page(self.scrapes), content_type="text/plain", charset="utf-8"
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def rotating_page(n: int) -> str:
    """The captured page, then request_success_total with ROTATING_PER_PAGE finished_reason
    values no earlier scrape had."""
    lines = [
        f'vllm:request_success_total{{engine="0",finished_reason="r{n}-{i}",'
        f'model_name="tinyllama"}} 1.0'
        for i in range(ROTATING_PER_PAGE)
    ]
    return PAGE + "\n".join(lines) + "\n"


@pytest.fixture
def engine_factory() -> Iterator[Callable[[Callable[[int], str]], HostileEngine]]:
    engines: list[HostileEngine] = []

    def make(page: Callable[[int], str]) -> HostileEngine:
        e = HostileEngine(page)
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()


def serving_daemon(tmp: Path, engine: HostileEngine, **serving: Any) -> DaemonProcess:
    return start_daemon(
        tmp,
        {
            "store": {"max_series": MAX_SERIES},
            "collectors": {
                "serving": {
                    "interval": "200ms",
                    "endpoints": [
                        {"name": "hostile", "url": engine.url, "engine": "vllm",
                         "probes": ["health"]}
                    ],
                    **serving,
                },
                # what the test reads comes from the serving collector alone
                "nvml": {"enabled": False},
                "container": {"enabled": False},
                "driver": {"enabled": False},
            },
        },
    )


def series_count(d: DaemonProcess) -> int:
    return int(api_get(d, "/v1/status")["store"]["series"])


def test_rotating_label_values_stay_within_the_series_cap(tmp_path, engine_factory):
    engine = engine_factory(rotating_page)
    d = serving_daemon(tmp_path, engine)
    try:
        # three pages bring 600 new series: past the cap of 500
        wait_for(lambda: engine.scrapes >= 4, timeout=30)
        text = wait_for(
            lambda: (t := assert_serving(d))
            and (metric_value(t, "moptd_store_series_dropped_total", collector="serving") or 0)
            > 0
            and t,
            timeout=30,
        )
        first_drop = metric_value(text, "moptd_store_series_dropped_total", collector="serving")
        at_cap = series_count(d)
        scrapes_at_cap = engine.scrapes
        # ten more pages: 2,000 label values never seen before
        wait_for(lambda: engine.scrapes >= scrapes_at_cap + 10, timeout=60)
        time.sleep(0.5)  # the last page's pass reaches the store
        text = assert_serving(d)
        later = series_count(d)
        dropped = metric_value(text, "moptd_store_series_dropped_total", collector="serving")
        assert dropped is not None
        assert first_drop is not None
        # every rotating value past the cap was refused and counted
        assert dropped >= first_drop + 9 * ROTATING_PER_PAGE, (first_drop, dropped)
        # the store stopped growing: a handful of new series from the other collectors at
        # most, never the 2,000 the endpoint offered
        assert later - at_cap < 50, (at_cap, later)
        # and the exporter shows no more than the store holds
        prefix = "moptd_serving_requests_finished_total{"
        finished = [ln for ln in text.splitlines() if ln.startswith(prefix)]
        assert len(finished) <= MAX_SERIES
        # the engine's own series still arrive: the endpoint is up and its gauges current
        assert metric_value(text, "moptd_serving_up", serving="hostile") == 1.0
    finally:
        d.stop()


def too_many_samples(n: int) -> str:
    return PAGE + "".join(f"vllm:num_requests_running{{engine=\"{i}\"}} 0\n" for i in range(600))


def label_value_too_long(n: int) -> str:
    value = "m" * 5000
    return PAGE + f'vllm:num_requests_running{{model_name="{value}"}} 0\n'


@pytest.mark.parametrize(
    ("page", "options", "limit"),
    [
        (too_many_samples, {"sample_limit": 1000}, "sample_limit"),
        (label_value_too_long, {}, "label_value_length_limit"),
    ],
)
def test_a_page_past_a_scrape_limit_is_refused_and_counted(
    tmp_path, engine_factory, page, options, limit
):
    engine = engine_factory(page)
    d = serving_daemon(tmp_path, engine, **options)
    try:
        wait_for(lambda: engine.scrapes >= 3, timeout=30)
        text = wait_for(
            lambda: (t := assert_serving(d))
            and (metric_value(t, "moptd_serving_scrapes_over_limit_total", serving="hostile")
                 or 0) >= 2
            and t,
            timeout=30,
        )
        assert metric_value(text, "moptd_serving_up", serving="hostile") == 0.0
        attrs = api_get(d, "/v1/snapshot?subject=serving:hostile")["subjects"][
            "serving:hostile"
        ]["attrs"]
        assert f"({limit})" in attrs["scrape_error"], attrs
    finally:
        d.stop()


def non_finite_page(n: int) -> str:
    # gauges the vLLM table maps (KV usage, running, waiting); a page's last value wins
    return PAGE + (
        'vllm:kv_cache_usage_perc{engine="0",model_name="tinyllama"} +Inf\n'
        'vllm:num_requests_running{engine="0",model_name="tinyllama"} -Inf\n'
    )


def raw_get(sock: Path, path: str) -> tuple[bytes, bytes]:
    """The status line and the body, as the daemon wrote them (no client decodes them)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0], body


def strict_json(body: bytes) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"not JSON: bare {constant}")

    return json.loads(body, parse_constant=refuse)


def test_non_finite_engine_values_are_strict_json_in_the_snapshot(tmp_path, engine_factory):
    engine = engine_factory(non_finite_page)
    d = serving_daemon(tmp_path, engine)
    try:
        def signals() -> dict[str, Any] | None:
            status, body = raw_get(d.socket, "/v1/snapshot?subject=serving:hostile")
            if b" 404 " in status:
                return None  # the first pass has not reached the store yet
            snap = strict_json(body)
            sig: dict[str, Any] = snap["subjects"]["serving:hostile"]["signals"]
            return sig if "serving.requests_waiting" in sig else None

        sig = wait_for(signals, timeout=30)
        # non-finite engine values are absent, not values (issue 30, item 8)
        assert "serving.kv_cache_usage" not in sig
        assert "serving.requests_running" not in sig
        # every other answer that carries them is strict JSON too
        for path in ("/v1/snapshot", "/v1/status"):
            status, body = raw_get(d.socket, path)
            assert b" 200 " in status, status
            strict_json(body)
        assert_serving(d)
    finally:
        d.stop()
