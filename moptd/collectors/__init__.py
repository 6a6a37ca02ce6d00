"""The collectors, one module each, and the one list of them.

A collector is a pure reader over its sources (see ``moptd.collector`` for the contract);
parsers, backends and /proc helpers live in ``moptd.gpu``, ``moptd.proc``, ``moptd.kernel``
and ``moptd.serving``. A new collector is a module here and one entry in ``ALL``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moptd.collector import Collector

# Imported when first asked for, not with the package: `moptd.collectors.driver` (a parser
# the bundle reader uses) must not pull in every collector and aiohttp with it, which cost
# `moptd explain --bundle` a quarter of a second on each call.
_NAMES = (
    ("container", "ContainerCollector"),
    ("daemon_journals", "DaemonJournalCollector"),
    ("daemon_self", "DaemonSelfCollector"),
    ("driver", "DriverCollector"),
    ("host", "HostCollector"),
    ("kernel_log", "KernelLogCollector"),
    ("nvml", "NvmlCollector"),
    ("serving", "ServingCollector"),
    ("versions", "VersionsCollector"),
)


def all_collectors() -> tuple[type[Collector], ...]:
    import importlib

    return tuple(
        getattr(importlib.import_module(f"{__name__}.{module}"), cls) for module, cls in _NAMES
    )


def __getattr__(name: str) -> object:
    if name == "ALL":
        return all_collectors()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def registry() -> dict[str, type[Collector]]:
    """Every collector by its configuration name, in ``ALL``'s order."""
    return {cls.name: cls for cls in all_collectors()}
