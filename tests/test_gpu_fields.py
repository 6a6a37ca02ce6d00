"""A GPU field is declared twice only: as a reading field (moptd/gpu/readings.py) and as its
signal (moptd/catalog/gpu.py). The sample builder derives its lists from both; these tests
hold the two declarations in step, so a field added to one and not the other fails here
instead of going missing from /metrics in silence."""

from __future__ import annotations

import dataclasses

from moptd.catalog import CATALOG
from moptd.gpu.batch import gpu_batch
from moptd.gpu.readings import (
    FastReading,
    MigReading,
    ProcessReading,
    ProfileReading,
    SlowReading,
    StaticReading,
)

# Reading fields that are not a signal of their own name, and the signal each one feeds.
SHAPED = {
    "index": "(the subject)",
    "uuid": "gpu.info attribute",
    "pci_bus_id": "gpu.info",
    "name": "gpu.info",
    "serial": "gpu.info",
    "vbios": "gpu.info",
    "driver_version": "gpu.info",
    "clock_event_reasons": "gpu.clock_event_reasons",
    "retired_pages_sbe": "gpu.retired_pages",
    "retired_pages_dbe": "gpu.retired_pages",
    "processes": "process.gpu_memory",
    "mig_devices": "gpu.mig_memory_used, gpu.mig_memory_total",
}
# gpu.* signals the collectors add beside a reading: the NVML collector's own (lost, last
# error, Xid events) and the kernel-log collector's Xid counts.
COLLECTOR_SIGNALS = {
    "gpu.lost",
    "gpu.nvml_error",
    "gpu.nvml_init_error",
    "gpu.xid_event",
    "gpu.xid_errors",
    "gpu.xid_last_time",
}


def _full(cls: type, **extra: object) -> object:
    """A reading with every field set to a value of its shape."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.name in extra:
            values[f.name] = extra[f.name]
        elif f.name in ("clock_event_time", "nvlink_errors", "nvlink_link_up"):
            values[f.name] = {"a": 1.0}
        elif f.name in ("nvlink_link_errors", "nvlink_link_bytes", "mig_activity"):
            values[f.name] = {"0:a": 1.0}
        elif f.name == "mig_devices":
            values[f.name] = (MigReading(1, 0, "MIG-x", 2.0, 1.0),)
        elif f.name == "processes":
            values[f.name] = (
                ProcessReading(
                    pid=42,
                    used_memory=1.0,
                    name="python",
                    sm_util=0.5,
                    mem_util=0.25,
                    enc_util=0.0,
                    dec_util=0.0,
                ),
            )
        elif f.default is None:
            values[f.name] = 1
        else:
            values[f.name] = "x"
    return cls(**values)


def test_every_reading_field_is_a_signal_or_shaped():
    for cls in (StaticReading, FastReading, SlowReading, ProfileReading):
        for f in dataclasses.fields(cls):
            assert f"gpu.{f.name}" in CATALOG or f.name in SHAPED, (
                f"{cls.__name__}.{f.name} has no signal gpu.{f.name} in moptd/catalog/gpu.py"
            )


def test_a_full_reading_yields_every_gpu_signal_of_the_catalog():
    static = _full(StaticReading, index=0)
    fast = _full(FastReading, clock_event_reasons=0x8)
    slow = _full(SlowReading)
    profile = _full(ProfileReading)
    batch = gpu_batch(
        static,  # type: ignore[arg-type]
        fast,  # type: ignore[arg-type]
        slow,  # type: ignore[arg-type]
        ages={"fast": 0.1},
        profile=profile,  # type: ignore[arg-type]
    )
    produced = {s.signal for s in batch.samples}
    wanted = {
        name for name in CATALOG if name.startswith(("gpu.", "process.gpu_"))
    } - COLLECTOR_SIGNALS
    assert wanted - produced == set(), "catalog signals no reading produces"
    assert produced - set(CATALOG) == set(), "samples of signals the catalog does not declare"
