"""A real vLLM under moptd's supervisor with the daemon's diagnosis loop and remediation
actuator over it: what tests/vllm/test_remediation_vllm.py and
bench/remediation_recovery.py drive. The harness (tests/vllm/harness.py) starts the engine
and feeds the store; here a collection loop runs every 2 s beside the real diagnosis loop
(every second and on each event), and the actuator listens to it as in `moptd run`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moptd.daemon.remediation import Remediator
from moptd.findings.service import Diagnosis, build_diagnosis
from moptd.remediation.policy import parse_policy
from tests.conftest import REPO
from tests.vllm.harness import SUBJECT, Harness, engine_core, load, managed

STALL = "SCHEDULER_STALL"
READY_S = 300.0
COLLECT_EVERY = 2.0


def stall_policy(**guards: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "enabled": True,
        "dry_run": False,
        "min_uptime": "10s",
        "min_interval": "1s",
        "breaker_count": 3,
        "breaker_window": "1h",
        "verify_timeout": "5m",
        "policy": [{"code": STALL, "remedy": "restart_engine"}],
    }
    section.update(guards)
    return section


class RemediationRig:
    def __init__(self, tmp: Path, port: int, policy: dict[str, Any]) -> None:
        options = {"managed": managed(port), "quantile_window": "2m", "scrape_timeout": 10}
        self.port = port
        self.h = Harness(tmp, options)
        self.diagnosis: Diagnosis = build_diagnosis(self.h.store, tmp, [REPO / "rules"])
        self.remediator = Remediator(
            parse_policy(policy), self.h.managed, self.diagnosis, self.h.store
        )
        self._collect: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RemediationRig:
        await self.diagnosis.start()
        await self.remediator.start()
        await self.h.start()
        self._collect = asyncio.create_task(self._collect_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._collect is not None:
            self._collect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collect
        await self.remediator.stop()
        await self.h.stop()
        await self.diagnosis.stop()

    async def _collect_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.h.collect()
            await asyncio.sleep(COLLECT_EVERY)

    # --- what the tests wait for ---

    async def until(self, what: str, cond: Callable[[], bool], limit: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit:
            if cond():
                return time.monotonic() - t0
            await asyncio.sleep(0.5)
        tail = "\n".join(line for _, line in self.h.supervisor.ring.tail(30))
        pytest.fail(
            f"{what}: not within {limit:g}s; {self.h.supervisor.status()}\n"
            f"stall rule: {self.stall_result()}\n{tail}"
        )

    def stall_result(self) -> str:
        """The stall rule's last result on the engine, with what each condition saw."""
        r = self.diagnosis.rules.result("serving-scheduler-stall", SUBJECT)
        if r is None:
            return "not evaluated"
        steps = [(s.node, s.value, s.seen) for s in r.steps]
        return f"{r.status} {r.path} {steps}; {self.stall_inputs()}"

    def stall_inputs(self) -> str:
        """What the stall rule reads, as the store holds it now: which of its conditions
        held, when a run of tests fails to see the stall."""
        now = time.time()
        parts = [
            f"{name}={self.h.last(name)}"
            for name in (
                "serving.up",
                "serving.engine_metrics_present",
                "serving.requests_running",
                "serving.requests_waiting",
                "serving.engine_steps",
            )
        ]
        steps = self.h.store.series("serving.engine_steps", SUBJECT)
        if steps is not None:
            parts.append(
                f"engine_steps seen {now - steps.last_seen:.1f}s ago, "
                f"unbroken for {now - steps.observed_since:.1f}s"
            )
        return ", ".join(parts)

    def firing(self, code: str) -> bool:
        return any(f.code == code and f.subject == SUBJECT for f in self.diagnosis.rules.active())

    def audit(self) -> list[dict[str, Any]]:
        return list(reversed(self.diagnosis.db.remediations(subject=SUBJECT)))

    def outcomes(self) -> list[str]:
        return [r["outcome"] for r in self.audit()]

    def serving(self) -> bool:
        """Healthy and the generation probe passes: the service is back."""
        gen = self.h.last("serving.probe_success", (("probe", "generate"),))
        return self.h.last("serving.healthy") == 1.0 and gen == 1.0

    async def ready(self) -> None:
        await self.until("ready", self.serving, READY_S)

    def running_since(self, t: float) -> bool:
        """A scrape taken at or after `t` saw requests running (a value read before the
        load began, e.g. from the generation probe's own request, does not count)."""
        series = self.h.store.series("serving.requests_running", SUBJECT)
        return (
            series is not None
            and series.last_seen >= t
            and (self.h.last("serving.requests_running") or 0) > 0
        )

    async def hang(self) -> tuple[int, asyncio.Task[list[object]]]:
        """Requests in flight, then SIGSTOP the engine core: /health stays 200. The load
        task is returned to be cancelled; the stopped core's pid too. The load is far more
        than the engine finishes in the time this takes (it is cancelled, never awaited);
        if it did end first, what it got is reported, and it is tried again."""
        pgid = self.h.supervisor.pid
        assert pgid is not None
        core = engine_core(pgid)
        ended: list[str] = []
        for _ in range(3):
            started = time.time()
            task = asyncio.create_task(load(self.port, 512, 480, 1800, prompt="request {i}"))
            await self.until("load running", lambda t=started: self.running_since(t), 120)
            os.kill(core, signal.SIGSTOP)
            if not task.done():
                return core, task
            os.kill(core, signal.SIGCONT)
            got = Counter(type(r).__name__ for r in task.result())
            ended.append(f"after {time.time() - started:.1f}s: {dict(got)}")
        pytest.fail(f"the load ended before the engine core was stopped, 3 times: {ended}")


async def cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
