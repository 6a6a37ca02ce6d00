"""NVML collector (placeholder until the NVML backend lands): reports unavailable."""

from __future__ import annotations

from moptd.collectors.base import Collector, Unavailable, register
from moptd.observations import Batch


@register
class NvmlCollector(Collector):
    name = "nvml"
    default_interval = 1.0
    default_timeout = 5.0

    async def collect(self) -> Batch:
        raise Unavailable("NVML backend not built yet")
