"""The live host as the host, driver and container collectors' Source (moptd.collector):
statvfs, os.cpu_count, uname, the tools on PATH, /dev, NVML. A bundle's counterpart is
moptd.bundle.sources."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from moptd.collector import CollectorContext, DiskUsage, GpuIdentities, Source
from moptd.gpu.identities import gpu_identities

log = logging.getLogger(__name__)

TOOL_TIMEOUT = 10.0
_DEV_NODE_PREFIX = "nvidia"


class LiveSource:
    def disk_usage(self, path: Path) -> DiskUsage | None:
        try:
            st = os.statvfs(path)
        except OSError:
            return None  # a watched path that does not exist yet is not an error
        return DiskUsage(
            size=st.f_blocks * st.f_frsize,
            used=(st.f_blocks - st.f_bfree) * st.f_frsize,
            available=st.f_bavail * st.f_frsize,
        )

    def cpu_count(self) -> int | None:
        return os.cpu_count() or 0

    def kernel_release(self) -> str | None:
        return os.uname().release

    def run(self, argv: Sequence[str], search_path: str | None = None) -> str | None:
        exe = shutil.which(argv[0], path=search_path) if search_path is not None else argv[0]
        if exe is None:
            return None
        try:
            res = subprocess.run(
                [exe, *argv[1:]], capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("%s: %s", argv[0], exc)
            return None
        if res.returncode != 0:
            log.debug("%s exited %d: %s", argv[0], res.returncode, res.stderr.strip()[:200])
            return None
        return res.stdout

    def engine_present(
        self, engine: str, binaries: Sequence[str], socket: Path, search_path: str | None
    ) -> bool | None:
        return any(shutil.which(x, path=search_path) for x in binaries) or _exists(socket)

    def device_nodes(self, dev: Path) -> Mapping[str, os.stat_result | None] | None:
        """Every entry named nvidia* (the collector picks the device names); None as the
        value of one that cannot be stat'ed."""
        try:
            names = sorted(p.name for p in dev.iterdir() if p.name.startswith(_DEV_NODE_PREFIX))
        except OSError:
            return {}
        return {name: _stat(dev / name) for name in names}

    def stat(self, path: Path) -> os.stat_result | None:
        return _stat(path)

    def gpu_identities(self, procfs: Path) -> GpuIdentities:
        index, uuid, version = gpu_identities(procfs)
        return GpuIdentities(index, uuid, version)


def _exists(path: Path) -> bool:
    try:
        path.stat()
    except PermissionError:
        # behind a directory moptd may not search (/run/podman is root's, 0700): something
        # may be there; asking the socket tells (moptd.collectors.container)
        return True
    except OSError:
        return False
    return True


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


LIVE = LiveSource()


def source_of(ctx: CollectorContext) -> Source:
    return ctx.source if ctx.source is not None else LIVE
