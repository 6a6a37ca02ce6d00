"""The version lock's driver side against the live driver: NVML's answers (what the versions
collector, doctor and record read) against nvidia-smi's own.

Runs only on a GPU host (``pytest -m gpu tests/gpu``).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from moptd.serving.version_lock import live_driver_facts

pytestmark = pytest.mark.gpu


def _smi(*args: str) -> str:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not on PATH")
    return subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def test_driver_facts_match_nvidia_smi() -> None:
    facts = live_driver_facts()
    rows = [
        [c.strip() for c in line.split(",")]
        for line in _smi(
            "--query-gpu=index,name,driver_version,compute_cap", "--format=csv,noheader"
        ).splitlines()
        if line.strip()
    ]
    assert facts.version == rows[0][2]
    # nvidia-smi's banner prints the CUDA version the driver supports ("CUDA Version: 12.9")
    banner = re.search(r"CUDA Version:\s*(\d+\.\d+)", _smi())
    assert banner is not None
    assert facts.cuda == banner.group(1)
    assert facts.cuda_source == "nvml"
    assert [(g.index, g.name, g.compute_capability) for g in facts.gpus] == [
        (int(i), name, cap) for i, name, _, cap in rows
    ]


def test_the_versions_collector_reads_the_live_driver() -> None:
    """The daemon's versions collector on the live host: the driver, its CUDA version and
    each GPU's minimum CUDA become the samples the cuda-compat and cuda-arch rules read."""
    from moptd.collector import CollectorContext
    from moptd.collectors.versions import VersionsCollector

    c = VersionsCollector(CollectorContext(options={}))
    batch = c.read()
    assert c.last_record is not None
    assert c.last_record["driver"]["version"] == live_driver_facts().version
    signals = {s.signal for s in batch.samples}
    assert {"versions.driver", "versions.driver_cuda", "versions.gpu_min_cuda"} <= signals
