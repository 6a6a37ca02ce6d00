"""The collectors, one module each, and the one list of them.

A collector is a pure reader over its sources (see ``moptd.collector`` for the contract);
parsers, backends and /proc helpers live in ``moptd.gpu``, ``moptd.proc``, ``moptd.kernel``
and ``moptd.serving``. A new collector is a module here and one entry in ``ALL``.
"""

from __future__ import annotations

from moptd.collector import Collector
from moptd.collectors.container import ContainerCollector
from moptd.collectors.daemon_self import DaemonSelfCollector
from moptd.collectors.driver import DriverCollector
from moptd.collectors.host import HostCollector
from moptd.collectors.kernel_log import KernelLogCollector
from moptd.collectors.nvml import NvmlCollector
from moptd.collectors.serving import ServingCollector
from moptd.collectors.versions import VersionsCollector

ALL: tuple[type[Collector], ...] = (
    ContainerCollector,
    DaemonSelfCollector,
    DriverCollector,
    HostCollector,
    KernelLogCollector,
    NvmlCollector,
    ServingCollector,
    VersionsCollector,
)


def registry() -> dict[str, type[Collector]]:
    """Every collector by its configuration name, in ``ALL``'s order."""
    return {cls.name: cls for cls in ALL}
