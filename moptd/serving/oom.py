"""PyTorch's CUDA out-of-memory message, parsed into its numbers.

The current text (c10/cuda/CUDACachingAllocator.cpp) and the two older shapes seen in
logs are understood. "Reserved by PyTorch but unallocated" is, by construction of the
allocator, memory stranded by fragmentation: when it alone could hold the request, the OOM
is fragmentation, not a lack of memory.
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
    other_processes: float = 0.0
    allowed: float | None = None

    @property
    def fragmentation(self) -> bool:
        """Stranded cache alone could have held the request, or it is a large share of the
        card and, with what is free, would have."""
        r, x = self.reserved_unallocated, self.requested
        if r >= x:
            return True
        return r >= max(0.5 * GIB, 0.05 * self.total) and r + self.free >= x

    def fields(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "requested_bytes": self.requested,
            "total_bytes": self.total,
            "free_bytes": self.free,
            "allocated_bytes": self.allocated,
            "reserved_unallocated_bytes": self.reserved_unallocated,
            "private_pool_bytes": self.private_pools,
            "process_bytes": self.this_process if self.this_process is not None else -1.0,
            "other_process_bytes": self.other_processes,
            "fragmentation": self.fragmentation,
        }


def parse_oom(text: str) -> CudaOom | None:
    """The first OOM message in ``text`` (a log line or a whole traceback), or None."""
    if "out of memory" not in text:
        return None
    m = _CURRENT.search(text)
    if m is not None:
        this: float | None = None
        others = 0.0
        for pid, size in _PROC.findall(m.group("procs")):
            if pid:
                others += parse_size(size)
            else:
                this = parse_size(size)
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
