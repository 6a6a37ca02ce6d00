"""The version-lock gates for the managed serving process, before it starts.

The same facts as doctor's versions view (moptd/serving/version_lock.py): the engine's CUDA
runtime against the driver (CUDA's minor-version compatibility, moptd/catalog/cuda.py) and
its PyTorch's CUDA build against each GPU's compute capability. A failure carries the code
the rules give for the same versions (CUDA_DRIVER_TOO_OLD, CUDA_ARCH_UNSUPPORTED), so the
supervisor refuses a start that cannot work and says why. The hook is one line in
``moptd.serving.gates.run_gates`` (``out.extend(check_versions(m))``); the rules stay the
verdict in doctor and replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from moptd.catalog.cuda import compatibility, cuda_code, min_cuda_for
from moptd.serving.environment import Environment, read_environment, site_packages_of
from moptd.serving.gates import GateResult
from moptd.serving.spec import Managed
from moptd.serving.version_lock import DriverFacts, live_driver_facts


def version_gates(env: Environment, driver: DriverFacts) -> list[GateResult]:
    """Pure: the gates' verdicts from what was read. Nothing is decided on a missing
    version (no gate result rather than a pass)."""
    out: list[GateResult] = []
    runtime = env.cuda_runtime()
    if runtime is not None and driver.cuda:
        ok, why = compatibility(runtime[0], driver.cuda, driver.version)
        out.append(
            GateResult(
                "cuda_driver",
                ok,
                "" if ok else "CUDA_DRIVER_TOO_OLD",
                ""
                if ok
                else f"CUDA runtime {runtime[0]} ({runtime[1]}), driver "
                f"{driver.version or '?'} (CUDA {driver.cuda}): {why}",
            )
        )
    build = env.cuda_build()
    have = cuda_code(build[0]) if build is not None else None
    if build is None or have is None or not driver.gpus:
        return out
    short = []
    for g in driver.gpus:
        need = min_cuda_for(g.compute_capability)
        need_code = cuda_code(need) if need else None
        if need_code is not None and have < need_code:
            short.append(
                f"GPU {g.index} ({g.name}, compute capability {g.compute_capability}) needs "
                f"CUDA {need} or newer"
            )
    out.append(
        GateResult(
            "cuda_arch",
            not short,
            "CUDA_ARCH_UNSUPPORTED" if short else "",
            ""
            if not short
            else "; ".join(short) + f"; the engine's PyTorch is built with CUDA {build[0]}",
        )
    )
    return out


def check_versions(m: Managed, site_packages: Sequence[Path] = ()) -> list[GateResult]:
    """Live: reads the engine's site-packages and asks NVML; blocking."""
    if m.device != "gpu":
        return []
    sps = site_packages_of(m.command, site_packages)
    if not sps:
        return []
    return version_gates(read_environment(sps), live_driver_facts())
