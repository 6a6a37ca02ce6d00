"""Print what the installed driver's libcuda says for every CUresult in moptd's CUDA catalog.

cuGetErrorString and cuGetErrorName live in libcuda.so.1, which ships with the NVIDIA driver
and on no package registry, so moptd/catalog/emitters/cuda.yaml could list only the enum's
names. Run this on a host with the driver (no GPU work is done; cuInit is not called, and the
two functions answer without it) and it prints one JSON object: the driver version and, for
each CUresult value the catalog names, the name and string libcuda returns (null where it
answers CUDA_ERROR_INVALID_VALUE, i.e. the driver does not know the value).

Usage: python3 tools/cuda_driver_strings.py > cuda_driver_strings.json
"""

from __future__ import annotations

import ctypes
import json
import re
import sys
from pathlib import Path

CATALOG = Path(__file__).resolve().parent.parent / "moptd/catalog/emitters/cuda.yaml"
# the catalog's driver entries: source: "cuda.h CUresult CUDA_ERROR_X (N)"
CURESULT = re.compile(r'source: "cuda\.h CUresult (CUDA_[A-Z0-9_]+) \((\d+)\)"')


def catalog_values() -> dict[int, str]:
    return {int(m[2]): m[1] for m in CURESULT.finditer(CATALOG.read_text(encoding="utf-8"))}


def _call(fn: ctypes._CFuncPtr, value: int) -> str | None:  # type: ignore[name-defined]
    out = ctypes.c_char_p()
    rc = fn(value, ctypes.byref(out))
    return out.value.decode() if rc == 0 and out.value is not None else None


def main() -> int:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        print(f"cuda_driver_strings: libcuda.so.1 not loadable: {exc}", file=sys.stderr)
        return 1
    version = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    values = catalog_values()
    rows = [
        {
            "value": value,
            "catalog_name": name,
            "name": _call(cuda.cuGetErrorName, value),
            "string": _call(cuda.cuGetErrorString, value),
        }
        for value, name in sorted(values.items())
    ]
    json.dump({"cuDriverGetVersion": version.value, "values": rows}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
