"""The remediation policy as data, checked whole before it is put in force.

A policy maps diagnosis codes to remedies from a closed set. It is refused, with the key
that is wrong, when it names an unknown code or remedy, switches a guard off, or is
loop-prone: a remedy that can itself cause the code it answers (RESTART_CAUSES) would
restart an engine because it was restarted. moptd never resets a GPU: a GPU reset takes
every process on that GPU with it, and an engine uses it, so no remedy does one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moptd.diagnose.codes import CODES
from moptd.durations import parse_duration

REMEDIES = ("restart_engine", "restart_with", "readiness_off", "none")
RESTARTS = ("restart_engine", "restart_with")

# The codes a restart of the engine can cause by itself, so a restart may not answer them:
# - SERVING_DOWN: the process is gone between the stop and the new start, and a restart
#   that does not come up turns into the supervisor's crash loop (the classic loop);
# - PORT_CONFLICT: the new server's gate finds the port still held by the old one;
# - CUDA_OOM, KV_CACHE_CAPACITY_INSUFFICIENT and GPU_MEMORY_OCCUPIED_AT_START: the new engine
#   allocates GPU memory the old one may not have released yet.
# ENGINE_DEAD is not among them: the lines vLLM prints while moptd stops it are not counted
# (moptd.serving.supervisor), and a loading engine's failed probes are not read as faults.
# readiness_off and none cause no code (the engine is left running as it is).
RESTART_CAUSES = frozenset(
    {
        "SERVING_DOWN",
        "PORT_CONFLICT",
        "CUDA_OOM",
        "KV_CACHE_CAPACITY_INSUFFICIENT",
        "GPU_MEMORY_OCCUPIED_AT_START",
    }
)
CAUSES: Mapping[str, frozenset[str]] = {
    "restart_engine": RESTART_CAUSES,
    "restart_with": RESTART_CAUSES,
    "readiness_off": frozenset(),
    "none": frozenset(),
}
GPU_RESETS = ("reset_gpu", "gpu_reset", "nvidia_smi_reset", "reset")
# restart_with may add arguments, never point the engine at another model or address
FIXED_ARGS = ("--model", "--host", "--port", "--served-model-name")
# restart_with changes how the engine runs, never what code runs: these load code from
# elsewhere into the engine, so a policy entry may not set them (issue 30, item 8)
CODE_ARGS: Mapping[str, str] = {
    "--trust-remote-code": "runs Python shipped with the model (vLLM, SGLang, HF)",
    "--worker-cls": "names the Python class vLLM runs as its worker",
    "--worker-extension-cls": "adds a Python class to vLLM's worker",
    "--model-impl": "picks another model implementation",
    "--load-format": "picks how weights are loaded (a plugin, or pickle-based formats)",
    "--tokenizer": "points at another tokenizer, with its own remote code",
    "--chat-template": "replaces the Jinja template run on every request",
    "--plugins": "loads plugins into the engine",
    "--enable-custom-code": "runs code shipped with the model",
}
CODE_ENV: Mapping[str, str] = {
    "LD_PRELOAD": "loads a shared library into every process",
    "LD_LIBRARY_PATH": "chooses which shared libraries load (CUDA, NCCL included)",
    "LD_AUDIT": "loads a shared library into every process",
    "PYTHONPATH": "chooses which Python modules import",
    "PYTHONSTARTUP": "runs a Python file",
    "PYTHONHOME": "chooses the Python standard library",
    "PYTHONUSERBASE": "chooses the user site-packages",
    "PYTHONINSPECT": "drops into an interactive interpreter",
    "PATH": "chooses which programs run",
    "VLLM_PLUGINS": "loads vLLM plugins",
    "HF_HUB_ENABLE_HF_TRANSFER": "loads another download module",
    "TRUST_REMOTE_CODE": "runs Python shipped with the model",
    "CUDA_INJECTION64_PATH": "loads a shared library into every CUDA process",
    "NCCL_NET_PLUGIN": "loads a network plugin library into NCCL",
    "NCCL_TUNER_PLUGIN": "loads a tuner plugin library into NCCL",
}
ENTRY_KEYS = ("code", "remedy", "args", "env")

# The guards' defaults (docs/remediation.md says why each is what it is).
DEFAULT_GUARDS: Mapping[str, Any] = {
    "dry_run": True,
    "min_interval": "10m",
    "breaker_count": 3,
    "breaker_window": "1h",
    "min_uptime": "5m",
    "verify_timeout": "10m",
}
MAX_DURATION = 7 * 86400.0
MAX_BREAKER_COUNT = 100


class PolicyError(Exception):
    """What is wrong, and the key path in the configuration (mapped to file:line there)."""

    def __init__(self, path: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


@dataclass(frozen=True, slots=True)
class Guards:
    dry_run: bool = True
    min_interval: float = 600.0  # the rate limit: least time between two remedies
    breaker_count: int = 3  # remedies within breaker_window; the next one trips the breaker
    breaker_window: float = 3600.0
    min_uptime: float = 300.0  # least time since the engine started
    verify_timeout: float = 600.0  # the finding must clear within this, or the remedy failed

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(frozen=True, slots=True)
class Entry:
    index: int  # its place in remediation.policy: the audit names it
    code: str
    remedy: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"remediation.policy[{self.index}]"

    def as_dict(self) -> dict[str, Any]:
        return {
            "entry": self.name,
            "code": self.code,
            "remedy": self.remedy,
            "args": list(self.args),
            "env": dict(self.env),
        }


@dataclass(frozen=True, slots=True)
class Policy:
    enabled: bool = False
    guards: Guards = field(default_factory=Guards)
    entries: tuple[Entry, ...] = ()

    def entry_for(self, code: str) -> Entry | None:
        if not self.enabled:
            return None
        return next((e for e in self.entries if e.code == code), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "guards": self.guards.as_dict(),
            "entries": [e.as_dict() for e in self.entries],
        }


SECTION = "remediation"


def parse_policy(section: Mapping[str, Any]) -> Policy:
    """The policy of the configuration's `remediation:` mapping (types already checked by
    the configuration schema); raises PolicyError naming the key."""
    enabled = section.get("enabled", False)
    if not isinstance(enabled, bool):
        raise PolicyError((SECTION, "enabled"), f"must be true/false, not {enabled!r}")
    guards = _guards(section)
    raw = section.get("policy")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise PolicyError((SECTION, "policy"), "must be a list of {code, remedy} entries")
    entries = tuple(_entry(i, item) for i, item in enumerate(raw))
    seen: dict[str, int] = {}
    for e in entries:
        if e.code in seen:
            raise PolicyError(
                (SECTION, f"policy[{e.index}]", "code"),
                f"{e.code} already has a remedy in policy[{seen[e.code]}]: one remedy per code",
            )
        seen[e.code] = e.index
    return Policy(enabled, guards, entries)


def _guards(section: Mapping[str, Any]) -> Guards:
    values: dict[str, Any] = {}
    for key, default in DEFAULT_GUARDS.items():
        value = section.get(key, default)
        path = (SECTION, key)
        if value is None or (value is False and key != "dry_run"):
            raise PolicyError(path, "a guard cannot be turned off; give it a value")
        if key == "dry_run":
            if not isinstance(value, bool):
                raise PolicyError(path, f"must be true/false, not {value!r}")
            values[key] = value
        elif key == "breaker_count":
            if isinstance(value, bool) or not isinstance(value, int):
                raise PolicyError(path, f"must be an integer, not {value!r}")
            if not 1 <= value <= MAX_BREAKER_COUNT:
                raise PolicyError(path, f"must be 1 to {MAX_BREAKER_COUNT}, not {value}")
            values[key] = value
        else:
            values[key] = _duration(path, value)
    return Guards(**values)


def _duration(path: tuple[str, ...], value: Any) -> float:
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError) as exc:
        raise PolicyError(path, str(exc)) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise PolicyError(path, "a guard cannot be turned off: must be above zero")
    if seconds > MAX_DURATION:
        raise PolicyError(path, f"must be at most 7d, not {seconds:g} s")
    return seconds


def _entry(index: int, item: Any) -> Entry:
    where = (SECTION, f"policy[{index}]")
    if not isinstance(item, Mapping):
        raise PolicyError(where, "must be a mapping with code and remedy")
    for key in item:
        if key not in ENTRY_KEYS:
            raise PolicyError(
                (*where, str(key)), f"unknown key (known here: {', '.join(ENTRY_KEYS)})"
            )
    code = item.get("code")
    if not isinstance(code, str) or code not in CODES:
        raise PolicyError(
            (*where, "code"),
            f"unknown diagnosis code {code!r} (moptd explain "
            "--code lists them; docs/diagnosis-codes.md)",
        )
    if CODES[code].layer == "moptd":
        raise PolicyError(
            (*where, "code"),
            f"{code} is about moptd itself; no remedy of the engine answers it",
        )
    remedy = item.get("remedy")
    if isinstance(remedy, str) and remedy.lower() in GPU_RESETS:
        raise PolicyError(
            (*where, "remedy"),
            "moptd never resets a GPU: a reset takes every process on that GPU with it, and "
            "a serving engine uses it (drain the node and reset it by hand: docs/remediation.md)",
        )
    if not isinstance(remedy, str) or remedy not in REMEDIES:
        raise PolicyError(
            (*where, "remedy"), f"unknown remedy {remedy!r} (one of {', '.join(REMEDIES)})"
        )
    if code in CAUSES[remedy]:
        raise PolicyError(
            (*where, "remedy"),
            f"loop-prone: {remedy} can itself cause {code} (a restart leaves the engine down "
            "for a while, and one that does not come up is a crash loop); answer it with "
            "readiness_off or none, or let the supervisor's restarts handle it",
        )
    args = _args(where, item.get("args"), remedy)
    env = _env(where, item.get("env"), remedy)
    if remedy == "restart_with" and not args and not env:
        raise PolicyError(where, "restart_with needs the changed setting: args or env")
    return Entry(index, code, remedy, args, env)


def _args(where: tuple[str, ...], raw: Any, remedy: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    path = (*where, "args")
    if remedy != "restart_with":
        raise PolicyError(path, f"only restart_with takes args, not {remedy}")
    if not isinstance(raw, list) or not raw or len(raw) > 16:
        raise PolicyError(path, "must be a list of 1 to 16 command-line arguments")
    out = []
    for arg in raw:
        if not isinstance(arg, str) or not arg or "\0" in arg or len(arg) > 256:
            raise PolicyError(path, f"each argument is a non-empty string, not {arg!r}")
        if arg.split("=", 1)[0] in FIXED_ARGS:
            raise PolicyError(path, f"{arg} would serve another model or address; not a remedy")
        name = arg.split("=", 1)[0].replace("_", "-")
        if name in CODE_ARGS:
            raise PolicyError(
                path, f"{arg} changes the code that runs ({CODE_ARGS[name]}); not a remedy"
            )
        out.append(arg)
    return tuple(out)


def _env(where: tuple[str, ...], raw: Any, remedy: str) -> dict[str, str]:
    if raw is None:
        return {}
    path = (*where, "env")
    if remedy != "restart_with":
        raise PolicyError(path, f"only restart_with takes env, not {remedy}")
    if not isinstance(raw, Mapping) or not raw or len(raw) > 16:
        raise PolicyError(path, "must be a mapping of 1 to 16 NAME: value pairs")
    out = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not k.replace("_", "a").isalnum() or k[0].isdigit():
            raise PolicyError(path, f"not an environment variable name: {k!r}")
        if k.upper() in CODE_ENV or k.upper().startswith("LD_"):
            why = CODE_ENV.get(k.upper(), "steers the dynamic linker")
            raise PolicyError((*path, k), f"{k} changes the code that runs ({why}); not a remedy")
        if not isinstance(v, str) or "\0" in v:
            raise PolicyError((*path, k), f"must be a string, not {v!r}")
        out[k] = v
    return out
