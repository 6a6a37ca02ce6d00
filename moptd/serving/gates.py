"""Pre-start gates for the managed serving process, and the model-directory checks.

Each gate returns a ``GateResult``; the supervisor refuses to start when one fails and
says why (the code is a diagnosis code where one fits). They run on the collector's
thread: they read files, bind a socket and may call NVML.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moptd.observations import Event
from moptd.serving.spec import Managed

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
    check: str  # driver | gpus | gpu_memory | port | model_config | tokenizer | weights
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


def run_gates(m: Managed) -> list[GateResult]:
    results: list[GateResult] = []
    if m.device == "gpu":
        results.extend(check_gpus(m.min_free_gpu_memory))
    results.append(check_port(m.host, m.port))
    if m.model_dir is not None:
        results.extend(check_model_dir(m.model_dir))
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
