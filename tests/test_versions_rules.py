"""The version rules end to end: real files -> versions record -> observations -> the
shipped rules, through doctor's path (moptd/cli/doctor_versions.py, finding_checks)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from moptd.cli.cmd_doctor import finding_checks
from moptd.cli.doctor_versions import view
from moptd.diagnose.loader import default_rules_dir
from moptd.gpu.nvsmi import read_dump
from moptd.serving.version_lock import (
    DriverFacts,
    GpuArch,
    VersionsRecord,
    check_record,
    observations,
    stack_for,
)
from moptd.store import SignalStore

FIX = Path(__file__).parent / "fixtures"
SP = FIX / "site-packages"
# compute capabilities: NVIDIA's CUDA GPUs list (https://developer.nvidia.com/cuda-gpus)
CC = {"NVIDIA GeForce RTX 5090": "12.0", "NVIDIA H200": "9.0", "NVIDIA A10G": "8.6"}


def driver_of(capture: str) -> DriverFacts:
    dump = read_dump(FIX / capture)
    gpus = [
        GpuArch(i, g.static.name, CC[g.static.name])
        for i, g in enumerate(dump.gpus)
        if g.static.name in CC
    ]
    return DriverFacts(
        dump.driver_version, dump.cuda_version, "nvidia-smi", dump.driver_version, gpus
    )


def torch_env(tmp_path: Path, version_py: str) -> Path:
    sp = tmp_path / "site-packages"
    (sp / "torch").mkdir(parents=True)
    shutil.copy(FIX / "torch-version-py" / version_py, sp / "torch" / "version.py")
    return sp


def findings(record: VersionsRecord) -> list[tuple[str, str, str]]:
    doc = check_record(record.to_json())
    store = SignalStore()
    store.ingest("versions", observations(doc), time.time())
    return [
        (c.code, c.name, c.detail) for c in finding_checks(store, [default_rules_dir()]) if c.code
    ]


def test_vllm_0_4_cu121_on_a_470_driver_is_too_old() -> None:
    record = VersionsRecord(
        driver_of("nvsmi-paste/table-470-a10g.txt"), [stack_for("vllm", [SP / "vllm-0.4.0-cu121"])]
    )
    got = findings(record)
    assert [(code, name) for code, name, _ in got] == [
        ("CUDA_DRIVER_TOO_OLD", "finding CUDA_DRIVER_TOO_OLD on node")
    ]
    assert "CUDA 12.x runtime" in got[0][2]
    assert "CUDA 11.x only" in got[0][2]
    rows = {c.name: c.detail for c in view(record.to_json())}
    assert rows["version driver"] == "470.256.02"
    assert rows["version driver CUDA"] == "11.4 (nvidia-smi)"
    assert rows["version vllm PyTorch"] == "2.1.2, CUDA build 12.1"
    assert rows["version vllm vLLM"] == "0.4.0.post1"
    assert rows["version vllm CUDA runtime"].startswith("12.1 (nvidia-cuda-runtime-cu12)")
    assert "TensorRT-LLM" not in " ".join(rows)  # one engine installed: the others are not listed


def test_vllm_0_4_cu121_on_a_535_driver_runs() -> None:
    record = VersionsRecord(
        driver_of("scenarios/hw-power-brake-h100x8/gpu/nvidia-smi/001.txt"),
        [stack_for("vllm", [SP / "vllm-0.4.0-cu121"])],
    )
    assert findings(record) == []


def test_cuda_12_4_runtime_on_a_12_2_driver_is_minor_version_compatible() -> None:
    record = VersionsRecord(
        driver_of("incidents/a10g-pcie-x8-of-x16-aws/gpu/nvidia-smi/001.txt"),
        [stack_for("vllm", [SP / "cuda-runtime-12.4-cudnn-9.1"])],
    )
    assert findings(record) == []
    rows = {c.name: c.detail for c in view(record.to_json())}
    assert "minor-version compatibility" in rows["version vllm CUDA runtime"]
    assert rows["version vllm cuDNN"] == "9.1.0.70"


def test_cu126_torch_on_an_rtx_5090_has_no_kernels(tmp_path: Path) -> None:
    record = VersionsRecord(
        driver_of("snapshot-evidence/pcie-x8-rtx5090/gpu/nvidia-smi/001.txt"),
        [stack_for("app", [torch_env(tmp_path, "torch-2.7.1-cu126.txt")])],
    )
    got = findings(record)
    assert [(code, name) for code, name, _ in got] == [
        ("CUDA_ARCH_UNSUPPORTED", "finding CUDA_ARCH_UNSUPPORTED on gpu:0")
    ]


def test_cuda_13_build_on_an_rtx_5090_is_fine(tmp_path: Path) -> None:
    record = VersionsRecord(
        driver_of("snapshot-evidence/pcie-x8-rtx5090/gpu/nvidia-smi/001.txt"),
        [stack_for("app", [torch_env(tmp_path, "kentstone84-PyTorch-2.10.0_sm120-.txt")])],
    )
    # the 570.124.06 driver supports CUDA 12.8; a 13.0 build needs the 580 branch
    assert [code for code, _, _ in findings(record)] == ["CUDA_DRIVER_TOO_OLD"]


def test_cu118_torch_on_an_h200_is_fine(tmp_path: Path) -> None:
    record = VersionsRecord(
        driver_of("h200/nvsmi_idle.txt"),
        [stack_for("app", [torch_env(tmp_path, "torch-2.4.1-cu118.txt")])],
    )
    assert findings(record) == []


def test_a_cpu_build_decides_nothing(tmp_path: Path) -> None:
    record = VersionsRecord(
        driver_of("snapshot-evidence/pcie-x8-rtx5090/gpu/nvidia-smi/001.txt"),
        [stack_for("app", [torch_env(tmp_path, "tomdburns-FoCAS.txt")])],
    )
    assert findings(record) == []
    rows = {c.name: (c.status, c.detail) for c in view(record.to_json())}
    assert rows["version app CUDA runtime"][0] == "skipped"
