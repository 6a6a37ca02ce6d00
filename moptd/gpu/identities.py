"""Which GPU is where: NVML index and UUID by PCI bus id, and the user-space driver
version, for attributing kernel lines and for the driver collector. Where NVML is absent,
the GPUs under /proc/driver/nvidia/gpus in bus order (NVML's default enumeration)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from moptd.proc.pci import pci_key

log = logging.getLogger(__name__)


def gpu_identities(procfs: Path) -> tuple[dict[str, int], dict[str, str], str]:
    """(index by PCI bus id, UUID by bus id, user-space driver version) from NVML; where
    NVML is absent, the GPUs under /proc/driver/nvidia/gpus in bus order (NVML's default
    enumeration order) and no version."""
    # imported here: the configuration imports this module (a collector's), and `moptd
    # explain` must not load pynvml for that (BENCHMARKS.md, issue 31)
    from moptd.gpu.backend import NvmlBackend

    try:
        backend = NvmlBackend()
        backend.init()
    except Exception as exc:  # noqa: BLE001 - no NVML here: fall back to /proc
        log.debug("NVML unavailable for GPU identities: %s", exc)
        return (*_proc_gpus(procfs), "")
    try:
        index: dict[str, int] = {}
        uuid: dict[str, str] = {}
        for i in range(backend.device_count()):
            try:
                s = backend.read_static(i)
            except Exception:  # one lost GPU must not hide the others
                log.debug("NVML static read of GPU %d failed", i, exc_info=True)
                continue
            if s.pci_bus_id:
                bus = pci_key(s.pci_bus_id)
                index[bus] = i
                uuid[bus] = s.uuid
        return index, uuid, backend.driver_version()
    finally:
        backend.shutdown()


def _proc_gpus(procfs: Path) -> tuple[dict[str, int], dict[str, str]]:
    base = procfs / "driver/nvidia/gpus"
    try:
        buses = sorted(pci_key(p.name) for p in base.iterdir())
    except OSError:
        return {}, {}
    uuids: dict[str, str] = {}
    for p in base.iterdir():
        try:
            info = (p / "information").read_text()
        except OSError:
            continue
        m = re.search(r"GPU UUID:\s*(\S+)", info)
        if m:
            uuids[pci_key(p.name)] = m.group(1)
    return {b: i for i, b in enumerate(buses)}, uuids
