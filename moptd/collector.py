"""The collector contract.

A collector's ``collect()`` returns a Batch, raises ``Unavailable`` ("no data here": an
absent GPU on a CPU host is normal), or raises anything else (a failure). The runtime
turns every outcome into the collector.* signals. Blocking work goes through
``self.blocking(fn)``, which runs it on the collector's own thread so that a call that
hangs (an NVML query on a GPU in recovery) can never exhaust a shared pool or stall the
event loop (nor, being a daemon thread, the daemon's exit).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from moptd.clock import Clock, SystemClock
from moptd.observations import Batch, Event
from moptd.worker import Worker

T = TypeVar("T")
log = logging.getLogger(__name__)


class Unavailable(Exception):
    """The collector's data source does not exist on this host (no driver, no journal)."""


class CollectorBusy(Exception):
    """The previous blocking call has not returned yet (the source is hanging)."""


class OptionError(ValueError):
    """A collector option's value is wrong; ``key`` is the dotted path below the option
    (``[i]`` for list items), so the config loader can name the file line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


@dataclass(frozen=True)
class Option:
    """One collector-specific configuration key: its type, default and meaning, and
    optionally a check run when the configuration is loaded (raises OptionError)."""

    type: type | tuple[type, ...]
    default: Any
    help: str
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """A file system's size in bytes, as statvfs gives it and `df -P` prints it."""

    size: int
    used: int
    available: int


@dataclass(frozen=True, slots=True)
class GpuIdentities:
    """The GPUs by PCI bus id (index and UUID) and the user-space driver version ("" when
    unknown) with where it was read."""

    index_by_bus: Mapping[str, int]
    uuid_by_bus: Mapping[str, str]
    user_version: str
    user_version_source: str = "nvml"


class Source(Protocol):
    """What the host, driver and container collectors read that is not a file under one of
    the context's roots. Live, it asks the host (statvfs, tools, NVML); over a bundle, it
    answers from the bundle's files. None (or an empty answer) means "not known here": the
    collector then emits nothing for it."""

    def disk_usage(self, path: Path) -> DiskUsage | None: ...

    def cpu_count(self) -> int | None: ...

    def kernel_release(self) -> str | None: ...

    def run(self, argv: Sequence[str], search_path: str | None = None) -> str | None:
        """A tool's standard output; None when it is absent or fails."""
        ...

    def engine_present(
        self, engine: str, binaries: Sequence[str], socket: Path, search_path: str | None
    ) -> bool | None: ...

    def device_nodes(self, dev: Path) -> Mapping[str, os.stat_result | None] | None:
        """The entries named nvidia* in ``dev`` by name (None: one that cannot be
        stat'ed); None when not known (not recorded)."""
        ...

    def stat(self, path: Path) -> os.stat_result | None:
        """A device node expected but not listed by ``device_nodes``."""
        ...

    def gpu_identities(self, procfs: Path) -> GpuIdentities: ...


class SavedPosition(Protocol):
    """A followed log's committed place: the boot, and the kmsg sequence number or the
    journal cursor of the last record whose events are stored."""

    @property
    def boot_id(self) -> str: ...
    @property
    def seq(self) -> int | None: ...
    @property
    def cursor(self) -> str: ...


class PositionStore(Protocol):
    """Where a collector that follows a log keeps its place: in the daemon, the findings
    database, which commits a position in the same transaction as the events that carry
    it. A one-shot command has none: it keeps no place and reads the whole log."""

    def load_position(self, source: str) -> SavedPosition | None:
        """Blocking: call it through ``Collector.blocking``."""
        ...

    def save_position(self, source: str, boot_id: str, seq: int | None, cursor: str = "") -> object:
        """Queued behind the events published before it; returns at once."""
        ...


class XidCounter(Protocol):
    """The Xid counter the kernel-log and NVML collectors share, so that an Xid both
    report counts once (moptd.kernel.xid_tally.XidTally)."""

    kernel_following: bool

    def add(self, source: str, subject: str, code: int, t: float) -> bool: ...

    def report(self, batch: Batch) -> None: ...


@dataclass
class CollectorContext:
    """What a collector may know about the daemon: its own options, the filesystem roots
    it reads, what it reads that is not a file (``source``; None: the live host), the
    state directory, the clock, a way to publish events as they come, and (in the
    daemon) where a log follower keeps its place, and the Xid counter shared by the
    collectors that see Xids.

    ``recorded``: the sources are a recording (a bundle), not a live host. A file that is
    absent there is evidence that was not recorded: the collector goes on without it
    instead of reporting its source unavailable, and emits nothing that only a live host
    could tell (running processes, for one)."""

    options: Mapping[str, Any] = field(default_factory=dict)
    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    devfs: Path = Path("/dev")
    etc: Path = Path("/etc")
    source: Source | None = None
    recorded: bool = False
    state_dir: Path = Path("/var/lib/moptd")
    clock: Clock = field(default_factory=SystemClock)
    publish: Callable[[list[Event]], None] = lambda events: None
    global_options: Mapping[str, Any] = field(default_factory=dict)
    positions: PositionStore | None = None
    xids: XidCounter | None = None  # None: the collector counts on its own
    host_root: Path = Path("/")  # where the host's / is: /host in a container (host_path)

    def host_path(self, path: Path | str) -> Path:
        """Where a host path (/etc/..., /dev/..., /proc/..., /sys/...) lives under this
        context's roots; other paths as they are, or, with a host root (the host's / mounted
        in a container, config ``paths.host_root``), under it. A root set on its own (a test's
        /etc) wins over the host root. Blocking under a host root (it reads symlinks)."""
        p = Path(path)
        for top, root in (
            ("/etc", self.etc),
            ("/dev", self.devfs),
            ("/proc", self.procfs),
            ("/sys", self.sysfs),
        ):
            own_root = self.host_root == _ROOT or root != self.host_root / top[1:]
            if p.is_relative_to(top) and own_root:
                return root / p.relative_to(top)
        if self.host_root == _ROOT or not p.is_absolute():
            return p
        return in_root(self.host_root, p)

    def path_on_host(self, found: Path | str) -> str:
        """The host's name for a path found under the host root (the inverse of host_path
        for what a glob or a directory listing returns there)."""
        p = Path(found)
        if self.host_root != _ROOT and p.is_relative_to(self.host_root):
            return str(_ROOT / p.relative_to(self.host_root))
        return str(p)


_ROOT = Path("/")
MAX_SYMLINKS = 40  # as the kernel's path walk (ELOOP after 40 links)


def in_root(root: Path, path: Path) -> Path:
    """``path`` of the file system mounted at ``root``, as a process chrooted there would
    reach it: an absolute symlink (/var/run -> /run on most hosts) restarts at ``root``, not
    at the container's /, and ``..`` stops at ``root``. A missing component ends the walk:
    the rest is appended as it is (the caller's open then fails as it would on the host)."""
    parts = list(reversed(path.relative_to(_ROOT).parts)) if path.is_absolute() else []
    done: list[str] = []
    links = 0
    while parts:
        part = parts.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, part)
        try:
            target = os.readlink(here)
        except OSError:  # not a link, or absent: either way it is taken as it is
            done.append(part)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            return root.joinpath(*done, part, *reversed(parts))
        link = Path(target)
        if link.is_absolute():
            done = []
            parts.extend(reversed(link.relative_to(_ROOT).parts))
        else:
            parts.extend(reversed(link.parts))
    return root.joinpath(*done)


class Collector:
    name: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    default_interval: ClassVar[float] = 5.0
    default_timeout: ClassVar[float] = 5.0
    options: ClassVar[Mapping[str, Option]] = {}

    def __init__(self, ctx: CollectorContext) -> None:
        self.ctx = ctx
        self._worker: Worker | None = None
        self._pending: concurrent.futures.Future[Any] | None = None

    def option(self, key: str) -> Any:
        if key in self.ctx.options:
            return self.ctx.options[key]
        return self.options[key].default

    async def start(self) -> None:
        """Open long-lived resources (followers, event threads). Default: nothing."""

    async def collect(self) -> Batch:
        raise NotImplementedError

    async def stop(self) -> None:
        """Release resources. Must not block on a hung call."""
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None

    def worker(self) -> Worker:
        if self._worker is None:
            self._worker = Worker(f"moptd-{self.name}")
        return self._worker

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pending is not None and not self._pending.done():
            raise CollectorBusy(f"{self.name}: the previous call is still running")
        # imported here: a replay runs its collectors without an event loop, and asyncio
        # with the ssl it pulls in was 15-20 ms of every replay (BENCHMARKS.md, issue 32)
        import asyncio

        fut = self.worker().submit(fn, *args)
        self._pending = fut
        return await asyncio.wrap_future(fut)
