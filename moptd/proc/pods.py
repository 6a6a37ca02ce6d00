"""A pod's namespace and name from its UID, from what the node itself holds.

A process's cgroup names its pod only by UID (moptd/proc/info.py). The kubelet names each
pod's log directory /var/log/pods/<namespace>_<name>_<uid> (since Kubernetes 1.14,
kubernetes/kubernetes#74441), so listing that directory maps UIDs to names without an API
server or credentials. Namespaces are DNS labels and pod names DNS subdomains, neither
holds an underscore, so a directory name splits at its two underscores. A static pod's
UID is the kubelet's config hash (32 hex digits), not a UUID: both are read.

Bounded: at most MAX_PODS directories are read per scan (a node runs 110 pods by default,
kubelet --max-pods), a name is at most 253 characters (a DNS subdomain's limit), and the
directory is listed again only for an unknown UID and at most every RESCAN_SECONDS.
Blocking: call it from a collector's thread.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_ROOT = "/var/log/pods"
MAX_PODS = 1024
MAX_NAME = 253
RESCAN_SECONDS = 10.0

_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class PodName:
    namespace: str
    name: str


def parse_pod_dir(entry: str) -> tuple[str, PodName] | None:
    """'kube-system_kube-proxy-l52f9_d2b73ed1-5df4-4a18-9595-20798db4f110' -> (uid,
    PodName); None for anything else (the kubelet's older /var/log/pods/<uid>, a file)."""
    parts = entry.split("_")
    if len(parts) != 3:
        return None
    namespace, name, uid = parts
    if not (_NAMESPACE.fullmatch(namespace) and _POD_NAME.fullmatch(name) and _UID.fullmatch(uid)):
        return None
    return uid, PodName(namespace, name)


class PodIndex:
    """UID -> PodName over one pod-log directory, listed again on a miss."""

    def __init__(
        self,
        root: Path | Callable[[], Path],
        *,
        max_pods: int = MAX_PODS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # a callable is resolved at the first scan, on the caller's thread (under a host
        # root, resolving a path reads symlinks)
        self._root = root
        self.max_pods = max_pods
        self.clock = clock
        self.pods: dict[str, PodName] = {}
        self.problem = ""  # why the directory did not read, or was read in part
        self._scanned_at: float | None = None
        self._lock = threading.Lock()  # the NVML collector looks up from each GPU's thread

    @property
    def root(self) -> Path:
        if callable(self._root):
            self._root = self._root()
        return self._root

    def lookup(self, uid: str) -> PodName | None:
        if not uid:
            return None
        uid = uid.lower()
        with self._lock:
            found = self.pods.get(uid)
            if found is not None:
                return found
            now = self.clock()
            if self._scanned_at is None or now - self._scanned_at >= RESCAN_SECONDS:
                self.scan()
                self._scanned_at = now
            return self.pods.get(uid)

    def scan(self) -> None:
        pods: dict[str, PodName] = {}
        problem = ""
        try:
            with os.scandir(self.root) as entries:
                for entry in entries:
                    if len(pods) >= self.max_pods:
                        problem = f"{self.root}: more than {self.max_pods} pods, the rest unnamed"
                        break
                    if len(entry.name) > 2 * MAX_NAME:
                        continue
                    parsed = parse_pod_dir(entry.name)
                    if parsed is not None:
                        pods[parsed[0]] = parsed[1]
        except FileNotFoundError:  # asked for a pod's name, so this is a Kubernetes node
            problem = f"{self.root}: no such directory; pods are named by UID only"
        except OSError as exc:
            problem = f"{self.root}: {exc.strerror or exc}"
        if problem and problem != self.problem:
            log.warning("pod names: %s", problem)
        self.problem = problem
        self.pods = pods
