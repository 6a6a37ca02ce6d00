"""CUDA's compatibility facts, as NVIDIA publishes them, and the version-lock signals.

Sources (checked 2026-12):
- CUDA Compatibility, "Minor Version Compatibility", Table 1 (CUDA Toolkit 11.x, 12.x and
  13.x driver version ranges): https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
  From CUDA 11 on, an application built with any toolkit of a major release runs, "with
  limited feature-set", on a driver of at least that major release's minimum: 11.x >= 450
  (450.80.02 on Linux: CUDA 11.0 shipped with an older driver, minor-version
  compatibility across 11.x needs 450.80.02), 12.x >= 525 (525.60.13, the CUDA 12.0 GA
  driver), 13.x >= 580 (580.65.06, the CUDA 13.0 GA driver). What the limited set leaves
  out: PTX that is newer than the driver cannot be JIT-compiled (cudaErrorUnsupportedPtxVersion),
  and APIs the newer toolkit added that need driver support return
  cudaErrorCallRequiresNewerDriver ("Application Considerations for Minor Version
  Compatibility" on the same page).
- CUDA Toolkit Release Notes, Table 3 "CUDA Toolkit and Corresponding Driver Versions"
  (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html): the driver each
  toolkit release ships with, which is the first driver whose CUDA version (nvidia-smi's
  "CUDA Version", NVML's nvmlSystemGetCudaDriverVersion) is that release.
- The first toolkit that compiles for each compute capability: the release notes of
  CUDA 11.0 (sm_80), 11.1 (sm_86), 11.4 (sm_87), 11.8 (sm_89 and sm_90), 12.8 (sm_100,
  sm_101, sm_120) and 12.9 (sm_103, sm_121); sm_70 from CUDA 9.0 and sm_75 from 10.0 (the
  CUDA C++ Programming Guide's compute-capability table lists each architecture).

Versions travel as numbers in the signals so that rules can compare them: a CUDA version
as NVML encodes cudaDriverVersion (major * 1000 + minor * 10: 12.4 is 12040), a driver
version as major * 10**6 + minor * 10**3 + patch (535.104.05 is 535104005), a compute
capability as major * 10 + minor (9.0 is 90, 12.0 is 120).
"""

from __future__ import annotations

import re

from moptd.catalog.spec import SignalSpec

# Linux minimum driver for minor-version compatibility, per CUDA major release (Table 1).
MINOR_COMPAT_MIN_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# The driver each CUDA major.minor GA release ships with (release notes, Table 3, Linux
# x86_64). A driver's own CUDA version is the highest release whose driver it is at least.
GA_DRIVER: dict[str, str] = {
    "11.0": "450.36.06",
    "11.1": "455.23",
    "11.2": "460.27.03",
    "11.3": "465.19.01",
    "11.4": "470.42.01",
    "11.5": "495.29.05",
    "11.6": "510.39.01",
    "11.7": "515.43.04",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}

# The driver branch of each CUDA major.minor: the GA driver's branch above, and the
# branches of toolkit numbers NVIDIA skipped as toolkits but drivers report (565 prints
# "CUDA Version: 12.7"; 590, CUDA 13.1's GA driver 590.44.01, prints 13.1).
BRANCH_CUDA: dict[str, int] = {
    **{cuda: int(ga.split(".", 1)[0]) for cuda, ga in GA_DRIVER.items()},
    "12.7": 565,
    "13.1": 590,
}
BRANCH_CUDA = dict(sorted(BRANCH_CUDA.items(), key=lambda kv: kv[1]))

# The first CUDA release whose compiler and libraries support each compute capability.
MIN_CUDA_FOR_CC: dict[str, str] = {
    "7.0": "9.0",
    "7.2": "10.0",
    "7.5": "10.0",
    "8.0": "11.0",
    "8.6": "11.1",
    "8.7": "11.4",
    "8.9": "11.8",
    "9.0": "11.8",
    "10.0": "12.8",
    "10.1": "12.8",
    "10.3": "12.9",
    "12.0": "12.8",
    "12.1": "12.9",
}

_VERSION = re.compile(r"^\s*([0-9]{1,4})(?:\.([0-9]{1,4}))?(?:\.([0-9]{1,4}))?")


def cuda_code(version: str) -> int | None:
    """'12.4' (or '12.4.127') -> 12040, NVML's encoding; None when it is not a version."""
    m = _VERSION.match(version)
    if m is None or m.group(2) is None:
        return None
    return int(m.group(1)) * 1000 + min(int(m.group(2)), 99) * 10


def cuda_text(code: int) -> str:
    return f"{code // 1000}.{(code % 1000) // 10}"


def driver_code(version: str) -> int | None:
    """'535.104.05' -> 535104005: a number that orders as the driver versions do."""
    m = _VERSION.match(version)
    if m is None:
        return None
    major, minor, patch = (int(g) if g else 0 for g in m.groups())
    if minor > 999 or patch > 999:
        return None
    return major * 10**6 + minor * 10**3 + patch


def cc_code(capability: str) -> int | None:
    """'9.0' -> 90, '12.0' -> 120."""
    m = re.match(r"^\s*([0-9]{1,2})\.([0-9])\s*$", capability)
    return int(m.group(1)) * 10 + int(m.group(2)) if m else None


def driver_cuda_from_table(driver: str) -> str | None:
    """The CUDA version a driver supports, for when neither NVML nor nvidia-smi says it.
    It goes by driver branch (the version's first number), not by the GA driver's full
    version: every driver of a branch reports the branch's CUDA version (550.40.07, older
    than CUDA 12.4's GA driver 550.54.14, prints "CUDA Version: 12.4"; see
    tests/test_versions_cuda.py over real nvidia-smi captures)."""
    m = _VERSION.match(driver)
    if m is None:
        return None
    branch = int(m.group(1))
    best: str | None = None
    for cuda, first in BRANCH_CUDA.items():
        if branch >= first:
            best = cuda
    return best


def min_cuda_for(capability: str) -> str | None:
    return MIN_CUDA_FOR_CC.get(capability.strip())


def compatibility(runtime: str, driver_cuda: str, driver: str = "") -> tuple[bool, str]:
    """Whether a CUDA runtime of this version runs on this driver, and why (the rule
    reaches the same verdict from the signals; doctor prints this sentence)."""
    rt, dc = cuda_code(runtime), cuda_code(driver_cuda)
    if rt is None or dc is None:
        return True, "unknown (a version is missing)"
    if rt <= dc:
        return True, f"the driver supports CUDA {cuda_text(dc)}, the runtime is {cuda_text(rt)}"
    if rt // 1000 > dc // 1000:
        return False, (
            f"CUDA {cuda_text(rt)} needs a driver of the {rt // 1000}.x family (Linux >= "
            f"{MINOR_COMPAT_MIN_DRIVER.get(rt // 1000, '?')}); this driver supports CUDA "
            f"{cuda_text(dc)}: minor-version compatibility holds only within one major release"
        )
    floor = MINOR_COMPAT_MIN_DRIVER.get(rt // 1000)
    if driver and floor and (driver_code(driver) or 0) < (driver_code(floor) or 0):
        return False, f"CUDA {rt // 1000}.x minor-version compatibility needs driver >= {floor}"
    return True, (
        f"runs under minor-version compatibility (CUDA {cuda_text(rt)} runtime on a CUDA "
        f"{cuda_text(dc)} driver): PTX newer than the driver does not JIT and APIs that need "
        "a newer driver return cudaErrorCallRequiresNewerDriver"
    )


SIGNALS = [
    SignalSpec(
        "versions.driver_cuda",
        "gauge",
        "",
        "The CUDA version the loaded driver supports, as NVML encodes it (12.4 is 12040): "
        "nvmlSystemGetCudaDriverVersion, nvidia-smi's CUDA Version, else derived from the "
        "driver's branch (moptd/catalog/cuda.py). Label source says which.",
        "node",
        None,
        ("source",),
    ),
    SignalSpec(
        "versions.driver_cuda_major",
        "gauge",
        "",
        "The major release of versions.driver_cuda (12 for 12.4): minor-version "
        "compatibility holds within one major release only.",
        "node",
    ),
    SignalSpec(
        "versions.driver",
        "gauge",
        "",
        "The user-space driver version as a number that orders as versions do "
        "(535.104.05 is 535104005), for the minor-version compatibility floor.",
        "node",
    ),
    SignalSpec(
        "versions.runtime_cuda",
        "gauge",
        "",
        "The serving environment's CUDA runtime version (12.4 is 12040): the "
        "nvidia-cuda-runtime wheel, a libcudart file name, else torch's CUDA build. Read "
        "from its site-packages without importing it (moptd/serving/environment.py). "
        "Labels: serving (the endpoint's name), source (where it was read).",
        "node",
        None,
        ("serving", "source"),
    ),
    SignalSpec(
        "versions.runtime_cuda_major",
        "gauge",
        "",
        "The major release of versions.runtime_cuda (12 for 12.4).",
        "node",
        None,
        ("serving",),
    ),
    SignalSpec(
        "versions.build_cuda",
        "gauge",
        "",
        "The CUDA release the serving environment's PyTorch was built with (torch/version.py; "
        "12.1 is 12010). Absent for a CPU build. Label serving: the endpoint's name.",
        "node",
        None,
        ("serving",),
    ),
    SignalSpec(
        "versions.gpu_min_cuda",
        "gauge",
        "",
        "The first CUDA release that supports this GPU's compute capability (9.0 needs "
        "11.8: 11080; 12.0 needs 12.8: 12080), from NVIDIA's release notes "
        "(moptd/catalog/cuda.py). Label cc is the compute capability.",
        "gpu",
        None,
        ("cc",),
    ),
    SignalSpec(
        "versions.package",
        "info",
        "",
        "A watched distribution of a serving environment (torch, vllm, sglang, tensorrt-llm) "
        "and its version, read from its site-packages; exported as "
        "moptd_software_version_info. Labels: serving (the environment's name), package "
        "(the normalized distribution name), version.",
        "node",
        None,
        ("serving", "package", "version"),
    ),
]
