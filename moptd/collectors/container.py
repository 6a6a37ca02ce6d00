"""Container collector: can a container reach the GPUs?

An engine counts when its daemon answers, not when a file or a CLI is there: docker and
podman are asked over their socket (GET /_ping, then /info: the runtimes the running
daemon has and whether CDI is on), containerd and CRI-O must accept a connection on
theirs, and their configuration is read as they read it (containerd's config.toml with its
imports, CRI-O's crio.conf with its crio.conf.d drop-ins; moptd.collectors.container_config).
A docker CLI with no daemon behind it is no engine: it is said in
container.engine_status, never a finding. Besides: docker's daemon.json, the
nvidia-container-toolkit version, and the CDI specs in /etc/cdi and /var/run/cdi checked
against the running driver: a spec generated before a driver upgrade names the old
libraries and breaks every GPU container. A malformed file is reported (config_valid 0,
the reason as text) naming the file; it never fails the collector. Files are read under
the context's roots (labelled by their host path) and tools are asked of its Source, so
bundle replay runs this same code over a bundle's container/ files (moptd.bundle); a
bundle has no socket, so there an engine is present on file evidence alone (docs/bundle.md).
"""

from __future__ import annotations

import glob
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from moptd import yamlsafe
from moptd.collector import Collector, CollectorContext, Option, OptionError, Source
from moptd.collectors.container_config import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_FILES,
    ConfigError,
    EngineConfig,
    parse_engine_info,
    read_containerd_config,
    read_crio_config,
)
from moptd.collectors.driver import parse_module_version
from moptd.host_source import source_of
from moptd.observations import NODE, Batch, labels_of
from moptd.proc import engine_socket

log = logging.getLogger(__name__)

__all__ = ["ConfigError", "ContainerCollector", "parse_cdi_spec", "parse_daemon_json"]


@dataclass(frozen=True, slots=True)
class Engine:
    name: str
    process: str  # the daemon's /proc/PID/comm
    binaries: tuple[str, ...]
    socket_option: str
    api: bool  # serves the Docker Engine API (/_ping, /info) on its socket; else gRPC
    cdi_by_default: bool = False  # /info without CDISpecDirs: CDI on (podman) or off


ENGINES: tuple[Engine, ...] = (
    Engine("docker", "dockerd", ("dockerd", "docker"), "docker_socket", api=True),
    Engine("containerd", "containerd", ("containerd",), "containerd_socket", api=False),
    Engine("podman", "podman", ("podman",), "podman_socket", api=True, cdi_by_default=True),
    Engine("crio", "crio", ("crio",), "crio_socket", api=False),
)
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


def parse_containerd_config(text: str, source: str) -> EngineConfig:
    """One containerd config.toml on its own (its imports not followed)."""

    def read(path: str) -> str:
        if path != source:
            raise FileNotFoundError(2, "not read here", path)
        return text

    return read_containerd_config(source, read, lambda pattern: [])


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


def _check_engine_timeout(value: Any) -> None:
    if isinstance(value, bool) or not 0.05 <= float(value) <= 30:
        raise OptionError("", "expected seconds between 0.05 and 30")


class ContainerCollector(Collector):
    name = "container"
    default_interval = 60.0
    default_timeout = 20.0
    options: ClassVar[Mapping[str, Option]] = {
        "docker_daemon_json": Option(str, "/etc/docker/daemon.json", "docker's daemon.json."),
        "containerd_config": Option(
            str, "/etc/containerd/config.toml", "containerd's configuration (imports followed)."
        ),
        "crio_config": Option(str, "/etc/crio/crio.conf", "CRI-O's configuration."),
        "crio_config_dir": Option(
            str, "/etc/crio/crio.conf.d", "CRI-O's drop-ins, read over crio_config in order."
        ),
        "cdi_dirs": Option(list, ["/etc/cdi", "/var/run/cdi"], "Where CDI specs live."),
        "docker_socket": Option(str, "/var/run/docker.sock", "docker's API socket."),
        "containerd_socket": Option(
            str, "/run/containerd/containerd.sock", "containerd's API socket."
        ),
        "podman_socket": Option(str, "/run/podman/podman.sock", "podman's API socket."),
        "crio_socket": Option(str, "/var/run/crio/crio.sock", "CRI-O's API socket."),
        "engine_timeout": Option(
            (int, float),
            2.0,
            "Seconds an engine's socket has to answer (each of /_ping and /info).",
            _check_engine_timeout,
        ),
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
        asked: dict[str, EngineConfig] = {}  # what a daemon that answered said of itself
        for engine in ENGINES:
            socket = self.ctx.host_path(str(self.option(engine.socket_option)))
            installed = source.engine_present(engine.name, engine.binaries, socket, path)
            if self.ctx.recorded:  # a bundle has no socket: file evidence only
                if installed is not None:
                    b.add(
                        "container.engine_present",
                        NODE,
                        float(installed),
                        labels_of(engine=engine.name),
                    )
                continue
            answer = self._ask(b, engine, socket, bool(installed))
            if answer is not None:
                asked[engine.name] = answer
        self._check_docker(b, asked.get("docker"))
        if "podman" in asked:
            self._configured(b, "podman", asked["podman"])
        self._check_containerd(b)
        self._check_crio(b)
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

    def _ask(self, b: Batch, engine: Engine, socket: Path, installed: bool) -> EngineConfig | None:
        """Does the engine's daemon answer on its socket? engine_present says so, and
        engine_status in words; for docker and podman, what /info says of the runtimes."""
        labels = labels_of(engine=engine.name)
        # /proc/net/unix names the path the daemon bound on the host, not where moptd
        # reaches it under a host root (/host/run/...)
        bound = str(self.option(engine.socket_option))
        if engine_socket.process_runs(self.ctx.procfs, engine.process) is False:
            # never connect then: a socket systemd holds (docker.socket, podman.socket)
            # would start the service, and a reader starts nothing
            alive = engine_socket.listening(self.ctx.procfs / "net/unix", bound)
            b.add("container.engine_present", NODE, 1.0 if alive else 0.0, labels)
            if alive:
                status = (
                    f"a socket listens at {socket} but no {engine.process} runs (socket "
                    "activation): not asked, so as not to start it; judged on its files"
                )
            elif installed:
                status = (
                    f"no daemon answers: no {engine.process} runs and nothing listens at "
                    f"{socket} (a CLI or a socket file alone is no engine)"
                )
            else:
                return None
            b.add("container.engine_status", NODE, status, labels)
            return None
        timeout = float(self.option("engine_timeout"))
        info: EngineConfig | None = None
        try:
            if engine.api:
                engine_socket.get(socket, "/_ping", timeout)
                data = engine_socket.get_json(socket, "/info", timeout)
                try:
                    info = parse_engine_info(data, str(socket), engine.cdi_by_default)
                except ConfigError as exc:
                    self._bad(b, str(socket), str(exc))
                version = data.get("ServerVersion") if isinstance(data, dict) else None
                said = f" ({engine.name} {version})" if isinstance(version, str) else ""
            else:
                engine_socket.accepts(socket, timeout)
                said = ""
        except engine_socket.EngineRefused as exc:
            # moptd runs unprivileged; docker.sock and containerd.sock are root's (and the
            # docker group's, root-equivalent): a daemon that listens still counts, judged
            # on its files
            alive = engine_socket.listening(self.ctx.procfs / "net/unix", bound)
            b.add("container.engine_present", NODE, 0.0 if alive is False else 1.0, labels)
            if alive is False:
                status = f"no daemon listens at {socket} (moptd may not open it: permission denied)"
            else:
                seen = "listens" if alive else "may listen (/proc/net/unix unreadable)"
                status = (
                    f"a daemon {seen} at {socket}, but {exc}: judged on its configuration "
                    "files, not asked (asking needs access to the socket)"
                )
            b.add("container.engine_status", NODE, status, labels)
            return None
        except engine_socket.EngineUnreachable as exc:
            b.add("container.engine_present", NODE, 0.0, labels)
            if installed:  # a CLI or a socket file, and nobody home: say it, no finding
                status = f"no daemon answers: {exc} (a CLI or a socket file alone is no engine)"
                b.add("container.engine_status", NODE, status, labels)
            return None
        b.add("container.engine_present", NODE, 1.0, labels)
        b.add("container.engine_status", NODE, f"answers at {socket}{said}", labels)
        return info

    def _configured(self, b: Batch, engine: str, config: EngineConfig) -> None:
        labels = labels_of(engine=engine)
        b.add("container.nvidia_runtime_configured", NODE, float(config.nvidia_runtime), labels)
        if config.cdi is not None:
            b.add("container.cdi_enabled", NODE, float(config.cdi), labels)

    def _check_docker(self, b: Batch, asked: EngineConfig | None) -> None:
        """daemon.json is checked for errors either way; the running daemon's own word on
        its runtimes, where it answered, is the one that counts (daemon.json edited but
        docker not restarted is a daemon without the runtime)."""
        file = str(self.option("docker_daemon_json"))
        try:
            text = self._read_text(file)
        except FileNotFoundError:
            text = None
        except OSError as exc:
            self._bad(b, file, f"{file}: cannot read: {exc.strerror}")
            text = None
        from_file: bool | None = None
        if text is not None:
            try:
                from_file = parse_daemon_json(text, file)
            except ConfigError as exc:
                self._bad(b, file, str(exc))
            else:
                b.add("container.config_valid", NODE, 1.0, labels_of(file=file))
        if asked is not None:
            self._configured(b, "docker", asked)
        elif from_file is not None:
            labels = labels_of(engine="docker")
            b.add("container.nvidia_runtime_configured", NODE, float(from_file), labels)
        elif text is None and not self.ctx.recorded:  # in a recording, absent is not recorded
            b.add("container.nvidia_runtime_configured", NODE, 0.0, labels_of(engine="docker"))

    def _check_containerd(self, b: Batch) -> None:
        file = str(self.option("containerd_config"))
        try:
            config = read_containerd_config(file, self._read_text, self._glob)
        except FileNotFoundError:
            if not self.ctx.recorded:
                b.add(
                    "container.nvidia_runtime_configured",
                    NODE,
                    0.0,
                    labels_of(engine="containerd"),
                )
            return
        except OSError as exc:
            self._bad(b, file, f"{file}: cannot read: {exc.strerror}")
            return
        except ConfigError as exc:
            self._bad(b, exc.file or file, str(exc))
            return
        for f in config.files:
            b.add("container.config_valid", NODE, 1.0, labels_of(file=f))
        self._configured(b, "containerd", config)

    def _check_crio(self, b: Batch) -> None:
        file = str(self.option("crio_config"))
        directory = str(self.option("crio_config_dir"))
        try:
            entries = sorted(self.ctx.host_path(directory).iterdir())
        except OSError:
            entries = []
        drop_ins = [str(Path(directory) / p.name) for p in entries if p.is_file()]
        if len(drop_ins) > MAX_CONFIG_FILES:
            message = (
                f"{directory}: more than {MAX_CONFIG_FILES} drop-ins: only the first "
                f"{MAX_CONFIG_FILES} are read"
            )
            self._bad(b, directory, message)
        try:
            config = read_crio_config(file, drop_ins, self._read_text)
        except ConfigError as exc:
            self._bad(b, exc.file or file, str(exc))
            return
        if config is None:
            return  # no CRI-O configuration: nothing to say of an engine not set up here
        for f in config.files:
            b.add("container.config_valid", NODE, 1.0, labels_of(file=f))
        self._configured(b, "crio", config)

    def _read_text(self, file: str) -> str:
        with self.ctx.host_path(file).open("rb") as fh:
            return fh.read(MAX_CONFIG_BYTES).decode("utf-8", "replace")

    def _glob(self, pattern: str) -> list[str]:
        """Host paths matching a host path pattern, looked for under the context's roots."""
        found = sorted(glob.glob(str(self.ctx.host_path(pattern))))[: MAX_CONFIG_FILES + 1]
        ctx = self.ctx
        for top, root in (("/etc", ctx.etc), ("/proc", ctx.procfs), ("/sys", ctx.sysfs)):
            under = all(Path(m).is_relative_to(root) for m in found)
            if Path(pattern).is_relative_to(top) and under:
                return [str(Path(top) / Path(m).relative_to(root)) for m in found]
        return [ctx.path_on_host(m) for m in found]

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
