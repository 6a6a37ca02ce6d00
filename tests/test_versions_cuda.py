"""moptd.catalog.cuda against real nvidia-smi captures and NVIDIA's stated rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moptd.catalog.cuda import (
    BRANCH_CUDA,
    compatibility,
    cuda_code,
    driver_code,
    driver_cuda_from_table,
    min_cuda_for,
)
from moptd.gpu.nvsmi import read_dump

FIX = Path(__file__).parent / "fixtures"
CAPTURES = sorted(
    [
        *FIX.glob("nvsmi-paste/table-*.txt"),
        *FIX.glob("scenarios/*/gpu/nvidia-smi/*.txt"),
        *FIX.glob("incidents/*/gpu/nvidia-smi/*.txt"),
        FIX / "h200" / "nvsmi_idle.txt",
    ]
)
PAIRS = [
    (p.relative_to(FIX).as_posix(), d.driver_version, d.cuda_version)
    for p in CAPTURES
    if (d := read_dump(p)).driver_version and d.cuda_version
]


def test_enough_real_pairs() -> None:
    branches = {int(driver.split(".")[0]) for _, driver, _ in PAIRS}
    assert len(branches) >= 8, branches  # 450, 470, 525, 535, 550, 560, 570, 580, 610


@pytest.mark.parametrize(("capture", "driver", "cuda"), PAIRS)
def test_table_derivation_matches_what_nvidia_smi_printed(
    capture: str, driver: str, cuda: str
) -> None:
    derived = driver_cuda_from_table(driver)
    assert derived is not None
    if int(driver.split(".")[0]) <= max(BRANCH_CUDA.values()):
        assert derived == cuda, capture
    else:  # a branch newer than the table: never more than the driver gives, same major
        assert cuda_code(derived) <= cuda_code(cuda)  # type: ignore[operator]
        assert derived.split(".")[0] == cuda.split(".")[0]


def test_minor_version_compatibility() -> None:
    # CUDA Compatibility, Minor Version Compatibility: 12.4 on a 12.2 driver runs
    ok, why = compatibility("12.4", "12.2", "535.104.05")
    assert ok
    assert "minor-version compatibility" in why
    # a 12.x runtime on an 11.x driver does not (one major release only)
    ok, why = compatibility("12.1", "11.4", "470.256.02")
    assert not ok
    assert "525.60.13" in why
    # CUDA 11.0's own drivers are older than the 11.x floor 450.80.02
    ok, why = compatibility("11.8", "11.0", "450.57")
    assert not ok
    assert "450.80.02" in why
    # backward compatibility: an older runtime on a newer driver
    assert compatibility("12.1", "13.0", "580.159.04")[0]
    assert compatibility("12.4", "12.4", "550.54.14")[0]


def test_minimum_cuda_per_compute_capability() -> None:
    assert min_cuda_for("9.0") == "11.8"  # Hopper
    assert min_cuda_for("8.9") == "11.8"  # Ada
    assert min_cuda_for("8.0") == "11.0"  # A100
    assert min_cuda_for("10.0") == "12.8"  # B200
    assert min_cuda_for("12.0") == "12.8"  # RTX 50, RTX PRO 6000
    assert min_cuda_for("3.5") is None  # not in the table: no verdict


def test_encodings_order_as_versions() -> None:
    assert cuda_code("12.4") == 12040
    assert cuda_code("12.10") == 12100
    assert cuda_code("12") is None
    assert driver_code("525.60.13") < driver_code("525.105.17")  # type: ignore[operator]
    assert driver_code("450.57") < driver_code("450.80.02")  # type: ignore[operator]


@given(st.text(max_size=40))
def test_version_parsers_take_any_text(text: str) -> None:
    for f in (cuda_code, driver_code):
        v = f(text)
        assert v is None or v >= 0
    driver_cuda_from_table(text)
    compatibility(text, text, text)
