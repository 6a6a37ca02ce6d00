"""CUDA out-of-memory messages: PyTorch's, parsed into its numbers, and the bare ones.

The current text (c10/cuda/CUDACachingAllocator.cpp) and the two older shapes seen in
logs are understood. "Reserved by PyTorch but unallocated" is, by construction of the
allocator, memory stranded by fragmentation; whether it is a large share (a fragmentation
OOM) is the rule's call (rules/serving/serving.rules.yaml), from the numbers here.

Other layers print the CUDA runtime's cudaErrorMemoryAllocation without numbers: PyTorch's
C10_CUDA_CHECK ("CUDA error: out of memory", as SGLang's and vLLM's tracebacks show it),
TensorRT-LLM ("[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(...): out of
memory"), TensorRT ("Cuda Error in allocate: 2 (out of memory)") and ONNX Runtime's arena
("Failed to allocate memory for requested buffer of size N"). ``bare_oom`` names them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SZ = r"[\d.]+ (?:bytes|KiB|MiB|GiB|TiB)"
_CURRENT = re.compile(
    r"(?P<dev>CUDA|XPU) out of memory\. Tried to allocate (?P<req>" + _SZ + r")\. "
    r"GPU (?P<gpu>\d+) has a total capac(?:i)?ty of (?P<total>" + _SZ + r") of which "
    r"(?P<free>" + _SZ + r") is free\. "
    r"(?P<procs>(?:(?:Process \d+|Including non-PyTorch memory, this process) has "
    + _SZ
    + r" memory in use\. )*)"
    r"(?:(?P<allowed>" + _SZ + r") allowed; )?"
    r"Of the allocated memory (?P<alloc>" + _SZ + r") is allocated by PyTorch, "
    r"(?:with (?P<priv>" + _SZ + r") allocated in private pools \(e\.g\., CUDA Graphs\), )?"
    r"and (?P<unalloc>" + _SZ + r") is reserved by PyTorch but unallocated\."
)
_LEGACY = re.compile(
    r"CUDA out of memory\. Tried to allocate (?P<req>" + _SZ + r") \(GPU (?P<gpu>\d+); "
    r"(?P<total>" + _SZ + r") total capacity; (?P<alloc>" + _SZ + r") already allocated; "
    r"(?P<free>" + _SZ + r") free; (?:(?P<allowed>" + _SZ + r") allowed; )?"
    r"(?P<reserved>" + _SZ + r") reserved in total by PyTorch\)"
)
_PROC = re.compile(
    r"(?:Process (\d+)|Including non-PyTorch memory, this process) has (" + _SZ + r") memory"
)
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
GIB = float(1 << 30)


def parse_size(text: str) -> float:
    """``"90.53 GiB"`` -> bytes (torch's format_size, powers of 1024)."""
    number, unit = text.split(" ", 1)
    return float(number) * _UNITS[unit]


@dataclass(frozen=True, slots=True)
class CudaOom:
    gpu: int
    requested: float  # bytes; torch prints the rounded block size
    total: float
    free: float
    allocated: float  # by PyTorch, private pools included
    reserved_unallocated: float
    private_pools: float = 0.0
    this_process: float | None = None  # NVML's view of the failing process, if printed
    # What the "Process N has X memory in use" lines add up to, when PyTorch also printed its
    # own line: only then are they other processes. Without it PyTorch did not find its own
    # PID among NVML's (a container's PID namespace: vllm#2140, dots.ocr#196, where the one
    # "Process N" is the failing process itself), so who holds what is unknown: -1.
    other_processes: float = 0.0
    allowed: float | None = None
    holders: str = ""  # the other processes, largest first: "pid 238746 1.08 GiB, ..."

    @property
    def reserved_unallocated_share(self) -> float:
        """Reserved-but-unallocated as a share of all PyTorch reserved (0 when nothing is)."""
        reserved = self.allocated + self.reserved_unallocated
        return self.reserved_unallocated / reserved if reserved > 0 else 0.0

    def fields(self) -> dict[str, object]:
        return {
            "form": "pytorch",
            "gpu": self.gpu,
            "requested_bytes": self.requested,
            "total_bytes": self.total,
            "free_bytes": self.free,
            "allocated_bytes": self.allocated,
            "reserved_unallocated_bytes": self.reserved_unallocated,
            "private_pool_bytes": self.private_pools,
            "process_bytes": self.this_process if self.this_process is not None else -1.0,
            "other_process_bytes": self.other_processes,
            "holders": self.holders,
            "reserved_unallocated_share": self.reserved_unallocated_share,
        }


def parse_oom(text: str) -> CudaOom | None:
    """The first OOM message in ``text`` (a log line or a whole traceback), or None."""
    if "out of memory" not in text:
        return None
    m = _CURRENT.search(text)
    if m is not None:
        this: float | None = None
        named: list[tuple[float, str, str]] = []
        for pid, size in _PROC.findall(m.group("procs")):
            if pid:
                named.append((parse_size(size), pid, size))
            else:
                this = parse_size(size)
        others = sum(n for n, _, _ in named) if this is not None else (-1.0 if named else 0.0)
        holders = (
            ", ".join(f"pid {pid} {size}" for _, pid, size in sorted(named, reverse=True)[:5])
            if this is not None
            else ""
        )
        return CudaOom(
            gpu=int(m.group("gpu")),
            requested=parse_size(m.group("req")),
            total=parse_size(m.group("total")),
            free=parse_size(m.group("free")),
            allocated=parse_size(m.group("alloc")),
            reserved_unallocated=parse_size(m.group("unalloc")),
            private_pools=parse_size(m.group("priv")) if m.group("priv") else 0.0,
            this_process=this,
            other_processes=others,
            allowed=parse_size(m.group("allowed")) if m.group("allowed") else None,
            holders=holders,
        )
    m = _LEGACY.search(text)
    if m is not None:
        alloc = parse_size(m.group("alloc"))
        return CudaOom(
            gpu=int(m.group("gpu")),
            requested=parse_size(m.group("req")),
            total=parse_size(m.group("total")),
            free=parse_size(m.group("free")),
            allocated=alloc,
            reserved_unallocated=max(0.0, parse_size(m.group("reserved")) - alloc),
            allowed=parse_size(m.group("allowed")) if m.group("allowed") else None,
        )
    return None


_ARENA = "Failed to allocate memory for requested buffer of size"
# (substring, form): the OOMs that print no numbers, most specific first. Each names the
# CUDA allocation failing, so a line merely mentioning memory ("alloc_req_slots runs out of
# memory", SGLang's request-slot pool) is none of them.
_BARE = (
    # ONNX Runtime's arena when its device allocator (cudaMalloc under the CUDA EP) returns
    # nothing (onnxruntime/core/framework/bfc_arena.cc, Extend): the text says no "out of
    # memory" (onnxruntime#9939, triton onnxruntime_backend users in onnxruntime#20038)
    (_ARENA, "onnxruntime_arena"),
    ("[TensorRT-LLM][ERROR]", "tensorrt_llm"),
    ("Cuda Error in allocate: 2 (out of memory)", "tensorrt"),
    ("CUDA error: out of memory", "cuda_runtime"),
    ("cuda runtime error (2) : out of memory", "cuda_runtime"),
    ("CUDA out of memory", "pytorch"),
)


def bare_oom(text: str) -> str | None:
    """The form of a CUDA OOM line without PyTorch's numbers, or None."""
    if "out of memory" not in text and _ARENA not in text:
        return None
    for needle, form in _BARE:
        if needle in text and (form != "tensorrt_llm" or ": out of memory" in text):
            return form
    return None


def bare_fields(form: str) -> dict[str, object]:
    """A bare OOM as the fields of a serving.cuda_oom event: the numbers it did not print
    read -1 (unknown), so no rule finds fragmentation in it."""
    return {
        "form": form,
        "gpu": -1,
        "requested_bytes": -1.0,
        "total_bytes": -1.0,
        "free_bytes": -1.0,
        "allocated_bytes": -1.0,
        "reserved_unallocated_bytes": -1.0,
        "private_pool_bytes": -1.0,
        "process_bytes": -1.0,
        "other_process_bytes": -1.0,
        "holders": "",
        "reserved_unallocated_share": -1.0,
    }
