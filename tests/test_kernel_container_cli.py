"""nvidia-container-cli's NVML failure, pasted alone or inside docker's error: read as the
nvmlInit failure it is (issue 29, item 7), not refused as "not a kind moptd reads".

Lines: NVIDIA/nvidia-container-toolkit#1269 (alone) and #260 (inside docker's error), as in
tests/fixtures/incidents/container-cli-nvml-driver-not-loaded-docker/SOURCE.md.
"""

from __future__ import annotations

from pathlib import Path

from moptd.bundle.classify import split
from moptd.gpu.nvsmi_failure import NVML_ERROR_DRIVER_NOT_LOADED, parse_failures

DOCKER = (
    Path(__file__).parent
    / "fixtures/incidents/container-cli-nvml-driver-not-loaded-docker/gpu/nvidia-smi/001.txt"
).read_text(encoding="utf-8")
ALONE = "nvidia-container-cli: initialization error: nvml error: driver not loaded"


def test_docker_error_is_an_nvml_init_failure():
    assert [s.kind for s in split(DOCKER)] == ["nvidia-smi-failure"]
    (f,) = parse_failures(DOCKER)
    assert f.kind == "init_failed"
    assert f.nvml_error == NVML_ERROR_DRIVER_NOT_LOADED


def test_the_bare_line_is_read_too():
    assert [s.kind for s in split(ALONE + "\n")] == ["nvidia-smi-failure"]
    assert [f.nvml_error for f in parse_failures(ALONE)] == [NVML_ERROR_DRIVER_NOT_LOADED]
