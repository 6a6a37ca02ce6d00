"""Pre-start gates for the managed serving process, and the model-directory checks.

Each gate returns a ``GateResult``; the supervisor refuses to start when one fails and
says why (the code is a diagnosis code where one fits). They run on the collector's
thread: they read files, bind a socket and may call NVML.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moptd.observations import Event
from moptd.serving.spec import Managed
from moptd.serving.trt_engine import EngineConfigError, HostGpu, compare, read_engine_dir

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tiktoken.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)
SAFE_WEIGHTS = (".safetensors",)
PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt")
OTHER_WEIGHTS = (".gguf",)  # a format vLLM loads directly; not pickle


@dataclass(frozen=True, slots=True)
class GateResult:
    # driver | gpus | gpu_memory | port | model_config | tokenizer | weights | trt_engine
    check: str
    ok: bool
    code: str = ""  # diagnosis code when the failure has one
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelFiles:
    has_config: bool
    has_tokenizer: bool
    safe_weights: int
    pickle_weights: int
    other_weights: int

    @property
    def unsafe_only(self) -> bool:
        return self.pickle_weights > 0 and self.safe_weights == 0


def classify_names(names: list[str]) -> ModelFiles:
    """From file names only (a live directory or a bundle's model_files.txt listing)."""
    base = [n.rsplit("/", 1)[-1] for n in names]
    return ModelFiles(
        has_config="config.json" in base,
        has_tokenizer=any(n in TOKENIZER_FILES for n in base),
        safe_weights=sum(1 for n in base if n.endswith(SAFE_WEIGHTS)),
        pickle_weights=sum(
            1 for n in base if n.endswith(PICKLE_WEIGHTS) and n != "training_args.bin"
        ),
        other_weights=sum(1 for n in base if n.endswith(OTHER_WEIGHTS)),
    )


def scan_model_dir(path: Path) -> ModelFiles:
    return classify_names([p.name for p in path.iterdir() if p.is_file()])


def check_model_dir(path: Path) -> list[GateResult]:
    if not path.is_dir():
        return [GateResult("model_config", False, "", f"model directory {path} does not exist")]
    files = scan_model_dir(path)
    out = [
        GateResult(
            "model_config",
            files.has_config,
            "",
            "" if files.has_config else f"{path} has no config.json",
        ),
        GateResult(
            "tokenizer",
            files.has_tokenizer,
            "" if files.has_tokenizer else "TOKENIZER_MISSING",
            ""
            if files.has_tokenizer
            else f"{path} has no tokenizer file ({', '.join(TOKENIZER_FILES)})",
        ),
    ]
    has_weights = files.safe_weights + files.pickle_weights + files.other_weights > 0
    out.append(
        GateResult("weights", has_weights, "", "" if has_weights else f"{path} has no weight files")
    )
    return out


def check_port(host: str, port: int) -> GateResult:
    """Bind the port the server will use; another listener makes this fail at once,
    where the server would fail only after minutes of model loading."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # The server itself sets SO_REUSEADDR, so sockets in TIME_WAIT do not block it.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return GateResult(
                    "port",
                    False,
                    "PORT_CONFLICT",
                    f"port {port} on {host} is held by another process",
                )
            return GateResult("port", False, "", f"cannot bind {host}:{port}: {exc.strerror}")
    return GateResult("port", True)


def check_gpus(min_free: float) -> list[GateResult]:
    """Driver loaded, GPUs visible, enough free memory on each, through NVML."""
    try:
        import pynvml
    except ImportError:
        return [GateResult("driver", False, "DRIVER_NOT_LOADED", "nvidia-ml-py is not installed")]
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [GateResult("driver", False, "DRIVER_NOT_LOADED", f"NVML: {exc}")]
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        if count == 0:
            return [GateResult("driver", True), GateResult("gpus", False, "", "no GPU visible")]
        out = [GateResult("driver", True), GateResult("gpus", True)]
        short: list[str] = []
        for i in range(count):
            mem: Any = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
            if float(mem.free) < min_free:
                short.append(f"GPU {i}: {mem.free / 2**30:.1f} GiB free")
        out.append(
            GateResult(
                "gpu_memory",
                not short,
                "",
                ""
                if not short
                else f"less than {min_free / 2**30:.1f} GiB free: " + "; ".join(short),
            )
        )
        return out
    except pynvml.NVMLError as exc:
        return [GateResult("gpus", False, "", f"NVML: {exc}")]
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def visible_gpus(env: Mapping[str, str]) -> list[HostGpu] | None:
    """The GPUs a server started with ``env`` sees (CUDA_VISIBLE_DEVICES: indices or
    UUIDs, in its order), with NVML's name and compute capability; None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        gpus: list[tuple[str, HostGpu]] = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            name, uuid = pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h)
            name = name if isinstance(name, str) else name.decode()
            uuid = uuid if isinstance(uuid, str) else uuid.decode()
            gpus.append((uuid, HostGpu(i, name, f"{major}.{minor}")))
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return select_visible(gpus, env.get("CUDA_VISIBLE_DEVICES"))


def select_visible(gpus: list[tuple[str, HostGpu]], spec: str | None) -> list[HostGpu]:
    """CUDA_VISIBLE_DEVICES as the CUDA runtime reads it: a list of indices or UUID
    prefixes, cut at the first entry that names no device."""
    if spec is None:
        return [g for _, g in gpus]
    out: list[HostGpu] = []
    for item in (s.strip() for s in spec.split(",")):
        found = None
        if item.isdigit():
            found = next((g for _, g in gpus if g.index == int(item)), None)
        elif item.startswith("GPU-"):
            found = next((g for uuid, g in gpus if uuid.startswith(item)), None)
        if found is None or found in out:
            break
        out.append(found)
    return out


def check_trt_engine(
    engine_dir: Path,
    versions: Mapping[str, str] | None,
    gpus: list[HostGpu] | None,
) -> list[GateResult]:
    """What the engine directory records against this host: TRT_ENGINE_INCOMPATIBLE with
    what differs, where TensorRT would refuse the plan or the ranks would not fit."""
    try:
        build = read_engine_dir(engine_dir)
    except EngineConfigError as exc:
        return [GateResult("trt_engine", False, "", str(exc))]
    diffs = compare(build, versions, gpus)
    files = [d for d in diffs if d.what == "rank_engines"]
    refused = [d for d in diffs if d.critical and d.what != "rank_engines"]
    warned = [d for d in diffs if not d.critical]
    unknown = [
        what
        for what, missing in (
            ("TensorRT-LLM version", versions is None or "tensorrt-llm" not in versions),
            ("GPUs", gpus is None),
        )
        if missing
    ]
    note = f" (not compared: {', '.join(unknown)})" if unknown else ""
    out = [
        GateResult(
            "trt_engine",
            not refused,
            "TRT_ENGINE_INCOMPATIBLE" if refused else "",
            f"{engine_dir}: " + "; ".join(d.reason for d in refused)
            if refused
            else f"{build.summary()}{note}" + "".join(f"; warning: {d.reason}" for d in warned),
        )
    ]
    if files:
        out.append(GateResult("trt_engine_files", False, "", f"{engine_dir}: {files[0].reason}"))
    return out


def engine_dir_of(m: Managed) -> Path | None:
    """The engine directory to check: ``engine_dir`` (or ``--engine_dir``), else the model
    argument of ``trtllm-serve PATH`` when PATH holds a built engine (rank0.engine beside
    config.json); trtllm-serve also takes a Hugging Face model there, which is no engine."""
    if m.engine_dir is not None:
        return m.engine_dir
    cmd = m.command
    if len(cmd) > 1 and Path(cmd[0]).name == "trtllm-serve" and not cmd[1].startswith("-"):
        candidate = Path(cmd[1])
        if (candidate / "config.json").is_file() and (candidate / "rank0.engine").is_file():
            return candidate
    return None


def run_gates(m: Managed, versions: Mapping[str, str] | None = None) -> list[GateResult]:
    """``versions``: the serving environment's installed distributions, where known."""
    results: list[GateResult] = []
    if m.device == "gpu":
        results.extend(check_gpus(m.min_free_gpu_memory))
    results.append(check_port(m.host, m.port))
    if m.model_dir is not None:
        results.extend(check_model_dir(m.model_dir))
    engine_dir = engine_dir_of(m)
    if engine_dir is not None:
        gpus = visible_gpus(m.env) if m.device == "gpu" else None
        results.extend(check_trt_engine(engine_dir, versions, gpus))
    return results


def refusal_events(subject: str, failed: list[GateResult], t: float) -> list[Event]:
    """One serving.gate event per failed check: why the process was not started."""
    return [
        Event(
            "serving.gate",
            subject,
            t,
            {"code": g.code, "check": g.check, "reason": g.reason},
            g.reason,
        )
        for g in failed
    ]
