"""Configuration: one YAML file over built-in defaults, so `moptd run` needs no file.

Lookup: ``--config PATH``, else ``$MOPTD_CONFIG``, else ``/etc/moptd/moptd.yaml`` when it
exists, else the defaults alone. Every error names the file, the line and the key.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moptd import yamlsafe
from moptd.collector import Collector, OptionError
from moptd.diagnose.rulefiles import default_rules_dir
from moptd.durations import format_duration, parse_duration
from moptd.loopback import is_loopback
from moptd.remediation.policy import DEFAULT_GUARDS, Policy, PolicyError, parse_policy

SYSTEM_CONFIG = Path("/etc/moptd/moptd.yaml")
# A full configuration with every key is a few KiB; anything near this is not one.
MAX_CONFIG_BYTES = 1 << 20


# Bounds on values: a timer of 1e-9 s spins a core, NaN corrupts the timer heap, a size of
# -1 or a mode of -1 means nothing sane. Each is documented in docs/configuration.md.
MIN_INTERVAL = 0.1  # collectors' and the rules' interval, collectors' timeout
MAX_INTERVAL = 86400.0
_INTERVALS = (MIN_INTERVAL, MAX_INTERVAL)
# rules.tick_budget. The default, 250 ms, is a quarter of the default interval, so the
# evaluation (off the loop, but sharing the GIL with it) takes at most that share of a
# second; it is five times the first (cold) tick of the costliest set the load-time bound
# accepts on the 2-core VM (52 ms, BENCHMARKS.md, issue 18), so a set the bound accepts is
# not deferred on a sound host: what the budget catches is a starved machine or a store far
# past the bound's assumptions. Below 10 ms a tick could defer on a scheduler hiccup.
_TICK_BUDGET = (0.01, 3600.0)
MIN_RETENTION = 10.0  # below 10 s no rule window has a history; soak runs keep 30 s
MAX_RETENTION = 30 * 86400.0
SIZE_BOUNDS: dict[str, tuple[int, int]] = {
    "max_points": (2, 1_000_000),
    "max_events": (1, 1_000_000),
    "max_series": (100, 10_000_000),
}


class ConfigError(Exception):
    """A configuration problem, already phrased for the operator."""


def _is_root() -> bool:
    return os.geteuid() == 0


def default_state_dir() -> Path:
    if _is_root():
        return Path("/var/lib/moptd")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "moptd"


def default_api_socket() -> Path:
    if _is_root():
        return Path("/run/moptd/api.sock")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "moptd" / "api.sock"
    return default_state_dir() / "api.sock"


@dataclass(frozen=True)
class CollectorConfig:
    enabled: bool
    interval: float
    timeout: float
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    source: str  # the file read, or "<defaults>"
    state_dir: Path
    log_level: str
    exporter_listen: str | None
    exporter_web_config: Path | None
    api_socket: Path
    api_socket_mode: int
    api_group: str | None
    api_listen: str | None
    api_token_file: Path | None
    retention: float
    max_points: int
    max_events: int
    max_series: int
    procfs: Path
    sysfs: Path
    watch_paths: tuple[Path, ...]
    rule_paths: tuple[Path, ...]
    rule_interval: float
    collectors: Mapping[str, CollectorConfig]
    raw: Mapping[str, Any] = field(default_factory=dict)
    host_root: Path = Path("/")  # paths.host_root: the host's / (procfs, sysfs derive from it)
    rule_tick_budget: float = 0.25  # rules.tick_budget, seconds
    remediation: Policy = field(default_factory=Policy)


# The schema: key -> (accepted types, default or a callable giving it, help). Nested
# mappings are dicts. Collectors' sections are built from the registry.
_LEVELS = ("debug", "info", "warning", "error")
SCHEMA: dict[str, Any] = {
    "state_dir": (
        (str,),
        lambda: str(default_state_dir()),
        "Directory for moptd's state (kernel-log position, findings database).",
    ),
    "log_level": ((str,), "info", "One of debug, info, warning, error."),
    "exporter": {
        "listen": (
            (str, type(None)),
            "127.0.0.1:9477",
            "host:port for Prometheus /metrics; null turns the exporter off.",
        ),
        "web_config_file": (
            (str, type(None)),
            None,
            "TLS and basic auth for /metrics: a web configuration file in node_exporter's "
            "format (docs/security.md); null serves plain HTTP.",
        ),
    },
    "api": {
        "socket": ((str,), lambda: str(default_api_socket()), "Unix socket of the local API."),
        "socket_mode": (
            (int,),
            0o660,
            "Permission bits of the API socket, 0 to 0o777 (no setuid, setgid or sticky bit).",
        ),
        "group": ((str, type(None)), None, "Group allowed to call mutating API endpoints."),
        "listen": ((str, type(None)), None, "Optional loopback host:port for the API."),
        "token_file": ((str, type(None)), None, "Token file required by the TCP API."),
    },
    "store": {
        "retention": (
            (str, int, float),
            "1h",
            "How long signal history is kept: 10s to 30d.",
        ),
        "max_points": ((int,), 4096, "Most points kept per series (changes only): 2 to 1000000."),
        "max_events": ((int,), 10000, "Most events kept per event stream: 1 to 1000000."),
        "max_series": (
            (int,),
            20000,
            "Most series one source (a collector) may hold: 100 to 10000000. A series past it "
            "is dropped and counted in moptd_store_series_dropped_total.",
        ),
    },
    "paths": {
        "host_root": (
            (str,),
            "/",
            "Where the host's / is mounted: / on the host; /host in a container that mounts "
            "the host's / there (deploy/kubernetes). The host's files moptd reads (/etc, "
            "/run, /var, /dev, and /proc and /sys unless set below) are read under it, "
            "symlinks resolved as on the host.",
        ),
        "procfs": (
            (str, type(None)),
            None,
            "Root of procfs; null: HOST_ROOT/proc (tests point it elsewhere).",
        ),
        "sysfs": ((str, type(None)), None, "Root of sysfs; null: HOST_ROOT/sys."),
    },
    "rules": {
        "paths": (
            (list, type(None)),
            None,
            "Rule files or directories, in order; later ones override earlier rules by "
            "id. null: the shipped rules, then /etc/moptd/rules.d when it exists.",
        ),
        "interval": ((str, int, float), "1s", "Time between rule evaluations: 100ms to 1d."),
        "tick_budget": (
            (str, int, float),
            "250ms",
            "Most time one rule evaluation may take, 10ms to 1h (it runs off the event loop). "
            "Past it, the (rule, subject) pairs not reached keep their last result and the "
            "next evaluation starts with them; counted in moptd_rule_ticks_over_budget_total.",
        ),
    },
    "versions": {
        "site_packages": (
            (list,),
            [],
            "site-packages directories of serving environments for the versions collector, "
            "`moptd doctor`'s versions view and `moptd record`'s versions.json, beside the "
            "managed engine's own (found from its command); read as files, nothing is "
            "imported from them.",
        ),
    },
    "host": {
        "watch_paths": (
            (list,),
            ["/", "/tmp"],  # noqa: S108 - watched for space, not written
            "File systems to watch for space (the state dir is always added).",
        ),
    },
    "doctor": {
        "latency_p999_objective": (
            (str, int, float, type(None)),
            None,
            "Objective for the P99.9 end-to-end request latency that `moptd doctor` checks "
            "each serving endpoint's histogram against (e.g. 3s); null: reported, not judged.",
        ),
        "engine_build_dir": (
            (str, type(None)),
            None,
            "Where TensorRT-LLM engines are built: `moptd doctor` checks it has room for "
            "twice the managed model's weights (checkpoint and engine); null: not checked.",
        ),
    },
}
# The remediation policy (docs/remediation.md): checked whole by moptd.remediation.policy.
_GUARD_DURATION = (str, int, float)  # a guard is never null: it cannot be switched off
SCHEMA["remediation"] = {
    "enabled": (
        (bool,),
        False,
        "Let the daemon act on findings as the policy says (off: moptd only advises).",
    ),
    "dry_run": (
        (bool,),
        DEFAULT_GUARDS["dry_run"],
        "Only log and record what each remedy would do (outcome dry-run); false acts.",
    ),
    "min_interval": (
        _GUARD_DURATION,
        DEFAULT_GUARDS["min_interval"],
        "Rate limit: least time between two remedies on one engine (up to 7d).",
    ),
    "breaker_count": (
        (int,),
        DEFAULT_GUARDS["breaker_count"],
        "Circuit breaker: after this many remedies within breaker_window moptd stops acting "
        "and raises REMEDIATION_SUSPENDED (1 to 100).",
    ),
    "breaker_window": (
        _GUARD_DURATION,
        DEFAULT_GUARDS["breaker_window"],
        "The circuit breaker's window (up to 7d).",
    ),
    "min_uptime": (
        _GUARD_DURATION,
        DEFAULT_GUARDS["min_uptime"],
        "Least time since the engine started before a remedy may touch it (up to 7d).",
    ),
    "verify_timeout": (
        _GUARD_DURATION,
        DEFAULT_GUARDS["verify_timeout"],
        "A remedy whose finding has not resolved within this counts as failed (up to 7d).",
    ),
    "policy": (
        (list, type(None)),
        None,
        "Entries {code, remedy[, args, env]}: remedy one of restart_engine, restart_with "
        "(args to add, env to set), readiness_off, none. Loop-prone entries are refused.",
    ),
}
_COLLECTOR_COMMON = {
    "enabled": (bool,),
    "interval": (str, int, float),
    "timeout": (str, int, float),
}


def _line_map(text: str) -> dict[tuple[str, ...], int]:
    """Line number (1-based) of every mapping key, by its path."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.SequenceNode) and path:
            for i, item in enumerate(node.value):
                item_path = (*path[:-1], f"{path[-1]}[{i}]")
                lines[item_path] = item.start_mark.line + 1
                walk(item, item_path)
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if key in seen:
                    raise _KeyProblem((*path, key), key_node.start_mark.line + 1, "duplicate key")
                seen.add(key)
                lines[(*path, key)] = key_node.start_mark.line + 1
                walk(value_node, (*path, key))

    root = yamlsafe.compose(text)
    if root is not None:
        walk(root, ())
    return lines


class _KeyProblem(Exception):
    def __init__(self, path: tuple[str, ...], line: int, message: str) -> None:
        super().__init__(message)
        self.path, self.line, self.message = path, line, message


def _type_names(types: tuple[type, ...]) -> str:
    names = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "true/false",
        list: "list",
        dict: "mapping",
        type(None): "null",
    }
    return " or ".join(names.get(t, t.__name__) for t in types)


def _check_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # YAML's true is not an integer here
    return isinstance(value, types)


def _apply(schema: Mapping[str, Any], data: Any, path: tuple[str, ...]) -> dict[str, Any]:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _KeyProblem(path, 0, "must be a mapping")
    out: dict[str, Any] = {}
    for key in data:
        if key not in schema:
            known = ", ".join(sorted(schema))
            raise _KeyProblem((*path, str(key)), 0, f"unknown key (known here: {known})")
    for key, spec in schema.items():
        if isinstance(spec, dict):
            out[key] = _apply(spec, data.get(key), (*path, key))
            continue
        types, default, _help = spec
        if key in data:
            value = data[key]
            if not _check_type(value, types):
                raise _KeyProblem((*path, key), 0, f"must be {_type_names(types)}, not {value!r}")
            out[key] = value
        else:
            out[key] = default() if callable(default) else default
    return out


def _collector_schema(cls: type[Collector]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "enabled": (_COLLECTOR_COMMON["enabled"], cls.default_enabled, "Run this collector."),
        "interval": (
            _COLLECTOR_COMMON["interval"],
            cls.default_interval,
            "Time between runs: 100ms to 1d.",
        ),
        "timeout": (
            _COLLECTOR_COMMON["timeout"],
            cls.default_timeout,
            "Limit for one run: 100ms to 1d.",
        ),
    }
    for key, opt in cls.options.items():
        types = opt.type if isinstance(opt.type, tuple) else (opt.type,)
        spec[key] = (types, opt.default, opt.help)
    return spec


def full_schema(registry: Mapping[str, type[Collector]]) -> dict[str, Any]:
    schema = dict(SCHEMA)
    schema["collectors"] = {name: _collector_schema(cls) for name, cls in sorted(registry.items())}
    return schema


def find_config_path(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    env = os.environ.get("MOPTD_CONFIG")
    if env:
        return Path(env)
    return SYSTEM_CONFIG if SYSTEM_CONFIG.exists() else None


def load_config(path: Path | None, registry: Mapping[str, type[Collector]]) -> Config:
    source = str(path) if path else "<defaults>"
    text = ""
    if path is not None:
        raw = read_regular_file(path, MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a configuration")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 (byte {exc.start})") from exc
    return parse_config(text, source, registry)


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of a regular file. A FIFO, a device or a directory is refused
    without blocking: opening a FIFO for reading waits for a writer, and start-up would hang
    there, deaf to SIGTERM."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{path}: not a regular file ({_file_kind(mode)})")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(max_bytes)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return f"mode {stat.filemode(mode)}"


def parse_config(text: str, source: str, registry: Mapping[str, type[Collector]]) -> Config:
    try:
        lines = _line_map(text)
        data = yamlsafe.load(text) if text.strip() else {}
        merged = _apply(full_schema(registry), data, ())
        return _build(merged, source, lines, registry)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ConfigError(f"{where}: YAML syntax error: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: YAML error: {exc}") from exc
    except _KeyProblem as exc:
        line = exc.line or _nearest_line(lines_or_empty(text), exc.path)
        where = f"{source}:{line}" if line else source
        key = ".".join(exc.path) or "(top level)"
        raise ConfigError(f"{where}: key '{key}': {exc.message}") from exc


def lines_or_empty(text: str) -> dict[tuple[str, ...], int]:
    try:
        return _line_map(text)
    except (yaml.YAMLError, _KeyProblem):
        return {}


def _nearest_line(lines: Mapping[tuple[str, ...], int], path: tuple[str, ...]) -> int:
    for n in range(len(path), 0, -1):
        if path[:n] in lines:
            return lines[path[:n]]
    return 0


def _duration(merged: Mapping[str, Any], path: tuple[str, ...]) -> float:
    value: Any = merged
    for part in path:
        value = value[part]
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise _KeyProblem(path, 0, str(exc)) from exc


def _bounded_duration(
    merged: Mapping[str, Any], path: tuple[str, ...], low: float, high: float
) -> float:
    seconds = _duration(merged, path)
    if not math.isfinite(seconds):
        raise _KeyProblem(path, 0, f"must be a finite duration, not {seconds!r}")
    if seconds <= 0:
        raise _KeyProblem(path, 0, "must be above zero")
    if not low <= seconds <= high:
        span = f"{format_duration(low)} to {format_duration(high)}"
        raise _KeyProblem(path, 0, f"must be {span}, not {seconds:g} s")
    return seconds


def _check_token_file(path: Path) -> None:
    # stat, never open: a FIFO would block start-up. A missing file is the token loader's
    # to report (TCP mutations stay off), as before.
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _KeyProblem(("api", "token_file"), 0, f"cannot stat {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(mode):
        raise _KeyProblem(
            ("api", "token_file"), 0, f"{path} is {_file_kind(mode)}, not a regular file"
        )


def _build(
    m: dict[str, Any],
    source: str,
    lines: Mapping[tuple[str, ...], int],
    registry: Mapping[str, type[Collector]],
) -> Config:
    if m["log_level"] not in _LEVELS:
        raise _KeyProblem(("log_level",), 0, f"must be one of {', '.join(_LEVELS)}")
    for key in ("exporter", "api"):
        listen = m[key]["listen"]
        if listen is not None:
            _check_listen(listen, (key, "listen"))
    api_listen = m["api"]["listen"]
    if api_listen is not None and not is_loopback(split_listen(api_listen)[0]):
        # reads on the TCP API need no token (findings, command lines): never off the host
        raise _KeyProblem(
            ("api", "listen"), 0, f"must be a loopback address (127.0.0.1, ::1), not {api_listen!r}"
        )
    collectors: dict[str, CollectorConfig] = {}
    for name, section in m["collectors"].items():
        interval = _bounded_duration(m, ("collectors", name, "interval"), *_INTERVALS)
        timeout = _bounded_duration(m, ("collectors", name, "timeout"), *_INTERVALS)
        options = {k: v for k, v in section.items() if k not in _COLLECTOR_COMMON}
        _check_options(registry[name], name, options)
        collectors[name] = CollectorConfig(section["enabled"], interval, timeout, options)
    if "serving" in collectors:
        _check_serving_names(collectors["serving"].options)
    watch = m["host"]["watch_paths"]
    if not all(isinstance(p, str) for p in watch):
        raise _KeyProblem(("host", "watch_paths"), 0, "must be a list of paths")
    token = m["api"]["token_file"]
    if token is not None:
        _check_token_file(Path(token))
    mode = m["api"]["socket_mode"]
    if not 0 <= mode <= 0o777:
        raise _KeyProblem(("api", "socket_mode"), 0, f"must be 0 to 0o777, not {mode} ({mode:#o})")
    for key, (low, high) in SIZE_BOUNDS.items():
        size = m["store"][key]
        if not low <= size <= high:
            raise _KeyProblem(("store", key), 0, f"must be {low} to {high}, not {size!r}")
    rule_paths = m["rules"]["paths"]
    if rule_paths is None:
        rule_paths = [str(p) for p in default_rule_paths()]
    elif not all(isinstance(p, str) for p in rule_paths):
        raise _KeyProblem(("rules", "paths"), 0, "must be a list of paths")
    rule_interval = _bounded_duration(m, ("rules", "interval"), *_INTERVALS)
    tick_budget = _bounded_duration(m, ("rules", "tick_budget"), *_TICK_BUDGET)
    host_root = Path(m["paths"]["host_root"])
    if not host_root.is_absolute():
        raise _KeyProblem(("paths", "host_root"), 0, f"must be an absolute path, not {host_root}")
    retention = _bounded_duration(m, ("store", "retention"), MIN_RETENTION, MAX_RETENTION)
    if m["doctor"]["latency_p999_objective"] is not None:  # doctor reads it from raw
        _bounded_duration(m, ("doctor", "latency_p999_objective"), 0.001, MAX_INTERVAL)
    try:
        remediation = parse_policy(m["remediation"])
    except PolicyError as exc:
        raise _KeyProblem(exc.path, 0, exc.message) from None
    return Config(
        source=source,
        state_dir=Path(m["state_dir"]).expanduser(),
        log_level=m["log_level"],
        exporter_listen=m["exporter"]["listen"],
        exporter_web_config=Path(web) if (web := m["exporter"]["web_config_file"]) else None,
        api_socket=Path(m["api"]["socket"]).expanduser(),
        api_socket_mode=m["api"]["socket_mode"],
        api_group=m["api"]["group"],
        api_listen=m["api"]["listen"],
        api_token_file=Path(token) if token else None,
        retention=retention,
        max_points=m["store"]["max_points"],
        max_events=m["store"]["max_events"],
        max_series=m["store"]["max_series"],
        procfs=Path(procfs) if (procfs := m["paths"]["procfs"]) else host_root / "proc",
        sysfs=Path(sysfs) if (sysfs := m["paths"]["sysfs"]) else host_root / "sys",
        host_root=host_root,
        watch_paths=tuple(Path(p) for p in watch),
        rule_paths=tuple(Path(p) for p in rule_paths),
        rule_interval=rule_interval,
        rule_tick_budget=tick_budget,
        collectors=collectors,
        raw=m,
        remediation=remediation,
    )


LOCAL_RULES = Path("/etc/moptd/rules.d")


def default_rule_paths() -> list[Path]:
    """The shipped rules, then local tuning in /etc/moptd/rules.d when it exists."""
    paths = [default_rules_dir()]
    if LOCAL_RULES.is_dir():
        paths.append(LOCAL_RULES)
    return paths


def _check_options(cls: type[Collector], name: str, options: Mapping[str, Any]) -> None:
    for key, opt in cls.options.items():
        value = options[key]
        # every numeric option is a count, a size or seconds: NaN, inf and <= 0 mean nothing
        if isinstance(value, int | float) and not isinstance(value, bool):
            option_path = ("collectors", name, key)
            if not math.isfinite(value):
                raise _KeyProblem(option_path, 0, f"must be finite, not {value!r}")
            if value <= 0:
                raise _KeyProblem(option_path, 0, f"must be above zero, not {value!r}")
        if opt.check is None:
            continue
        try:
            opt.check(options[key])
        except OptionError as exc:
            where = ("collectors", name, key, *[p for p in exc.key.split(".") if p])
            # "endpoints[0]" names a list item of the option itself
            if len(where) > 3 and where[3].startswith("["):
                where = (*where[:2], key + where[3], *where[4:])
            raise _KeyProblem(where, 0, exc.message) from None


def _check_serving_names(options: Mapping[str, Any]) -> None:
    """One name, one engine: a managed engine and an endpoint of the same name would share
    its signals, findings and remedies (issue 30, item 8). Named at the second name's line."""
    seen: dict[str, str] = {}
    for i, ep in enumerate(options.get("endpoints") or []):
        name = ep.get("name") if isinstance(ep, Mapping) else None
        if isinstance(name, str):
            seen.setdefault(name, f"collectors.serving.endpoints[{i}]")
    managed = options.get("managed") or {}
    name = managed.get("name") if isinstance(managed, Mapping) else None
    if isinstance(name, str) and name in seen:
        raise _KeyProblem(
            ("collectors", "serving", "managed", "name"),
            0,
            f"serving name {name!r} is also {seen[name]}'s: one name, one engine",
        )


def _check_listen(value: str, path: tuple[str, ...]) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _KeyProblem(path, 0, f"must be host:port, not {value!r}")


def split_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)
