"""What an engine's own configuration says: is the nvidia runtime there, is CDI on?

Docker and Podman are asked (``GET /info``: its ``Runtimes`` and ``CDISpecDirs``,
parse_engine_info). containerd and CRI-O are read from their files the way they read
them: containerd's config.toml with its ``imports`` followed (the drop-in
``nvidia-ctk runtime configure`` and the GPU Operator write), CRI-O's crio.conf with the
files of crio.conf.d over it in lexical order. A file that cannot be understood is a
ConfigError naming that file (and the line where the parser gives one).
"""

from __future__ import annotations

import posixpath
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

MAX_CONFIG_FILES = 64  # imports or drop-ins read for one engine
MAX_IMPORT_DEPTH = 8  # an import of an import of ... (containerd follows them all)
MAX_CONFIG_BYTES = 1 << 20

# containerd: where the CRI plugin keeps its runtimes and enable_cdi, by config version,
# and whether CDI is on when enable_cdi is not set (containerd 2.0 turned it on).
_CONTAINERD_CRI: dict[int, tuple[tuple[str, ...], tuple[tuple[str, ...], ...], bool]] = {
    1: (
        ("plugins", "cri", "containerd"),
        (("plugins", "cri"), ("plugins", "cri", "containerd")),
        False,
    ),
    2: (
        ("plugins", "io.containerd.grpc.v1.cri", "containerd"),
        (("plugins", "io.containerd.grpc.v1.cri"),),
        False,
    ),
    3: (
        ("plugins", "io.containerd.cri.v1.runtime", "containerd"),
        (("plugins", "io.containerd.cri.v1.runtime"),),
        True,
    ),
}


class ConfigError(ValueError):
    """A container configuration file that cannot be understood (message names the file;
    ``file``, where set, is that file)."""

    def __init__(self, message: str, file: str = "") -> None:
        super().__init__(message)
        self.file = file


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What an engine is configured with: the nvidia runtime, and CDI device injection
    (None: not known)."""

    nvidia_runtime: bool
    cdi: bool | None
    files: tuple[str, ...] = ()  # the files read, in order (config files only)


def parse_engine_info(data: Any, source: str, cdi_by_default: bool) -> EngineConfig:
    """Docker Engine API ``GET /info`` (docker or podman) -> its runtimes and CDI.

    Docker documents an empty ``CDISpecDirs`` as CDI disabled; a daemon older than the
    field (docker < 25) has none. Podman injects CDI devices natively (``cdi_by_default``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: /info: expected a JSON object")
    runtimes = data.get("Runtimes", {})
    if not isinstance(runtimes, dict):
        raise ConfigError(f"{source}: /info: key 'Runtimes': expected an object")
    dirs = data.get("CDISpecDirs")
    if dirs is not None and not isinstance(dirs, list):
        raise ConfigError(f"{source}: /info: key 'CDISpecDirs': expected a list")
    nvidia = "nvidia" in runtimes or data.get("DefaultRuntime") == "nvidia"
    return EngineConfig(nvidia, bool(dirs) if dirs is not None else cdi_by_default)


def _toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}", source) from None


def _merge(into: dict[str, Any], over: Mapping[str, Any], depth: int = 0) -> None:
    """Tables merged key by key, a later value over an earlier one (lists too)."""
    for key, value in over.items():
        old = into.get(key)
        if isinstance(old, dict) and isinstance(value, dict) and depth < 32:
            _merge(old, value, depth + 1)
        else:
            into[key] = value


def _at(data: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = data
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


Read = Callable[[str], str]  # a host path -> its text (raises OSError)
Glob = Callable[[str], list[str]]  # a host path pattern -> the host paths it matches


def read_containerd_config(file: str, read: Read, glob: Glob) -> EngineConfig:
    """containerd's config.toml and everything its ``imports`` pull in.

    As containerd loads it: each import is a path or a glob, relative to the directory of
    the file that names it; imports of imported files are followed, each file once; the
    files are merged in the order read, a later one over an earlier one."""
    merged: dict[str, Any] = {}
    pending: list[tuple[str, int, str]] = [(file, 0, "")]
    read_files: list[str] = []
    seen: set[str] = set()
    while pending:
        path, depth, named_by = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        if len(read_files) >= MAX_CONFIG_FILES:
            raise ConfigError(f"{named_by}: imports: more than {MAX_CONFIG_FILES} files", named_by)
        try:
            text = read(path)
        except OSError as exc:
            if not named_by:
                raise
            message = f"{named_by}: imports: {path}: cannot read: {exc.strerror or exc}"
            raise ConfigError(message, named_by) from None
        data = _toml(text, path)
        read_files.append(path)
        imports = data.pop("imports", [])
        if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
            raise ConfigError(f"{path}: key 'imports': expected a list of paths", path)
        if imports and depth >= MAX_IMPORT_DEPTH:
            raise ConfigError(f"{path}: imports nested deeper than {MAX_IMPORT_DEPTH}", path)
        _merge(merged, data)
        base = PurePosixPath(path).parent
        for entry in imports:
            target = posixpath.normpath(base / entry)  # an absolute entry stays as it is
            found = sorted(glob(target)) if any(c in entry for c in "*?[") else [target]
            pending.extend((f, depth + 1, path) for f in found)
    version = merged.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version not in _CONTAINERD_CRI:
        raise ConfigError(f"{file}: key 'version': expected 1, 2 or 3, not {version!r}", file)
    runtimes_at, cdi_at, cdi_default = _CONTAINERD_CRI[version]
    runtimes = _at(merged, (*runtimes_at, "runtimes"))
    cdi: bool = cdi_default
    for where in cdi_at:
        flag = _at(merged, (*where, "enable_cdi"))
        if isinstance(flag, bool):
            cdi = flag
    nvidia = isinstance(runtimes, dict) and "nvidia" in runtimes
    return EngineConfig(nvidia, cdi, tuple(read_files))


def read_crio_config(file: str, drop_ins: list[str], read: Read) -> EngineConfig | None:
    """CRI-O's crio.conf, then each drop-in (already in lexical order) over it: the
    ``crio.runtime.runtimes`` table and ``cdi_spec_dirs`` (CRI-O's default:
    /etc/cdi and /var/run/cdi). None when neither the file nor a drop-in exists."""
    merged: dict[str, Any] = {}
    read_files: list[str] = []
    for path in [file, *drop_ins[:MAX_CONFIG_FILES]]:
        try:
            text = read(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}", path) from None
        data = _toml(text, path)
        for key, kind in (("runtimes", dict), ("cdi_spec_dirs", list)):
            value = _at(data, ("crio", "runtime", key))
            if value is not None and not isinstance(value, kind):
                what = "a table" if kind is dict else "a list"
                raise ConfigError(f"{path}: key 'crio.runtime.{key}': expected {what}", path)
        _merge(merged, data)
        read_files.append(path)
    if not read_files:
        return None
    runtimes = _at(merged, ("crio", "runtime", "runtimes"))
    dirs = _at(merged, ("crio", "runtime", "cdi_spec_dirs"))
    nvidia = isinstance(runtimes, dict) and "nvidia" in runtimes
    return EngineConfig(nvidia, bool(dirs) if dirs is not None else True, tuple(read_files))
