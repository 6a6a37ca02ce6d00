"""The serving collector against real HTTP servers (aiohttp) serving real vLLM captures,
and against bad ones: garbage, truncated, huge and slow /metrics answers."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from moptd.collector import CollectorContext, Unavailable
from moptd.collectors.serving import ServingCollector
from moptd.observations import Batch, Event, labels_of
from moptd.serving.spec import SpecError
from tests.conftest import FIXTURES

VLLM = FIXTURES / "vllm-cpu"


class Server:
    def __init__(self) -> None:
        self.pages = {"good": (VLLM / "vllm_cpu_metrics_idle.txt").read_text()}
        self.accept: list[str | None] = []
        self.hang_generate = False
        app = web.Application()
        app.router.add_get("/{ep}/metrics", self.metrics)
        app.router.add_get("/{ep}/health", self.health)
        app.router.add_get("/{ep}/v1/models", self.models)
        app.router.add_post("/{ep}/v1/completions", self.complete)
        self.runner = web.AppRunner(app)
        self.port = 0

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def url(self, ep: str) -> str:
        return f"http://127.0.0.1:{self.port}/{ep}"

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        ep = request.match_info["ep"]
        self.accept.append(request.headers.get("Accept"))
        if ep == "garbage":
            return web.Response(text="<html><body>502 Bad Gateway</body></html>")
        if ep == "huge":
            return web.Response(body=b"vllm:x 1\n" * (3 << 20))
        if ep == "slow":
            await asyncio.sleep(3)
        if ep == "trickle":
            resp = web.StreamResponse()
            await resp.prepare(request)
            for _ in range(40):
                await resp.write(b"# still here\n")
                await asyncio.sleep(0.1)
            return resp
        if ep == "truncated":
            resp = web.StreamResponse(headers={"Content-Length": "100000"})
            await resp.prepare(request)
            await resp.write(self.pages["good"][:500].encode())
            request.transport.close()  # type: ignore[union-attr]
            return resp
        if ep == "status":
            return web.Response(status=500, text="oops")
        return web.Response(text=self.pages.get(ep, self.pages["good"]))

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if request.match_info["ep"] == "dead" else 200)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tinyllama"}]})

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        assert body["max_tokens"] == 1
        if self.hang_generate:
            await asyncio.sleep(2)
        return web.json_response({"choices": [{"text": "x"}]})


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    await s.start()
    yield s
    await s.runner.cleanup()


def collector(
    tmp_path: Path, endpoints: list[dict[str, object]], **opts: object
) -> ServingCollector:
    options: dict[str, object] = {"endpoints": endpoints, "scrape_timeout": 1.0}
    options.update(opts)
    return ServingCollector(CollectorContext(options=options, state_dir=tmp_path))


def value(b: Batch, signal: str, subject: str, labels: tuple[tuple[str, str], ...] = ()) -> object:
    found = [
        s.value for s in b.samples if (s.signal, s.subject, s.labels) == (signal, subject, labels)
    ]
    return found[-1] if found else None


async def test_real_page_becomes_signals_and_no_accept_header(
    server: Server, tmp_path: Path
) -> None:
    c = collector(
        tmp_path, [{"name": "a", "url": server.url("good"), "probes": ["health", "models"]}]
    )
    await c.start()
    try:
        b = await c.collect()
        s = "serving:a"
        assert value(b, "serving.up", s) == 1.0
        assert value(b, "serving.healthy", s) == 1.0
        assert value(b, "serving.requests_running", s) == 0.0
        assert value(b, "serving.kv_cache_capacity_tokens", s) == 5120.0
        assert value(b, "serving.gpu_memory_utilization", s) == 0.92
        assert value(b, "serving.probe_success", s, labels_of(probe="models")) == 1.0
        assert server.accept == [None]  # an OpenMetrics Accept would rename vllm: to vllm_
        server.pages["good"] = (VLLM / "vllm_cpu_metrics_load.txt").read_text()
        b = await c.collect()
        assert value(b, "serving.requests_running", s) == 8.0
        assert value(b, "serving.requests_waiting", s) == 12.0
        assert (
            value(b, "serving.requests_waiting_by_reason", s, labels_of(reason="capacity")) == 12.0
        )
        assert value(b, "serving.kv_cache_usage", s) == pytest.approx(0.8205, abs=1e-4)
        p99 = value(b, "serving.ttft", s, labels_of(quantile="0.99"))
        assert isinstance(p99, float)
        assert p99 > 0
        info = next(x for x in b.samples if x.signal == "serving.info")
        assert dict(info.labels)["model"] == "tinyllama"
    finally:
        await c.stop()


@pytest.mark.parametrize(
    ("ep", "why"),
    [
        ("garbage", "not a sample"),
        ("huge", "larger than"),
        ("slow", "no complete answer"),
        ("trickle", "no complete answer"),
        ("truncated", "Payload"),
        ("status", "HTTP 500"),
    ],
)
async def test_bad_metrics_fail_only_their_endpoint(
    server: Server, tmp_path: Path, ep: str, why: str
) -> None:
    c = collector(
        tmp_path,
        [{"name": "bad", "url": server.url(ep)}, {"name": "good", "url": server.url("good")}],
        max_response_bytes=1 << 20,
    )
    await c.start()
    try:
        t0 = time.monotonic()
        b = await c.collect()
        assert time.monotonic() - t0 < 5  # bounded by the scrape timeout, not the server
        assert value(b, "serving.up", "serving:bad") == 0.0
        assert value(b, "serving.scrape_failures", "serving:bad") == 1.0
        assert why in b.attrs["serving:bad"]["scrape_error"]
        assert value(b, "serving.requests_running", "serving:bad") is None
        assert value(b, "serving.up", "serving:good") == 1.0
        assert value(b, "serving.requests_running", "serving:good") == 0.0
        b = await c.collect()
        assert value(b, "serving.scrape_failures", "serving:bad") == 2.0
    finally:
        await c.stop()


async def test_health_503_and_a_hung_generation_probe(server: Server, tmp_path: Path) -> None:
    server.hang_generate = True
    c = collector(
        tmp_path,
        [
            {
                "name": "d",
                "url": server.url("dead"),
                "probes": ["health", "generate"],
                "generate_every": 0,
                "generate_deadline": 0.3,
                "model": "tinyllama",
            }
        ],
    )
    await c.start()
    try:
        b = await c.collect()
        assert value(b, "serving.healthy", "serving:d") == 0.0
        await asyncio.sleep(0.6)  # the probe runs beside the passes, bounded by its deadline
        b = await c.collect()
        assert value(b, "serving.probe_success", "serving:d", labels_of(probe="generate")) == 0.0
        assert "no complete answer" in b.attrs["serving:d"]["probe_generate_error"]
    finally:
        await c.stop()


async def test_no_endpoint_is_unavailable(tmp_path: Path) -> None:
    c = collector(tmp_path, [])
    await c.start()
    with pytest.raises(Unavailable):
        await c.collect()
    await c.stop()


async def test_bad_endpoint_config_names_the_key(tmp_path: Path) -> None:
    c = collector(tmp_path, [{"name": "a", "url": "localhost:8000"}])
    with pytest.raises(SpecError, match=r"endpoints\[0\]\.url"):
        await c.start()
    await c.stop()


async def test_log_file_of_an_unmanaged_server(server: Server, tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("old line written before moptd watched: EngineDeadError\n")
    events: list[Event] = []
    c = ServingCollector(
        CollectorContext(
            options={
                "endpoints": [{"name": "a", "url": server.url("good"), "log_file": str(log)}],
                "scrape_timeout": 1.0,
            },
            state_dir=tmp_path,
            publish=events.extend,
        )
    )
    await c.start()
    try:
        await c.collect()
        assert events == []  # it starts at the end of the file
        real = (VLLM / "vllm_cpu_server_log.txt").read_text().splitlines()
        oom = (FIXTURES / "h200" / "oom_fragmentation.txt").read_text().splitlines()[-1]
        with log.open("a") as fh:
            fh.write("\n".join(real[:120]) + "\n" + oom + "\n")
        b = await c.collect()
        streams = [e.stream for e in events]
        assert "serving.kv_capacity" in streams
        assert "serving.cuda_graphs" in streams
        (ev,) = [e for e in events if e.stream == "serving.cuda_oom"]
        assert ev.subject == "serving:a"
        assert ev.fields["reserved_unallocated_share"] > 0.6  # 90.53 of 139.28 GiB stranded
        assert value(b, "serving.cuda_graphs_enabled", "serving:a") == 0.0
        assert value(b, "serving.kv_cache_capacity_tokens", "serving:a") == 5120.0
        # rotation: the new file is read from its start
        log.rename(tmp_path / "vllm.log.1")
        stats = next(line for line in real if "Avg prompt throughput" in line)
        log.write_text(stats + "\n")
        events.clear()
        await c.collect()
        assert [e.stream for e in events] == ["serving.log_stats"]
    finally:
        await c.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_managed_process_is_scraped_never_started(tmp_path: Path) -> None:
    # a one-shot collection (status --offline, explain, doctor) has no daemon: the managed
    # endpoint is an endpoint like any other, and nothing runs the command
    marker = tmp_path / "started"
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (model / name).write_text("{}")
    managed = {
        "name": "m",
        "command": ["sh", "-c", f"echo $$ >> {marker}; exec sleep 60"],
        "device": "cpu",
        "port": _free_port(),
        "model_dir": str(model),
    }
    c = collector(tmp_path, [], managed=managed)
    await c.start()
    try:
        b = await c.collect()
        await asyncio.sleep(0.5)
    finally:
        await c.stop()
    assert not marker.exists()
    assert value(b, "serving.up", "serving:m") == 0.0
    assert "scrape_error" in b.attrs["serving:m"]
    assert value(b, "serving.model_tokenizer_present", "serving:m") == 1.0
    assert value(b, "serving.process_up", "serving:m") is None  # the daemon's to say


async def test_a_name_both_endpoint_and_managed_is_refused(tmp_path: Path) -> None:
    managed = {"name": "a", "command": ["true"], "device": "cpu"}
    c = collector(tmp_path, [{"name": "a", "url": "http://127.0.0.1:1"}], managed=managed)
    with pytest.raises(ValueError, match="both an endpoint and managed"):
        await c.start()
    await c.stop()
