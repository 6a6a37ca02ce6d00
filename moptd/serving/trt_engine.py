"""What a TensorRT-LLM engine directory records about its build, and what it needs of a host.

``trtllm-build`` writes ``config.json`` beside one ``rank<N>.engine`` per rank. Since
TensorRT-LLM 0.8 the file is ``{"version", "pretrained_config", "build_config"}``:
the release that built it, the model (architecture, dtype, quantization, the ``mapping``
of tensor / pipeline / context parallel ranks) and the build (max batch and sequence
sizes, ``plugin_config``, and ``auto_parallel_config.cluster_key``, the GPU the build
machine had as TensorRT-LLM's ``infer_cluster_key`` names it from the CUDA device name).
Older releases wrote ``{"builder_config": {...}, "plugin_config": {...}}`` with
``precision``, ``tensor_parallel`` and ``pipeline_parallel`` (TensorRT-LLM's C++
runtime still reads both: cpp/tensorrt_llm/runtime/gptJsonConfig.cpp).

A serialised TensorRT engine loads only with the TensorRT release that built it and on a
GPU of the compute capability it was built for (TensorRT Developer Guide, "Version
Compatibility" and "Hardware Compatibility": both are off unless requested at build
time, which trtllm-build does not). ``compare`` checks what the directory records
against the host before the server is started; what it cannot know from the directory it
leaves to the log lines (moptd/serving/logparse.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 4 << 20  # real engine configs are ~10 KB
_RANK_ENGINE = re.compile(r"^rank(\d{1,5})\.engine$")


class EngineConfigError(ValueError):
    """config.json of an engine directory is missing, unreadable or not an engine's."""

    def __init__(self, file: Path | str, key: str, message: str, line: int = 0) -> None:
        where = f"{file}:{line}" if line else str(file)
        super().__init__(f"{where}: {f'key {key!r}: ' if key else ''}{message}")
        self.file, self.key, self.line = str(file), key, line


@dataclass(frozen=True, slots=True)
class EngineBuild:
    """The build an engine directory records (None: the file does not say)."""

    layout: str  # "build_config" (TensorRT-LLM >= 0.8) or "builder_config" (older)
    trtllm_version: str | None  # the release that built it ("version")
    architecture: str | None
    dtype: str | None
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    tp_size: int
    pp_size: int
    cp_size: int
    world_size: int
    gpus_per_node: int | None
    max_batch_size: int | None
    max_input_len: int | None
    max_seq_len: int | None
    max_num_tokens: int | None
    built_on: str | None  # the build machine's GPU (auto_parallel_config.cluster_key)
    plugins: Mapping[str, str] = field(default_factory=dict)  # the plugins switched on
    # N of each rank<N>.engine present; None when no directory was listed (a pasted file)
    rank_engines: tuple[int, ...] | None = None

    @property
    def missing_ranks(self) -> list[int]:
        if self.rank_engines is None:
            return []
        have = set(self.rank_engines)
        return [r for r in range(min(self.world_size, 4096)) if r not in have]

    def summary(self) -> str:
        parts = [
            f"TensorRT-LLM {self.trtllm_version or '?'}",
            self.architecture or "?",
            self.dtype or "?",
        ]
        if self.quant_algo:
            parts.append(self.quant_algo)
        parts.append(f"tp {self.tp_size} x pp {self.pp_size}")
        if self.built_on:
            parts.append(f"built on {self.built_on}")
        return ", ".join(parts)


def _get(d: Mapping[str, Any], key: str, where: str, file: Path | str, kind: type) -> Any:
    v = d.get(key)
    if v is None:
        return None
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise EngineConfigError(file, f"{where}{key}", f"must be an integer, not {v!r:.80}")
    if kind is str and not isinstance(v, str):
        raise EngineConfigError(file, f"{where}{key}", f"must be a string, not {v!r:.80}")
    if kind is dict and not isinstance(v, dict):
        raise EngineConfigError(file, f"{where}{key}", f"must be an object, not {v!r:.80}")
    return v


def _size(d: Mapping[str, Any], key: str, where: str, file: Path | str) -> int:
    v = _get(d, key, where, file, int)
    if v is None:
        return 1
    if not 1 <= v <= 1 << 20:
        raise EngineConfigError(file, f"{where}{key}", f"must be a positive rank count, not {v}")
    return int(v)


def _plugins(raw: Any, where: str, file: Path | str) -> dict[str, str]:
    """The plugin switches that are on: a dtype string, or true (off: null, false, "disable")."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise EngineConfigError(file, where, f"must be an object, not {raw!r:.80}")
    out: dict[str, str] = {}
    for k, v in list(raw.items())[:512]:
        if v is True:
            out[str(k)] = "enable"
        elif isinstance(v, str) and v not in ("disable", ""):
            out[str(k)] = v
    return out


def parse_engine_config(text: str, file: Path | str = "config.json") -> EngineBuild:
    """config.json's text -> EngineBuild; EngineConfigError names the file, line or key."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineConfigError(file, "", f"not JSON: {exc.msg}", exc.lineno) from None
    except RecursionError:
        raise EngineConfigError(file, "", "not JSON: nested too deeply") from None
    if not isinstance(raw, dict):
        raise EngineConfigError(file, "", "must be a JSON object")
    if "pretrained_config" in raw or "build_config" in raw:
        return _parse_current(raw, file)
    if "builder_config" in raw:
        return _parse_legacy(raw, file)
    raise EngineConfigError(
        file,
        "pretrained_config",
        "missing: not a TensorRT-LLM engine config (neither pretrained_config and "
        "build_config nor the older builder_config)",
    )


def _parse_current(raw: Mapping[str, Any], file: Path | str) -> EngineBuild:
    pre = _get(raw, "pretrained_config", "", file, dict) or {}
    build = _get(raw, "build_config", "", file, dict) or {}
    mapping = _get(pre, "mapping", "pretrained_config.", file, dict) or {}
    quant = _get(pre, "quantization", "pretrained_config.", file, dict) or {}
    auto = _get(build, "auto_parallel_config", "build_config.", file, dict) or {}
    w = "pretrained_config.mapping."
    tp, pp = _size(mapping, "tp_size", w, file), _size(mapping, "pp_size", w, file)
    cp = _size(mapping, "cp_size", w, file)
    world = mapping.get("world_size")
    world_size = _size(mapping, "world_size", w, file) if world is not None else tp * pp * cp
    b = "build_config."
    return EngineBuild(
        layout="build_config",
        trtllm_version=_get(raw, "version", "", file, str),
        architecture=_get(pre, "architecture", "pretrained_config.", file, str),
        dtype=_get(pre, "dtype", "pretrained_config.", file, str),
        quant_algo=_get(quant, "quant_algo", "pretrained_config.quantization.", file, str),
        kv_cache_quant_algo=_get(
            quant, "kv_cache_quant_algo", "pretrained_config.quantization.", file, str
        ),
        tp_size=tp,
        pp_size=pp,
        cp_size=cp,
        world_size=world_size,
        gpus_per_node=_get(mapping, "gpus_per_node", w, file, int),
        max_batch_size=_get(build, "max_batch_size", b, file, int),
        max_input_len=_get(build, "max_input_len", b, file, int),
        max_seq_len=_get(build, "max_seq_len", b, file, int),
        max_num_tokens=_get(build, "max_num_tokens", b, file, int),
        built_on=_get(auto, "cluster_key", "build_config.auto_parallel_config.", file, str),
        plugins=_plugins(build.get("plugin_config"), "build_config.plugin_config", file),
    )


def _parse_legacy(raw: Mapping[str, Any], file: Path | str) -> EngineBuild:
    bc = _get(raw, "builder_config", "", file, dict) or {}
    w = "builder_config."
    tp, pp = _size(bc, "tensor_parallel", w, file), _size(bc, "pipeline_parallel", w, file)
    quant = bc.get("quant_mode")
    return EngineBuild(
        layout="builder_config",
        trtllm_version=_get(raw, "version", "", file, str),
        architecture=_get(bc, "name", w, file, str),
        dtype=_get(bc, "precision", w, file, str),
        quant_algo=None if quant in (None, 0) else str(quant)[:64],
        kv_cache_quant_algo=None,
        tp_size=tp,
        pp_size=pp,
        cp_size=1,
        world_size=tp * pp,
        gpus_per_node=None,
        max_batch_size=_get(bc, "max_batch_size", w, file, int),
        max_input_len=_get(bc, "max_input_len", w, file, int),
        max_seq_len=None,
        max_num_tokens=_get(bc, "max_num_tokens", w, file, int),
        built_on=None,
        plugins=_plugins(raw.get("plugin_config"), "plugin_config", file),
    )


def read_engine_dir(path: Path) -> EngineBuild:
    """An engine directory's config.json and its rank<N>.engine files."""
    cfg = path / "config.json"
    try:
        if not path.is_dir():
            raise EngineConfigError(path, "", "engine directory does not exist")
        size = cfg.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise EngineConfigError(cfg, "", f"{size} bytes: too big for an engine config")
        text = cfg.read_bytes().decode("utf-8")
        ranks = sorted(int(m.group(1)) for p in path.iterdir() if (m := _RANK_ENGINE.match(p.name)))
    except FileNotFoundError:
        raise EngineConfigError(cfg, "", "missing: an engine directory has a config.json") from None
    except UnicodeDecodeError as exc:
        raise EngineConfigError(cfg, "", f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise EngineConfigError(cfg, "", f"cannot read: {exc.strerror or exc}") from None
    return dataclasses.replace(parse_engine_config(text, cfg), rank_engines=tuple(ranks))


# --- the host side ---------------------------------------------------------------

# Compute capability of the GPUs TensorRT-LLM's cluster keys name (auto_parallel/
# cluster_info.py), from NVIDIA's table at https://developer.nvidia.com/cuda-gpus. A key
# not here (infer_cluster_key falls back to the device name, "NVIDIA-RTX-A6000") is
# matched by product name only.
CLUSTER_KEY_COMPUTE = {
    "V100": "7.0",
    "V100S": "7.0",
    "T4": "7.5",
    "A100": "8.0",
    "A30": "8.0",
    "A10": "8.6",
    "A10G": "8.6",
    "A40": "8.6",
    "RTX-A6000": "8.6",
    "A6000": "8.6",
    "L4": "8.9",
    "L2": "8.9",
    "L20": "8.9",
    "L40": "8.9",
    "L40S": "8.9",
    "H100": "9.0",
    "H200": "9.0",
    "H20": "9.0",
    "GH200": "9.0",
    "B200": "10.0",
    "GB200": "10.0",
    "GeForce-RTX-3090": "8.6",
    "GeForce-RTX-4090": "8.9",
    "RTX-6000-Ada-Generation": "8.9",
    "GeForce-RTX-5090": "12.0",
}


def cluster_key_product(key: str) -> str:
    """``A100-SXM-80GB`` -> ``A100``, ``NVIDIA-RTX-A6000`` -> ``RTX-A6000``."""
    k = key.removeprefix("NVIDIA-").removeprefix("NVIDIA ")
    k = re.sub(r"[- ](SXM|PCIe|PCIE|NVL)\b.*$", "", k)
    return re.sub(r"[- ]\d+GB$", "", k)


def built_for_compute(build: EngineBuild) -> str | None:
    """The compute capability of the GPU the engine was built on, where that is known."""
    if not build.built_on:
        return None
    return CLUSTER_KEY_COMPUTE.get(cluster_key_product(build.built_on))


@dataclass(frozen=True, slots=True)
class HostGpu:
    index: int
    name: str  # NVML's, "NVIDIA H100 80GB HBM3"
    compute_capability: str  # "9.0"


@dataclass(frozen=True, slots=True)
class Difference:
    what: str  # trtllm_version | compute_capability | gpu_count | rank_engines | gpu_model
    engine: str
    host: str
    critical: bool  # False: TensorRT loads it, but warns (another GPU model, same capability)
    reason: str


def release(version: str) -> tuple[str, ...]:
    """The parts of a version that change the bundled TensorRT: 0.17.0.post1 -> 0.17.0,
    0.9.0.dev2024030500 stays whole (nightlies pin other TensorRT builds)."""
    v = version.strip().lstrip("v").split("+", 1)[0]
    v = re.sub(r"\.post\d+$", "", v)
    return tuple(v.split("."))


def compare(
    build: EngineBuild,
    versions: Mapping[str, str] | None,
    gpus: Sequence[HostGpu] | None,
) -> list[Difference]:
    """What the engine needs that this host does not give. ``versions``: the serving
    environment's installed distributions (normalized names, "tensorrt-llm"); ``gpus``:
    the GPUs the server will see. None: not known, not compared."""
    out: list[Difference] = []
    host_llm = (versions or {}).get("tensorrt-llm")
    if build.trtllm_version and host_llm and release(build.trtllm_version) != release(host_llm):
        trt = (versions or {}).get("tensorrt")
        out.append(
            Difference(
                "trtllm_version",
                build.trtllm_version,
                host_llm,
                True,
                f"engine built by TensorRT-LLM {build.trtllm_version}, this environment has "
                f"{host_llm}{f' (TensorRT {trt})' if trt else ''}: an engine loads only with "
                "the TensorRT release that built it",
            )
        )
    if gpus is not None:
        local = min(build.world_size, build.gpus_per_node or build.world_size)
        if len(gpus) < local:
            out.append(
                Difference(
                    "gpu_count",
                    str(local),
                    str(len(gpus)),
                    True,
                    f"engine has {build.world_size} ranks (tp {build.tp_size} x pp "
                    f"{build.pp_size}{f' x cp {build.cp_size}' if build.cp_size > 1 else ''})"
                    f" and needs {local} GPUs here, {len(gpus)} visible",
                )
            )
        out.extend(_compute_differences(build, gpus[:local] if local else gpus))
    missing = build.missing_ranks
    if missing and build.rank_engines is not None:
        shown = ", ".join(f"rank{r}.engine" for r in missing[:4])
        out.append(
            Difference(
                "rank_engines",
                f"{build.world_size} ranks",
                f"{len(build.rank_engines)} engine files",
                True,
                f"missing {shown}{' ...' if len(missing) > 4 else ''}",
            )
        )
    return out


def _compute_differences(build: EngineBuild, gpus: Sequence[HostGpu]) -> list[Difference]:
    wanted = built_for_compute(build)
    out: list[Difference] = []
    for g in gpus:
        if wanted is not None and g.compute_capability != wanted:
            out.append(
                Difference(
                    "compute_capability",
                    wanted,
                    g.compute_capability,
                    True,
                    f"engine built on {build.built_on} (compute {wanted}), GPU {g.index} is "
                    f"{g.name} (compute {g.compute_capability})",
                )
            )
        elif build.built_on and not _same_model(build.built_on, g.name):
            # TensorRT: "Using an engine plan file across different models of devices is
            # not recommended and is likely to affect performance or even cause errors."
            out.append(
                Difference(
                    "gpu_model",
                    build.built_on,
                    g.name,
                    False,
                    f"engine built on {build.built_on}, GPU {g.index} is {g.name}: TensorRT "
                    "loads it with the same compute capability but warns",
                )
            )
    return out


def _same_model(cluster_key: str, nvml_name: str) -> bool:
    product = cluster_key_product(cluster_key).replace("-", " ").upper()
    words = nvml_name.upper().replace("-", " ")
    return re.search(rf"(^| ){re.escape(product)}( |$)", words) is not None
