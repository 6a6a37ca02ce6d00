"""Host collector: memory, swap, CPU, load, watched file systems, vm.swappiness, WSL2.

Reads /proc through the context's procfs root, and disk usage and the CPU count through
its Source: the live host, or a bundle's host/ files in replay (moptd.bundle), so a bundle
and a live host give the same samples from the same evidence.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, NamedTuple

from moptd.collector import Collector, CollectorContext, Option, Source, in_root
from moptd.host_source import source_of
from moptd.observations import NODE, Batch, labels_of
from moptd.proc import procfs, wsl
from moptd.proc.files import OpenFiles

MAX_RELEASE = 128  # uname's release field is at most 64 characters (struct utsname)

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_MEMINFO_KEYS = frozenset({"MemTotal", "MemAvailable", "SwapTotal", "SwapFree"})
_VMSTAT_KEYS = frozenset({"pswpin", "pswpout"})
# Live, the facts that change rarely or never while the host runs (the CPU count, the kernel
# release, whether it is WSL2, vm.swappiness) are re-read once a minute, not every run: with
# 8 GPUs at 1 s they were a sixth of the host collector's CPU (BENCHMARKS.md, "Issue 32: the
# daemon's own CPU"). WSL2's library checks still run every run. A replay reads everything
# every run: each step's files are its own evidence.
FACTS_INTERVAL = 60.0


class _Facts(NamedTuple):
    read_at: float  # monotonic
    cpus: int | None
    swappiness: int | None
    release: str  # the kernel's
    wsl2: bool


class HostCollector(Collector):
    name = "host"
    default_interval = 5.0
    default_timeout = 5.0
    options: ClassVar[Mapping[str, Option]] = {
        "model_dirs": Option(list, [], "Model directories whose file systems are watched."),
        "wsl_lib_dir": Option(
            str,
            wsl.WSL_LIB_DIR,
            "On WSL2: where the Windows driver's libraries are mounted (libcuda.so.1).",
        ),
        "guest_lib_dirs": Option(
            list,
            list(wsl.GUEST_LIB_DIRS),
            "On WSL2: library directories where a Linux NVIDIA driver installed in the guest "
            "would put its libraries.",
        ),
    }
    # The guest's library directories hold thousands of files: listed once a minute at most.
    GUEST_LIBS_INTERVAL = 60.0

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._prev_cpu: tuple[float, float] | None = None
        self._files = OpenFiles()
        self._guest_libs: tuple[float, int] | None = None  # (monotonic time, count)
        self._facts: _Facts | None = None
        self._watched: list[Path] | None = None  # live: the options do not change
        # /proc's files, made once per root (building the Paths was a tenth of a run)
        self._paths: tuple[Path, Path, Path, Path, Path] | None = None

    def watched_paths(self) -> list[Path]:
        paths = [Path(p) for p in self.ctx.global_options.get("watch_paths", ())]
        paths.append(self.ctx.state_dir)
        paths.extend(Path(p) for p in self.option("model_dirs"))
        seen: dict[str, Path] = {}
        for p in paths:
            seen.setdefault(str(p), p)
        return list(seen.values())

    async def collect(self) -> Batch:
        return await self.blocking(self.read)

    async def stop(self) -> None:
        await super().stop()
        self.close()

    def close(self) -> None:
        """Close the descriptors kept open (``read`` without the daemon's stop)."""
        self._files.close()

    def _optional(self, path: Path) -> str:
        try:
            return self._files.read(path)
        except OSError:
            return ""

    def _required(self, path: Path) -> str:
        """A file a live host always has; in a recording, absent evidence."""
        if self.ctx.recorded:
            return self._optional(path)
        return self._files.read(path)

    def read(self) -> Batch:
        """One pass over the sources (blocking)."""
        proc = self.ctx.procfs
        source = source_of(self.ctx)
        b = Batch()
        if self._paths is None or self._paths[0] is not proc:
            self._paths = (proc, proc / "meminfo", proc / "vmstat", proc / "stat", proc / "loadavg")
        _, meminfo, vmstat_path, stat_path, loadavg = self._paths
        mem = procfs.parse_meminfo(self._required(meminfo), _MEMINFO_KEYS)
        total = mem.get("MemTotal")
        avail = mem.get("MemAvailable")
        if total:
            b.add("node.memory_total", NODE, float(total))
        if avail is not None:
            b.add("node.memory_available", NODE, float(avail))
            if total:
                b.add("node.memory_available_ratio", NODE, avail / total)
        if "SwapTotal" in mem:
            b.add("node.swap_total", NODE, float(mem["SwapTotal"]))
            b.add("node.swap_used", NODE, float(mem["SwapTotal"] - mem.get("SwapFree", 0)))
        vmstat = procfs.parse_keyvalue_ints(self._optional(vmstat_path), _VMSTAT_KEYS)
        for key, signal in (("pswpin", "node.swap_in"), ("pswpout", "node.swap_out")):
            if key in vmstat:
                b.add(signal, NODE, float(vmstat[key] * PAGE_SIZE))
        stat = self._required(stat_path)
        cpu = procfs.parse_cpu_times(stat)
        if cpu is not None:
            if self._prev_cpu is not None and cpu[1] > self._prev_cpu[1]:
                busy = (cpu[0] - self._prev_cpu[0]) / (cpu[1] - self._prev_cpu[1])
                b.add("node.cpu_util", NODE, min(1.0, max(0.0, busy)))
            self._prev_cpu = cpu
        btime = procfs.parse_btime(stat)
        if btime is not None:
            b.add("node.boot_time", NODE, float(btime))
        facts = self._facts_now(proc, source)
        if facts.cpus is not None:
            b.add("node.cpu_count", NODE, float(facts.cpus))
        load = procfs.parse_loadavg(self._optional(loadavg))
        if load is not None:
            for name, value in zip(("node.load1", "node.load5", "node.load15"), load, strict=True):
                b.add(name, NODE, value)
        if facts.swappiness is not None:
            b.add("node.swappiness", NODE, float(facts.swappiness))
        if self._watched is None or self.ctx.recorded:
            self._watched = self.watched_paths()
        for path in self._watched:
            # the file system of a watched path of the host, under paths.host_root (not the
            # collector's own /dev or /etc roots: /dev/shm is a file system, not a device)
            root = self.ctx.host_root
            usage = source.disk_usage(path if root == Path("/") else in_root(root, path))
            if usage is None:
                continue  # a watched path that does not exist yet is not an error
            size, used, avail_b = usage.size, usage.used, usage.available
            lab = labels_of(path=str(path))
            b.add("node.disk_total", NODE, float(size), lab)
            b.add("node.disk_available", NODE, float(avail_b), lab)
            if size:
                # df's Use%: used over what users could have (used + available)
                b.add(
                    "node.disk_used_ratio",
                    NODE,
                    used / (used + avail_b) if used + avail_b else 0.0,
                    lab,
                )
        self._wsl(b, facts.release, facts.wsl2)
        return b

    def _facts_now(self, proc: Path, source: Source) -> _Facts:
        """The rarely changing facts: read again each run in a replay, live once a minute."""
        now = time.monotonic()
        facts = self._facts
        if facts is None or self.ctx.recorded or now - facts.read_at >= FACTS_INTERVAL:
            facts = self._facts = _Facts(
                now,
                source.cpu_count(),
                procfs.parse_int(self._optional(proc / "sys/vm/swappiness")),
                *self._kernel(proc),
            )
        return facts

    def _kernel(self, proc: Path) -> tuple[str, bool]:
        """The kernel's release, and whether this is WSL2 (the release says so, or /dev/dxg,
        the GPU paravirtualisation device, is there)."""
        release = self._optional(proc / "sys/kernel/osrelease").strip()
        if not release:
            release = wsl.release_of(self._optional(proc / "version"))
        dxg = not self.ctx.recorded and os.path.exists(self.ctx.devfs / "dxg")
        return release, wsl.wsl_generation(release) == 2 or dxg

    def _wsl(self, b: Batch, release: str, wsl2: bool) -> None:
        """node.kernel_release, node.wsl2, and on WSL2 the Windows driver's library mount
        and any Linux driver libraries installed in the guest (docs/wsl.md)."""
        if release:  # for moptd_software_version_info: a fleet compares hosts by kernel
            b.add("node.kernel_release", NODE, 1.0, labels_of(release=release[:MAX_RELEASE]))
        if not wsl2:
            if release:
                b.add("node.wsl2", NODE, 0.0)
            return
        b.add("node.wsl2", NODE, 1.0)
        # A recording holds a directory only where it names one (moptd.bundle.sources lays
        # host/wsl_lib.txt and host/guest_libs.txt out as directories): the defaults would
        # read the replaying machine's own.
        recorded = self.ctx.recorded
        if not recorded or "wsl_lib_dir" in self.ctx.options:
            lib_dir = self.ctx.host_path(str(self.option("wsl_lib_dir")))
            b.add("node.wsl_lib_present", NODE, float(wsl.has_cuda_stub(_names(lib_dir))))
        if recorded and "guest_lib_dirs" not in self.ctx.options:
            return
        now = time.monotonic()
        if self._guest_libs is None or now - self._guest_libs[0] >= self.GUEST_LIBS_INTERVAL:
            count = 0
            for d in self.option("guest_lib_dirs"):
                count += len(wsl.guest_driver_libraries(_names(self.ctx.host_path(str(d)))))
            self._guest_libs = (now, count)
        b.add("node.wsl_guest_driver_libs", NODE, float(self._guest_libs[1]))


def _names(directory: Path) -> list[str]:
    """The names in a directory; none when it is absent or unreadable."""
    try:
        return os.listdir(directory)
    except OSError:
        return []
