"""A cross-layer incident from recorded evidence (issue 21 item 3): an Xid 79 on the GPU a
vLLM engine uses, then the engine's stall, replayed from a bundle, explained as one incident
with the cause first; and the same link through the daemon's findings API.

The bundle (tests/fixtures/incidents/xid79-gpu-then-vllm-shm-stall/SOURCE.md) combines two
real captures; the GPU the engine runs on is the one adaptation.
Set MOPTD_UPDATE_GOLDEN=1 to rewrite the golden file after a deliberate change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from moptd.clock import VirtualClock
from moptd.daemon.api import make_api_app
from moptd.daemon.runtime import CollectorRuntime
from moptd.diagnose.loader import default_rules_dir
from moptd.findings.service import build_diagnosis
from moptd.kernel.attribution import records_to_events
from moptd.kernel.logparse import parse_kernel_log
from moptd.observations import Batch, Event
from moptd.serving.signals import fill_engine_gpus
from moptd.store import SignalStore
from tests.conftest import year_free

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "tests" / "fixtures" / "incidents" / "xid79-gpu-then-vllm-shm-stall"
GOLDEN = Path(__file__).parent / "golden"
ENV = {**os.environ, "COLUMNS": "100", "TZ": "UTC", "PYTHONPATH": str(REPO)}
GPU = "gpu:0000:91:00.0"
CAUSE = {"code": "GPU_LOST", "subject": GPU, "rule": "gpu-lost", "link": "serving-after-gpu-fault"}


def moptd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        cwd=REPO,
    )


def by_code(findings: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {str(f["code"]): f for f in findings}


def test_replay_json_links_the_stall_to_the_lost_gpu():
    out = moptd("replay", str(BUNDLE.relative_to(REPO)), "--json")
    assert out.returncode == 2, out.stderr  # the worst finding is critical
    body = json.loads(out.stdout)
    found = by_code(body["findings"])
    assert set(found) == {"GPU_LOST", "SCHEDULER_STALL"}
    stall, lost = found["SCHEDULER_STALL"], found["GPU_LOST"]
    by = stall["caused_by"]
    assert isinstance(by, dict)
    assert {k: by[k] for k in CAUSE} == CAUSE
    assert by["since"] == lost["first_seen"]  # the cause fired no later than the stall
    assert lost["consequences"] == [
        {
            "code": "SCHEDULER_STALL",
            "subject": "serving:vllm",
            "rule": "serving-scheduler-stall",
            "link": "serving-after-gpu-fault",
        }
    ]
    # the contract's keys are all still there: the links are additions
    for f in body["findings"]:
        assert {"code", "subject", "severity", "rule", "summary", "first_seen", "path"} <= set(f)


def test_explain_shows_one_incident_with_the_cause_first_golden():
    out = moptd("explain", "--bundle", str(BUNDLE.relative_to(REPO)))
    assert out.returncode == 0, out.stderr
    text = year_free(out.stdout)
    path = GOLDEN / "explain_cross_layer.txt"
    if os.environ.get("MOPTD_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    assert "2 problems: 2 critical, 0 warning, 0 info; in 1 block below" in text
    blocks = [line for line in text.splitlines() if line[:1].isdigit() and ". " in line[:4]]
    assert len(blocks) == 1
    assert f"GPU_LOST on {GPU}" in blocks[0]
    assert "   led to: CRITICAL SCHEDULER_STALL on serving:vllm: " in text


def test_explain_json_carries_the_link_and_the_related_findings():
    out = moptd("explain", "--bundle", str(BUNDLE.relative_to(REPO)), "--json")
    assert out.returncode == 0, out.stderr
    found = by_code(json.loads(out.stdout)["findings"])
    stall, lost = found["SCHEDULER_STALL"], found["GPU_LOST"]
    assert stall["caused_by"]["code"] == "GPU_LOST"
    assert [(r["code"], r["link"]) for r in stall["related"]] == [("GPU_LOST", "cause")]
    assert [(r["code"], r["link"]) for r in lost["related"]] == [("SCHEDULER_STALL", "consequence")]


def test_verbose_says_what_caused_it():
    text = moptd("explain", "--bundle", str(BUNDLE.relative_to(REPO)), "--verbose").stdout
    assert f"  caused by: GPU_LOST on {GPU} (serving-after-gpu-fault)" in text
    assert "  its cause: GPU_LOST on " in text
    assert "  follows from it: SCHEDULER_STALL on " in text


async def test_the_daemon_api_gives_the_link_with_finding_ids(tmp_path: Path):
    """The real rules over a store fed as the collectors feed it (the real Xid lines through
    the kernel parser, the engine's CUDA_VISIBLE_DEVICES, an engine-death event): the
    /v1/findings answer carries caused_by and consequences with the stored ids."""
    clock = VirtualClock(1000.0)
    store = SignalStore(clock=clock)
    d = build_diagnosis(store, tmp_path / "state", [default_rules_dir()], clock=clock)
    await d.start()
    sock = tmp_path / "api.sock"
    runner = web.AppRunner(make_api_app(store, CollectorRuntime(store, {}), 0.0, d))
    await runner.setup()
    await web.UnixSite(runner, str(sock)).start()
    try:
        text = (BUNDLE / "kernel" / "dmesg.txt").read_text()
        store.add_events(records_to_events(parse_kernel_log(text), {}, default_time=1000.0))
        b = Batch()
        env = {"CUDA_VISIBLE_DEVICES": "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"}
        fill_engine_gpus(b, "serving:vllm", [], env)
        b.add("serving.up", "serving:vllm", 1.0)
        b.add("serving.healthy", "serving:vllm", 1.0)
        store.ingest("serving", b, 1000.0)
        d.tick(1000.0)
        clock.set(1030.0)
        dead = Event("serving.engine_dead", "serving:vllm", 1030.0, {"kind": "engine_core_fatal"})
        store.add_events([dead])
        d.tick(1030.0)
        d.db.flush()
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(sock))) as s:
            async with s.get("http://x/v1/findings") as resp:
                body = await resp.json()
    finally:
        await runner.cleanup()
        await d.stop()
    active = by_code(body["active"])
    lost, dead_f = active["GPU_LOST"], active["ENGINE_DEAD"]
    assert {k: dead_f["caused_by"][k] for k in CAUSE} == CAUSE
    assert dead_f["caused_by"]["id"] == lost["id"]
    (consequence,) = lost["consequences"]
    assert consequence["code"] == "ENGINE_DEAD"
    assert consequence["id"] == dead_f["id"]
    # the history row keeps the link the finding had when it fired
    stored = by_code([h for h in body["history"] if h["state"] == "firing"])
    assert stored["ENGINE_DEAD"]["caused_by"]["code"] == "GPU_LOST"
