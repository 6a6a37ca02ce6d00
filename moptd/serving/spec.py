"""The configuration of serving endpoints and of the managed serving process.

They live under ``collectors.serving.endpoints`` and ``collectors.serving.managed``; the
checks here name the key that is wrong, since the config loader only checks the types of
the top-level options.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moptd.durations import parse_duration
from moptd.serving.engines import ENGINES, REGISTRY

PROBES = ("health", "models", "generate")
RESTART = ("always", "on-failure", "never")


class SpecError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"key '{key}': {message}")
        self.key = key


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str  # base URL, e.g. http://127.0.0.1:8000
    engine: str = "vllm"  # a name of moptd.serving.engines.REGISTRY
    metrics_path: str = "/metrics"
    probes: tuple[str, ...] = ("health",)
    generate_every: float = 30.0
    generate_deadline: float = 10.0
    model: str = ""  # the served model name for the generation probe; "" asks /v1/models
    log_file: str = ""  # the server's log, followed like tail -F
    journal_unit: str = ""  # or its systemd unit, followed through journalctl


@dataclass(frozen=True)
class Managed:
    name: str
    command: tuple[str, ...]
    engine: str = "vllm"
    env: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    model_dir: Path | None = None
    engine_dir: Path | None = None  # a TensorRT-LLM engine directory (trtllm-build output)
    device: str = "gpu"  # cpu skips the GPU gates (vLLM CPU build)
    min_free_gpu_memory: float = 0.0  # bytes, per visible GPU
    probes: tuple[str, ...] = ("health", "models", "generate")
    generate_deadline: float = 10.0
    backend: str = "process"  # process | systemd
    restart: str = "always"
    backoff_initial: float = 2.0
    backoff_max: float = 120.0
    crash_loop_count: int = 5
    crash_loop_window: float = 600.0
    healthy_after: float = 120.0  # a run this long resets the failure streak
    stop_grace: float = 30.0
    log_lines: int = 5000
    log_file: Path | None = None

    def endpoint(self) -> Endpoint:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host  # noqa: S104
        return Endpoint(
            self.name,
            f"http://{host}:{self.port}",
            self.engine,
            REGISTRY[self.engine].metrics_path,
            self.probes,
            30.0,
            self.generate_deadline,
        )


def _str(d: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or (default is None and not v):
        raise SpecError(f"{where}.{key}", f"must be a non-empty string, not {v!r}")
    return v


def _dur(d: Mapping[str, Any], key: str, where: str, default: float) -> float:
    v = d.get(key, default)
    if isinstance(v, bool):
        raise SpecError(f"{where}.{key}", f"must be a duration, not {v!r}")
    try:
        return float(v) if isinstance(v, (int, float)) else parse_duration(v)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"{where}.{key}", str(exc)) from None


def _probes(d: Mapping[str, Any], where: str, default: tuple[str, ...]) -> tuple[str, ...]:
    v = d.get("probes", list(default))
    if not isinstance(v, list) or not all(p in PROBES for p in v):
        raise SpecError(f"{where}.probes", f"must be a list of {', '.join(PROBES)}, not {v!r}")
    return tuple(v)


def _engine(d: Mapping[str, Any], where: str) -> str:
    v = d.get("engine", "vllm")
    if v not in ENGINES:
        names = f"{', '.join(ENGINES[:-1])} or {ENGINES[-1]}" if len(ENGINES) > 1 else ENGINES[0]
        raise SpecError(f"{where}.engine", f"must be {names}, not {v!r}")
    return str(v)


def parse_endpoints(raw: Any, where: str = "collectors.serving.endpoints") -> list[Endpoint]:
    if not isinstance(raw, list):
        raise SpecError(where, "must be a list of {name, url, engine}")
    out: list[Endpoint] = []
    for i, item in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise SpecError(w, "must be a mapping with name and url")
        unknown = set(item) - {
            "name",
            "url",
            "engine",
            "metrics_path",
            "probes",
            "generate_every",
            "generate_deadline",
            "model",
            "log_file",
            "journal_unit",
        }
        if unknown:
            raise SpecError(f"{w}.{sorted(unknown)[0]}", "unknown key")
        url = _str(item, "url", w).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise SpecError(f"{w}.url", f"must start with http:// or https://, not {url!r}")
        engine = _engine(item, w)
        out.append(
            Endpoint(
                _str(item, "name", w),
                url,
                engine,
                _str(item, "metrics_path", w, REGISTRY[engine].metrics_path),
                _probes(item, w, ("health",)),
                _dur(item, "generate_every", w, 30.0),
                _dur(item, "generate_deadline", w, 10.0),
                _str(item, "model", w, ""),
                _str(item, "log_file", w, ""),
                _str(item, "journal_unit", w, ""),
            )
        )
    names = [e.name for e in out]
    for n in names:
        if names.count(n) > 1:
            raise SpecError(where, f"serving name {n!r} appears twice")
    return out


_MANAGED_KEYS = {
    "name",
    "command",
    "engine",
    "env",
    "user",
    "host",
    "port",
    "model_dir",
    "engine_dir",
    "device",
    "min_free_gpu_memory",
    "probes",
    "generate_deadline",
    "backend",
    "restart",
    "backoff_initial",
    "backoff_max",
    "crash_loop_count",
    "crash_loop_window",
    "healthy_after",
    "stop_grace",
    "log_lines",
    "log_file",
}


def parse_managed(raw: Any, where: str = "collectors.serving.managed") -> Managed | None:
    if raw is None or raw == {}:
        return None
    if not isinstance(raw, dict):
        raise SpecError(where, "must be a mapping")
    unknown = set(raw) - _MANAGED_KEYS
    if unknown:
        raise SpecError(
            f"{where}.{sorted(unknown)[0]}",
            f"unknown key (known here: {', '.join(sorted(_MANAGED_KEYS))})",
        )
    cmd = raw.get("command")
    if isinstance(cmd, str):
        import shlex

        try:
            cmd = shlex.split(cmd)
        except ValueError as exc:  # an unclosed quote
            raise SpecError(f"{where}.command", f"cannot split the command line: {exc}") from None
    if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
        raise SpecError(f"{where}.command", "must be a command line: a string or a list")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise SpecError(f"{where}.env", "must be a mapping of names to values")
    port = raw.get("port", 8000)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise SpecError(f"{where}.port", f"must be a port number, not {port!r}")
    model_dir = raw.get("model_dir")
    if model_dir is not None and not isinstance(model_dir, str):
        raise SpecError(f"{where}.model_dir", "must be a path")
    engine_dir = raw.get("engine_dir")
    if engine_dir is not None and not isinstance(engine_dir, str):
        raise SpecError(f"{where}.engine_dir", "must be a path")
    if engine_dir is None:  # TensorRT-LLM's run.py / summarize.py / benchmark flag
        engine_dir = flag_value(tuple(cmd), "--engine_dir")
    for key, allowed in (
        ("device", ("gpu", "cpu")),
        ("backend", ("process", "systemd")),
        ("restart", RESTART),
    ):
        if key in raw and raw[key] not in allowed:
            raise SpecError(f"{where}.{key}", f"must be one of {', '.join(allowed)}")
    for key in ("crash_loop_count", "log_lines"):
        v = raw.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(f"{where}.{key}", f"must be a positive integer, not {v!r}")
    mem = raw.get("min_free_gpu_memory", 0)
    if isinstance(mem, bool) or not isinstance(mem, (int, float)) or mem < 0:
        raise SpecError(f"{where}.min_free_gpu_memory", "must be a number of bytes")
    name = _str(raw, "name", where)
    if not name.replace("-", "").replace("_", "").isalnum():
        raise SpecError(f"{where}.name", "must be letters, digits, - and _ (it names a unit)")
    log_file = raw.get("log_file")
    return Managed(
        name=name,
        command=tuple(cmd),
        engine=_engine(raw, where),
        env={str(k): str(v) for k, v in env.items()},
        user=_str(raw, "user", where) if raw.get("user") is not None else None,
        host=_str(raw, "host", where, "127.0.0.1"),
        port=port,
        model_dir=Path(model_dir) if model_dir else None,
        engine_dir=Path(engine_dir) if engine_dir else None,
        device=str(raw.get("device", "gpu")),
        min_free_gpu_memory=float(mem),
        probes=_probes(raw, where, ("health", "models", "generate")),
        generate_deadline=_dur(raw, "generate_deadline", where, 10.0),
        backend=str(raw.get("backend", "process")),
        restart=str(raw.get("restart", "always")),
        backoff_initial=_dur(raw, "backoff_initial", where, 2.0),
        backoff_max=_dur(raw, "backoff_max", where, 120.0),
        crash_loop_count=int(raw.get("crash_loop_count", 5)),
        crash_loop_window=_dur(raw, "crash_loop_window", where, 600.0),
        healthy_after=_dur(raw, "healthy_after", where, 120.0),
        stop_grace=_dur(raw, "stop_grace", where, 30.0),
        log_lines=int(raw.get("log_lines", 5000)),
        log_file=Path(log_file) if isinstance(log_file, str) else None,
    )


def flag_value(command: tuple[str, ...], flag: str) -> str | None:
    """``--max-num-seqs 8`` or ``--max-num-seqs=8`` in a command line."""
    for i, arg in enumerate(command):
        if arg == flag and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def model_of(command: tuple[str, ...]) -> str | None:
    """The model path of a vLLM/SGLang command line (--model, --model-path, or vllm serve X)."""
    for flag in ("--model", "--model-path"):
        v = flag_value(command, flag)
        if v:
            return v
    if "serve" in command:
        i = command.index("serve")
        if i + 1 < len(command) and not command[i + 1].startswith("-"):
            return command[i + 1]
    return None


def unit_name(name: str) -> str:
    """The systemd unit that runs managed server `name` with backend systemd."""
    return f"moptd-serving@{name}.service"
