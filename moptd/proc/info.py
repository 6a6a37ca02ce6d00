"""Who a process is: name, command line, user, and the container or unit it runs in.

Used to attribute NVML compute processes and kernel-log ``pid=`` fields. Reads
/proc/PID/{comm,cmdline,status,cgroup} under a configurable procfs root; a process that
has exited (or that the sandbox hides) yields None, never an exception.
"""

from __future__ import annotations

import pwd
import re
from dataclasses import dataclass
from pathlib import Path

# A container id is 64 hex digits in every runtime's cgroup naming:
#   docker:     /docker/<id>  or  /system.slice/docker-<id>.scope
#   containerd: /kubepods/.../cri-containerd-<id>.scope  or  .../<id>
#   CRI-O:      /kubepods.slice/.../crio-<id>.scope
#   podman:     /machine.slice/libpod-<id>.scope  or  /libpod_parent/libpod-<id>
_CONTAINER = re.compile(
    r"(?:(?P<rt>docker|cri-containerd|crio|libpod)[-/])?(?P<id>[0-9a-f]{64})(?:\.scope)?"
)
# A pod's UID: a UUID (its dashes underscores under the systemd cgroup driver), or for a
# static pod the kubelet's config hash, 32 hex digits (kubepods-burstable-pod<hash>.slice).
_POD = re.compile(
    r"pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?![0-9a-f])"
)
_UNIT = re.compile(r"/([^/]+\.(?:service|scope))$")
_RUNTIMES = {
    "docker": "docker",
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "libpod": "podman",
}


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    name: str = ""
    cmdline: str = ""
    user: str = ""
    uid: int | None = None
    container_id: str = ""
    container_runtime: str = ""
    pod_uid: str = ""
    unit: str = ""
    pod: str = ""  # the pod's name and namespace, where moptd/proc/pods.py knows them
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    container_id: str = ""
    container_runtime: str = ""
    pod_uid: str = ""
    unit: str = ""


def parse_cgroup(text: str) -> CgroupInfo:
    """/proc/PID/cgroup (v1 or v2) -> container id, runtime, pod uid, systemd unit."""
    container = runtime = pod = unit = ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if not container:
            for m in _CONTAINER.finditer(path):
                container = m.group("id")
                runtime = _RUNTIMES.get(m.group("rt") or "", "")
                if not runtime:
                    runtime = (
                        "kubernetes"
                        if "kubepods" in path
                        else "docker"
                        if "/docker" in path
                        else ""
                    )
        if not pod:
            pm = _POD.search(path)
            if pm:
                pod = pm.group("uid").replace("_", "-")
        if not unit:
            um = _UNIT.search(path)
            if um and not _CONTAINER.fullmatch(um.group(1)):
                unit = um.group(1)
    return CgroupInfo(container, runtime, pod, unit)


def _read(path: Path, limit: int = 65536) -> str | None:
    try:
        with path.open("rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def process_info(pid: int, procfs: Path = Path("/proc")) -> ProcessInfo | None:
    base = procfs / str(pid)
    comm = _read(base / "comm")
    if comm is None:
        return None
    cmdline = (_read(base / "cmdline") or "").replace("\0", " ").strip()
    uid: int | None = None
    for line in (_read(base / "status") or "").splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            if len(parts) > 1 and parts[1].isdigit():
                uid = int(parts[1])
            break
    user = ""
    if uid is not None:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    cg = parse_cgroup(_read(base / "cgroup") or "")
    return ProcessInfo(
        pid,
        comm.strip(),
        cmdline,
        user,
        uid,
        cg.container_id,
        cg.container_runtime,
        cg.pod_uid,
        cg.unit,
    )
