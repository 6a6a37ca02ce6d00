"""`moptd doctor`'s TensorRT-LLM engine check: the serving gate's comparison, run once.

The managed server's engine directory (``engine_dir``, ``--engine_dir`` in its command, or
the engine ``trtllm-serve`` is given)
against this host: the TensorRT-LLM release of the serving environment, the GPUs the
server will see and their compute capability (moptd/serving/trt_engine.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moptd.cli.cmd_doctor import Check


def trt_engine_checks(managed: Any, versions: Mapping[str, str] | None = None) -> list[Check]:
    """``versions``: the serving environment's installed distributions, where read."""
    if managed is None:
        return []
    from moptd.serving import gates

    engine_dir = gates.engine_dir_of(managed)
    if engine_dir is None:
        return []
    gpus = gates.visible_gpus(managed.env) if managed.device == "gpu" else None
    out = []
    for r in gates.check_trt_engine(engine_dir, versions, gpus):
        status = "ok" if r.ok else "critical"
        if r.ok and "warning:" in r.reason:
            status = "warning"
        out.append(Check(f"serving {r.check} {engine_dir}", status, r.reason, r.code))
    return out
