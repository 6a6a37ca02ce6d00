"""Container collector: can a container reach the GPUs?

Which engines are present (binary or socket), whether docker's daemon.json and
containerd's config name the nvidia runtime, the nvidia-container-toolkit version, and
the CDI specs in /etc/cdi and /var/run/cdi checked against the running driver: a spec
generated before a driver upgrade names the old libraries and breaks every GPU
container. A malformed file is reported (config_valid 0, the reason as text) naming the
file; it never fails the collector. Files are read under the context's roots (labelled by
their host path) and engines and tools are asked of its Source, so bundle replay runs this
same code over a bundle's container/ files (moptd.bundle).
"""

from __future__ import annotations

import json
import logging
import re
import tomllib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from moptd import yamlsafe
from moptd.collector import Collector, CollectorContext, Option, Source
from moptd.collectors.driver import parse_module_version
from moptd.host_source import source_of
from moptd.observations import NODE, Batch, labels_of

log = logging.getLogger(__name__)

ENGINES: dict[str, tuple[tuple[str, ...], str]] = {
    # engine -> (binaries, option naming its socket)
    "docker": (("dockerd", "docker"), "docker_socket"),
    "containerd": (("containerd",), "containerd_socket"),
    "podman": (("podman",), "podman_socket"),
}
_LIB_VERSION = re.compile(
    r"lib(?:cuda|nvidia-ml|nvidia-ptxjitcompiler|nvidia-opencl|nvcuvid|nvidia-encode|"
    r"nvidia-nvvm|nvidia-cfg|nvidia-allocator|nvidia-gpucomp|nvidia-glcore|nvidia-tls)"
    r"\.so\.(?P<v>\d{3}\.\d{1,3}(?:\.\d{1,3})?)\b"
)
_TOOLKIT = re.compile(
    r"(?:NVIDIA Container Toolkit CLI version|cli-version:|version)\s*:?\s*(?P<v>\d+\.\d+\.\d+\S*)",
    re.IGNORECASE,
)
MAX_SPEC_BYTES = 4 << 20


class ConfigError(ValueError):
    """A container configuration file that cannot be understood (message names the file)."""


def _where(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f":{mark.line + 1}"
    lineno = getattr(exc, "lineno", None)
    return f":{lineno}" if lineno else ""


def parse_daemon_json(text: str, source: str) -> bool:
    """daemon.json -> does it configure the nvidia runtime (a runtimes.nvidia entry, or
    nvidia as the default runtime)?"""
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: expected a JSON object")
    runtimes = data.get("runtimes", {})
    if not isinstance(runtimes, dict):
        raise ConfigError(f"{source}: key 'runtimes': expected an object")
    return "nvidia" in runtimes or data.get("default-runtime") == "nvidia"


def _walk(node: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    if depth > 12:
        return
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k), v
            yield from _walk(v, depth + 1)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v, depth + 1)


def parse_containerd_config(text: str, source: str) -> bool:
    """config.toml -> a runtimes.nvidia table (config v2 or v3), or CDI enabled."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    for key, value in _walk(data):
        if key == "runtimes" and isinstance(value, dict) and "nvidia" in value:
            return True
        if key == "enable_cdi" and value is True:
            return True
    return False


@dataclass(frozen=True, slots=True)
class CdiSpec:
    kind: str
    driver_version: str  # "" when no library path names one


def _strings(node: Any, depth: int = 0) -> Iterator[str]:
    if depth > 16:
        return
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v, depth + 1)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, depth + 1)


def parse_cdi_spec(text: str, source: str) -> CdiSpec:
    """A CDI spec (YAML or JSON) -> its kind and the driver version its libraries name."""
    try:
        data = yamlsafe.load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}{_where(exc)}: not valid YAML/JSON") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: expected a mapping (a CDI spec)")
    for key in ("cdiVersion", "kind"):
        if not isinstance(data.get(key), str):
            raise ConfigError(f"{source}: key '{key}': missing or not a string")
    if not isinstance(data.get("devices", []), list):
        raise ConfigError(f"{source}: key 'devices': expected a list")
    versions: Counter[str] = Counter()
    for s in _strings(data):
        for m in _LIB_VERSION.finditer(s):
            versions[m.group("v")] += 1
    driver = versions.most_common(1)[0][0] if versions else ""
    return CdiSpec(data["kind"], driver)


def parse_toolkit_version(text: str) -> str:
    m = _TOOLKIT.search(text)
    return m.group("v") if m else ""


class ContainerCollector(Collector):
    name = "container"
    default_interval = 60.0
    default_timeout = 20.0
    options: ClassVar[Mapping[str, Option]] = {
        "docker_daemon_json": Option(str, "/etc/docker/daemon.json", "docker's daemon.json."),
        "containerd_config": Option(
            str, "/etc/containerd/config.toml", "containerd's configuration."
        ),
        "cdi_dirs": Option(list, ["/etc/cdi", "/var/run/cdi"], "Where CDI specs live."),
        "docker_socket": Option(str, "/var/run/docker.sock", "docker's API socket."),
        "containerd_socket": Option(
            str, "/run/containerd/containerd.sock", "containerd's API socket."
        ),
        "podman_socket": Option(str, "/run/podman/podman.sock", "podman's API socket."),
        "search_path": Option(
            (str, type(None)), None, "PATH for the engine binaries (null: the daemon's PATH)."
        ),
        "use_tools": Option(bool, True, "Run nvidia-ctk / nvidia-container-cli for the version."),
    }

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._reported: set[str] = set()

    async def collect(self) -> Batch:
        return await self.blocking(self.read)

    def _bad(self, b: Batch, file: str, message: str) -> None:
        b.add("container.config_valid", NODE, 0.0, labels_of(file=file))
        b.add("container.config_error", NODE, message, labels_of(file=file))
        if message not in self._reported:
            self._reported.add(message)
            log.warning("%s", message)

    def read(self) -> Batch:
        """One pass over the sources (blocking)."""
        b = Batch()
        source = source_of(self.ctx)
        path = self.option("search_path")
        for engine, (binaries, socket_opt) in ENGINES.items():
            socket = self.ctx.host_path(str(self.option(socket_opt)))
            present = source.engine_present(engine, binaries, socket, path)
            if present is not None:
                b.add("container.engine_present", NODE, float(present), labels_of(engine=engine))
        self._check_file(b, "docker", str(self.option("docker_daemon_json")), parse_daemon_json)
        self._check_file(
            b, "containerd", str(self.option("containerd_config")), parse_containerd_config
        )
        running = ""
        text = _read(self.ctx.procfs / "driver/nvidia/version")
        if text is not None:
            parsed = parse_module_version(text)
            running = parsed[0] if parsed else ""
        for file, spec_path in self._cdi_files():
            try:
                data = spec_path.read_bytes()[:MAX_SPEC_BYTES].decode("utf-8", "replace")
                spec = parse_cdi_spec(data, file)
            except OSError as exc:
                self._bad(b, file, f"{file}: cannot read: {exc.strerror}")
                continue
            except ConfigError as exc:
                self._bad(b, file, str(exc))
                continue
            b.add("container.config_valid", NODE, 1.0, labels_of(file=file))
            b.add(
                "container.cdi_spec",
                NODE,
                1.0,
                labels_of(file=file, kind=spec.kind, driver_version=spec.driver_version),
            )
            if spec.driver_version and running:
                match = float(spec.driver_version == running)
                b.add("container.cdi_spec_driver_match", NODE, match, labels_of(file=file))
        if self.option("use_tools"):
            version = _toolkit_version(source, path)
            if version:
                b.add("container.toolkit_version", NODE, 1.0, labels_of(version=version))
        return b

    def _check_file(self, b: Batch, engine: str, file: str, parse: Any) -> None:
        try:
            text = self.ctx.host_path(file).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            if not self.ctx.recorded:  # in a recording, absent is not recorded
                labels = labels_of(engine=engine)
                b.add("container.nvidia_runtime_configured", NODE, 0.0, labels)
            return
        except OSError as exc:
            self._bad(b, file, f"{file}: cannot read: {exc.strerror}")
            return
        try:
            configured = bool(parse(text, file))
        except ConfigError as exc:
            self._bad(b, file, str(exc))
            return
        b.add("container.config_valid", NODE, 1.0, labels_of(file=file))
        b.add(
            "container.nvidia_runtime_configured",
            NODE,
            float(configured),
            labels_of(engine=engine),
        )

    def _cdi_files(self) -> list[tuple[str, Path]]:
        """(the spec's host path, where it is read) for each CDI spec."""
        out: list[tuple[str, Path]] = []
        for d in self.option("cdi_dirs"):
            try:
                entries = sorted(self.ctx.host_path(str(d)).iterdir())
            except OSError:
                continue
            out.extend(
                (str(Path(str(d)) / p.name), p)
                for p in entries
                if p.suffix in (".yaml", ".yml", ".json") and p.is_file()
            )
        return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _toolkit_version(source: Source, path: str | None) -> str:
    for argv in (["nvidia-ctk", "--version"], ["nvidia-container-cli", "--version"]):
        version = parse_toolkit_version(source.run(argv, path) or "")
        if version:
            return version
    return ""
