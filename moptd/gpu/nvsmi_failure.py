"""nvidia-smi's own failure messages, read as evidence.

When NVML fails, nvidia-smi prints one line instead of a table or a ``-q`` dump. The line
names NVML's return code, which is what the live NVML collector sees on the same host:

- "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make
  sure that the latest NVIDIA driver is installed and running." -> nvmlInit returned
  NVML_ERROR_DRIVER_NOT_LOADED (9);
- "Failed to initialize NVML: Driver/library version mismatch" (R535+ adds "NVML library
  version: 535.154") -> NVML_ERROR_LIB_RM_VERSION_MISMATCH (18); "Failed to initialize
  NVML: <NVML error string>" -> that error's code;
- "No devices were found" -> NVML initialised and counted no GPU;
- "Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error" (or "GPU is
  lost", "GPU requires restart") -> nvmlDeviceGetHandleByIndex failed for that GPU with
  UNKNOWN (999), GPU_IS_LOST (15) or RESET_REQUIRED (16): the codes the NVML backend
  reports as a lost GPU (moptd.gpu.backend).

``failure_batch`` turns them into the samples of those outcomes: gpu.nvml_init_error for
the node, and gpu.lost / gpu.nvml_error for a GPU whose handle failed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from moptd.observations import NODE, Batch, gpu_subject
from moptd.proc.pci import pci_key

NVML_SUCCESS = 0
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999
# The codes the NVML backend turns into GpuLost (moptd.gpu.backend._LOST).
LOST_CODES = frozenset({NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN, NVML_ERROR_RESET_REQUIRED})

# nvmlErrorString's texts (NVML API reference, nvmlReturn_t), lower case, as nvidia-smi
# prints them after "Failed to initialize NVML:" or a device-handle failure.
_ERROR_CODES = {
    "uninitialized": 1,
    "invalid argument": 2,
    "not supported": 3,
    "insufficient permissions": 4,
    "no permission": 4,
    "not found": 6,
    "driver not loaded": NVML_ERROR_DRIVER_NOT_LOADED,
    "timeout": 10,
    "interrupt request issue": 11,
    "nvml shared library not found": 12,
    "function not found": 13,
    "corrupted inforom": 14,
    "gpu is lost": NVML_ERROR_GPU_IS_LOST,
    "gpu requires restart": NVML_ERROR_RESET_REQUIRED,
    "driver/library version mismatch": NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    "unknown error": NVML_ERROR_UNKNOWN,
}
# A pasted line is short; longer is not one of these messages.
_MAX_LINE = 400
_COULD_NOT_COMMUNICATE = re.compile(
    r"NVIDIA-SMI has failed because it couldn.?t communicate with the NVIDIA driver", re.I
)
_INIT_FAILED = re.compile(r"Failed to initiali[sz]e NVML:\s*(?P<error>.+?)\s*$", re.I)
# libnvidia-container (the container toolkit's hook) fails the same nvmlInit before a
# container starts: "nvidia-container-cli: initialization error: nvml error: driver not
# loaded", docker appending ": unknown." (NVIDIA/nvidia-container-toolkit#1269,
# cedricxie/apollo_perception_ros#20); the NVML error string is nvmlErrorString's
_CONTAINER_CLI = re.compile(
    r"nvidia-container-cli: initiali[sz]ation error: nvml error:\s*(?P<error>.+?)\s*$", re.I
)
_LIBRARY = re.compile(r"NVML library version:\s*(?P<version>\d+(?:\.\d+)*)", re.I)
_NO_DEVICES = re.compile(r"^\s*No devices were found\s*$", re.I)
_HANDLE = re.compile(
    r"Unable to (?:determine|detect) the device handle for (?:GPU|gpu)\s*"
    r"(?P<bus>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*:\s*(?P<error>.+?)\s*$"
)

KINDS = ("driver_not_loaded", "init_failed", "no_devices", "device_handle")


@dataclass(frozen=True, slots=True)
class NvsmiFailure:
    kind: str  # one of KINDS
    line: int
    message: str  # the line as printed
    nvml_error: int  # NVML's return code (0: NVML initialised)
    pci_bus_id: str = ""  # device_handle: the GPU, normalised
    library_version: str = ""  # init_failed on a version mismatch, where printed

    @property
    def gpu_lost(self) -> bool:
        return self.kind == "device_handle" and self.nvml_error in LOST_CODES


def _code(error: str) -> int:
    text = " ".join(error.lower().rstrip(".").split())
    for known, code in _ERROR_CODES.items():
        if text.startswith(known):
            return code
    return NVML_ERROR_UNKNOWN


def parse_failures(text: str) -> list[NvsmiFailure]:
    """Every failure message in ``text``, in order (none: not a failure paste)."""
    out: list[NvsmiFailure] = []
    library = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        if len(raw) > _MAX_LINE:
            continue
        line = raw.strip()
        m = _LIBRARY.search(line)
        if m is not None:
            library = m.group("version")
            if out and out[-1].kind == "init_failed" and not out[-1].library_version:
                last = out[-1]
                out[-1] = NvsmiFailure(
                    last.kind, last.line, last.message, last.nvml_error, "", library
                )
            continue
        if _COULD_NOT_COMMUNICATE.search(line):
            out.append(
                NvsmiFailure("driver_not_loaded", lineno, line, NVML_ERROR_DRIVER_NOT_LOADED)
            )
        elif (init := _INIT_FAILED.search(line) or _CONTAINER_CLI.search(line)) is not None:
            out.append(NvsmiFailure("init_failed", lineno, line, _code(init.group("error"))))
        elif _NO_DEVICES.match(line):
            out.append(NvsmiFailure("no_devices", lineno, line, NVML_SUCCESS))
        elif (handle := _HANDLE.search(line)) is not None:
            bus = pci_key(handle.group("bus"))
            code = _code(handle.group("error"))
            out.append(NvsmiFailure("device_handle", lineno, line, code, bus))
    return out


def failure_batch(failures: list[NvsmiFailure], index_by_bus: Mapping[str, int]) -> Batch:
    """The samples of NVML's outcome on the host that printed these messages. A GPU is
    named by its index where another dump gives it, else by its PCI address."""
    batch = Batch()
    init: int | None = None
    for f in failures:
        if f.kind in ("driver_not_loaded", "init_failed"):
            init = f.nvml_error
        elif f.kind == "no_devices":
            init = NVML_SUCCESS if init is None else init
        elif f.kind == "device_handle":
            init = NVML_SUCCESS if init is None else init  # nvmlInit itself succeeded
            index = index_by_bus.get(f.pci_bus_id)
            subject = gpu_subject(index if index is not None else f.pci_bus_id)
            batch.add("gpu.nvml_error", subject, float(f.nvml_error))
            if f.gpu_lost:
                batch.add("gpu.lost", subject, 1.0)
            if index is None:
                batch.describe(subject, pci_bus_id=f.pci_bus_id)
    if init is not None:
        batch.add("gpu.nvml_init_error", NODE, float(init))
    return batch
