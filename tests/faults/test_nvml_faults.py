"""NVML faults mid-run on some GPUs of a real daemon, through the recorded backend replaying
the real H200 capture with fault entries spliced in (moptd/gpu/recorded.py).

Six GPUs, each replaying the capture; after a few good reads:
  gpu 0  stays healthy (the control);
  gpu 1  is lost (NVML_ERROR_GPU_IS_LOST, 15)            -> moptd_gpu_lost 1, GPU_LOST;
  gpu 2  answers NVML_ERROR_UNKNOWN (999), which the live backend treats as lost
         (moptd/gpu/backend.py)              -> moptd_gpu_lost 1, GPU_LOST;
  gpu 3  hangs in an NVML call far past gpu_deadline    -> error code 10 (TIMEOUT), values
         gone, the other GPUs' fast tier keeps its age under the deadline;
  gpu 4  starts answering NotSupported for power and temperature -> those metrics absent,
         never 0, while its other metrics stay;
  gpu 5  fails every fast read with an error that is not "lost" (OPERATING_SYSTEM, 17)
         -> error code 17, gpu_lost 0, its last fast values kept with a growing age.

`replicate` is not used: a fault entry in a recorded stream hits every replica of it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from moptd.findings.db import FILE_NAME
from tests.conftest import FIXTURES
from tests.faults.conftest import api_get, assert_serving, metric_value, start_daemon, wait_for

pytestmark = pytest.mark.slow

CAPTURE = FIXTURES / "h200" / "nvml_recording_h200.jsonl"
GOOD_READS = 4  # fast reads each GPU answers before its fault (interval 0.25 s: about 1 s)
HANG_SECONDS = 120
GPU_DEADLINE = 1.0
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_OPERATING_SYSTEM = 17


def faulty_recording(path: Path) -> Path:
    lines = [json.loads(x) for x in CAPTURE.read_text().splitlines() if x.strip()]
    header, entries = lines[0], lines[1:]
    assert header["gpus"] == 1
    header["gpus"] = 6
    out = [header]
    for gpu in range(6):
        fast_seen = 0
        for e in entries:
            e = {**e, "gpu": gpu}
            if e["tier"] == "fast":
                if fast_seen == GOOD_READS:
                    out.extend(fault_entries(gpu, e["t"]))
                fast_seen += 1
                if gpu == 4 and fast_seen > GOOD_READS:
                    reading = {**e["reading"], "power": None, "temperature": None}
                    e = {**e, "reading": reading}
                if gpu == 5 and fast_seen > GOOD_READS:
                    # every later fast read fails: the stream wraps, so the whole rest of
                    # the capture stands for "keeps failing"
                    e = {"t": e["t"], "gpu": 5, "tier": "fast", "fault": "error",
                         "code": NVML_ERROR_OPERATING_SYSTEM}
            out.append(e)
    path.write_text("".join(json.dumps(o) + "\n" for o in out))
    return path


def fault_entries(gpu: int, t: float) -> list[dict]:
    base = {"t": t, "gpu": gpu, "tier": "fast"}
    if gpu == 1:
        return [{**base, "fault": "lost", "code": NVML_ERROR_GPU_IS_LOST}]
    if gpu == 2:
        return [{**base, "fault": "lost", "code": NVML_ERROR_UNKNOWN}]
    if gpu == 3:
        return [{**base, "fault": "hang", "seconds": HANG_SECONDS}]
    return []


def gpu_value(text: str, name: str, gpu: int, **labels: str) -> float | None:
    return metric_value(text, name, gpu=str(gpu), **labels)


def test_nvml_faults_on_some_gpus_leave_the_others_and_the_daemon_serving(tmp_path):
    recording = faulty_recording(tmp_path / "faulty.jsonl")
    extra = {
        "collectors": {
            "nvml": {
                "interval": 0.25,
                "backend": "recorded",
                "recording": str(recording),
                "gpu_deadline": GPU_DEADLINE,
                "slow_interval": 1.0,
                "xid_events": False,
            },
            # the host's kernel log is shared with other tests writing Xids to it
            "kernel": {"enabled": False},
        },
        "rules": {"interval": 0.5},
    }
    d = start_daemon(tmp_path / "d", extra)
    try:
        first = assert_serving(d)
        for gpu in range(6):
            assert gpu_value(first, "moptd_gpu_lost", gpu) == 0.0, gpu

        def faults_visible() -> str | None:
            text = assert_serving(d)
            lost = [gpu_value(text, "moptd_gpu_lost", g) for g in (1, 2)]
            hung = gpu_value(text, "moptd_gpu_nvml_last_error_code", 3)
            notsup = gpu_value(text, "moptd_gpu_power_usage_watts", 4)
            failing = gpu_value(text, "moptd_gpu_nvml_last_error_code", 5)
            gpu_lost = metric_value(
                text, "moptd_finding_active", code="GPU_LOST", subject="gpu:2"
            ) == 1.0
            ok = (lost == [1.0, 1.0] and hung == NVML_ERROR_TIMEOUT and notsup is None
                  and failing == NVML_ERROR_OPERATING_SYSTEM and gpu_lost)
            return text if ok else None

        text = wait_for(faults_visible, timeout=20, step=0.25)
        # Watch a few more seconds: the faults hold, the healthy GPUs stay current, the
        # daemon keeps answering.
        ages0: list[float] = []
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            text = assert_serving(d)
            age = gpu_value(text, "moptd_gpu_sample_age_seconds", 0, tier="fast")
            assert age is not None
            ages0.append(age)
            time.sleep(0.25)
        health = api_get(d, "/v1/health")
        findings = api_get(d, "/v1/findings?code=GPU_LOST")
    finally:
        d.stop()

    # healthy GPUs (0, and 4 apart from its NotSupported fields) keep fresh values: the hung
    # GPU 3 never delays them past its deadline
    assert max(ages0) < GPU_DEADLINE + 1.0, ages0
    assert gpu_value(text, "moptd_gpu_lost", 0) == 0.0
    assert gpu_value(text, "moptd_gpu_nvml_last_error_code", 0) == 0.0
    assert gpu_value(text, "moptd_gpu_utilization_ratio", 0) is not None
    assert gpu_value(text, "moptd_gpu_power_usage_watts", 0) is not None

    # lost (15) and unknown (999): lost, their values gone (not stale), still identified
    for gpu, code in ((1, NVML_ERROR_GPU_IS_LOST), (2, NVML_ERROR_UNKNOWN)):
        assert gpu_value(text, "moptd_gpu_lost", gpu) == 1.0
        assert gpu_value(text, "moptd_gpu_nvml_last_error_code", gpu) == code
        assert gpu_value(text, "moptd_gpu_utilization_ratio", gpu) is None
        assert gpu_value(text, "moptd_gpu_memory_used_bytes", gpu) is None
        assert gpu_value(text, "moptd_gpu_power_limit_watts", gpu) is not None  # static

    # hung: a timeout, no values read before the hang presented as current, and the age of
    # its last good fast read grows past the deadline
    assert gpu_value(text, "moptd_gpu_nvml_last_error_code", 3) == NVML_ERROR_TIMEOUT
    assert gpu_value(text, "moptd_gpu_utilization_ratio", 3) is None
    hung_age = gpu_value(text, "moptd_gpu_sample_age_seconds", 3, tier="fast")
    assert hung_age is not None
    assert hung_age > GPU_DEADLINE

    # NotSupported: absent, never 0; the same reading's supported values stay
    assert gpu_value(text, "moptd_gpu_power_usage_watts", 4) is None
    assert gpu_value(text, "moptd_gpu_temperature_celsius", 4) is None
    assert 'moptd_gpu_power_usage_watts{gpu="4"' not in text
    assert gpu_value(text, "moptd_gpu_memory_used_bytes", 4) is not None
    assert gpu_value(text, "moptd_gpu_nvml_last_error_code", 4) == 0.0
    assert gpu_value(text, "moptd_gpu_lost", 4) == 0.0

    # an error that is not "lost": reported, the GPU is not called lost, its last fast
    # values stay with their age
    assert gpu_value(text, "moptd_gpu_nvml_last_error_code", 5) == NVML_ERROR_OPERATING_SYSTEM
    assert gpu_value(text, "moptd_gpu_lost", 5) == 0.0
    assert gpu_value(text, "moptd_gpu_utilization_ratio", 5) is not None
    stale = gpu_value(text, "moptd_gpu_sample_age_seconds", 5, tier="fast")
    assert stale is not None
    assert stale > 1.0

    # findings: GPU_LOST for GPUs 1 and 2 only; the collector itself stays healthy
    lost_subjects = {f["subject"] for f in findings["active"]}
    assert lost_subjects == {"gpu:1", "gpu:2"}, findings["active"]
    assert health["collectors"]["nvml"]["state"] == "ok", health["collectors"]["nvml"]
    assert metric_value(text, "moptd_collector_success", collector="nvml") == 1.0

    # committed: both GPU_LOST findings are in the database after the daemon stopped
    with sqlite3.connect(d.state_dir / FILE_NAME) as db:
        rows = db.execute(
            "SELECT subject, state FROM findings WHERE code = 'GPU_LOST'"
        ).fetchall()
    assert {s for s, state in rows if state == "firing"} == {"gpu:1", "gpu:2"}, rows
    assert "Traceback" not in d.log()
