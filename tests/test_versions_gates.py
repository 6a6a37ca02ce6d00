"""The version gates for the managed engine, on the same real files as the rules."""

from __future__ import annotations

from pathlib import Path

from moptd.serving.environment import read_environment
from moptd.serving.gates_versions import check_versions, version_gates
from moptd.serving.spec import Managed
from tests.test_versions_rules import SP, driver_of, torch_env


def test_a_cu121_runtime_on_a_470_driver_is_refused() -> None:
    gates = version_gates(
        read_environment([SP / "vllm-0.4.0-cu121"]), driver_of("nvsmi-paste/table-470-a10g.txt")
    )
    (driver,) = [g for g in gates if g.check == "cuda_driver"]
    assert not driver.ok
    assert driver.code == "CUDA_DRIVER_TOO_OLD"
    assert (
        "CUDA runtime 12.1 (nvidia-cuda-runtime-cu12), driver 470.256.02 (CUDA 11.4)"
        in driver.reason
    )
    # the A10G (sm_86, from CUDA 11.1) is fine with a CUDA 12.1 build
    assert [g.ok for g in gates if g.check == "cuda_arch"] == [True]


def test_a_cu126_torch_on_an_rtx_5090_is_refused(tmp_path: Path) -> None:
    gates = version_gates(
        read_environment([torch_env(tmp_path, "torch-2.7.1-cu126.txt")]),
        driver_of("snapshot-evidence/pcie-x8-rtx5090/gpu/nvidia-smi/001.txt"),
    )
    by_check = {g.check: g for g in gates}
    assert by_check["cuda_driver"].ok  # 12.6 on a 12.8 driver
    arch = by_check["cuda_arch"]
    assert not arch.ok
    assert arch.code == "CUDA_ARCH_UNSUPPORTED"
    assert arch.reason == (
        "GPU 0 (NVIDIA GeForce RTX 5090, compute capability 12.0) needs CUDA 12.8 or newer; "
        "the engine's PyTorch is built with CUDA 12.6"
    )


def test_minor_version_compatibility_passes(tmp_path: Path) -> None:
    gates = version_gates(
        read_environment([SP / "cuda-runtime-12.4-cudnn-9.1"]),
        driver_of("incidents/a10g-pcie-x8-of-x16-aws/gpu/nvidia-smi/001.txt"),
    )
    assert [(g.check, g.ok) for g in gates] == [("cuda_driver", True)]


def test_a_cpu_engine_has_no_version_gates() -> None:
    m = Managed("cpu", ("vllm", "serve", "m"), device="cpu")
    assert check_versions(m) == []
