"""Plain typed GPU readings shared by the live NVML backend, the recorded backend and the
nvidia-smi dump readers, so that all three give the collector the same values.

Every number is already in base units (ratio 0-1, bytes, hertz, watts, joules, celsius,
seconds). ``None`` means the source cannot give the value (NVML NotSupported, nvidia-smi
"N/A"): it is a value, not an error.

Readings are split by cost (see moptd/catalog/gpu.py): ``StaticReading`` (identity,
limits, modes, maxima) is read at start and on a slow refresh, ``FastReading`` every tick,
``SlowReading`` (the NVML calls costing 0.1-3 ms) on a slower cadence, ``ProfileReading``
(NVML's GPM metrics between two consecutive GPM samples) on the profile cadence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

# Label values of gpu.clock_event_time: the cumulative counters NVML keeps (field
# values 74, 76, 269, 270, 271 and nvidia-smi's "Clocks Event Reasons Counters").
CLOCK_EVENT_COUNTERS = (
    "sw_power_cap",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)

# The counters in the "costly" tier: NVML takes 0.6-3 ms of CPU for each (measured on an
# H200, driver 580: field 270 635 µs, 271 619 µs, total energy 2.9 ms; other field values
# about 5 µs), so they are read on their own, slower cadence.
COSTLY_CLOCK_EVENT_COUNTERS = ("hw_thermal_slowdown", "hw_power_brake_slowdown")

# Label values of gpu.nvlink_errors (NVML_NVLINK_ERROR_DL_* and the *_COUNT_TOTAL fields).
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
# Counter label values of gpu.nvlink_link_errors (fields 161-163, NVML_FI_DEV_NVLINK_ERROR_DL_*,
# read per link).
NVLINK_LINK_COUNTERS = ("replay", "recovery", "crc")
NVLINK_MAPPINGS = ("nvlink_link_up", "nvlink_link_errors", "nvlink_link_bytes")


class GpuLost(Exception):
    """NVML says the GPU is gone or unusable (GPU_IS_LOST, UNKNOWN, RESET_REQUIRED)."""

    def __init__(self, index: int, code: int, message: str) -> None:
        super().__init__(f"GPU {index}: {message} (NVML error {code})")
        self.index = index
        self.code = code


class NvmlCallError(Exception):
    """Any other NVML failure of one query (timeout, IRQ issue...): the GPU stays usable."""

    def __init__(self, index: int, code: int, message: str) -> None:
        super().__init__(f"GPU {index}: {message} (NVML error {code})")
        self.index = index
        self.code = code


class BackendUnavailable(Exception):
    """No NVIDIA driver on this host (libnvidia-ml missing, driver not loaded)."""


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """One process with a context on a GPU. used_memory in bytes (None: not reported,
    e.g. without permission or under MIG). The utilisation ratios are NVML's per-process
    sample (nvmlDeviceGetProcessUtilization; nvidia-smi pmon's sm, mem, enc, dec columns
    / 100): None where the GPU cannot give them, 0 for a process NVML reported no sample
    for since the previous read (NVML returns only processes that were busy)."""

    pid: int
    used_memory: float | None = None
    type: str = "C"  # C compute, G graphics, C+G both
    name: str = ""  # what the source calls it (nvidia-smi prints it; NVML does not)
    sm_util: float | None = None  # ratio; pmon "sm" / 100
    mem_util: float | None = None  # ratio; pmon "mem" / 100
    enc_util: float | None = None  # ratio; pmon "enc" / 100
    dec_util: float | None = None  # ratio; pmon "dec" / 100


PROCESS_UTIL_FIELDS = ("sm_util", "mem_util", "enc_util", "dec_util")


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG device (a compute instance in a GPU instance) of a GPU with MIG on: its
    memory is the GPU instance's (nvmlDeviceGetMemoryInfo on the MIG device handle)."""

    gpu_instance: int
    compute_instance: int
    uuid: str = ""  # MIG-...
    memory_total: float | None = None  # bytes
    memory_used: float | None = None  # bytes


# The GPM ratios read per GPU instance under MIG (nvmlGpmMigSampleGet): the label values
# of gpu.mig_activity's "metric".
MIG_ACTIVITY_METRICS = (
    "gr_engine_active",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "fp64_active",
    "fp32_active",
    "fp16_active",
)


@dataclass(frozen=True, slots=True)
class StaticReading:
    """Identity, limits, modes and maxima: read at start and every static_interval."""

    index: int
    uuid: str = ""
    pci_bus_id: str = ""  # normalised: lower-case dddd:bb:dd.f
    name: str = ""
    serial: str = ""
    vbios: str = ""
    driver_version: str = ""
    sm_clock_max: float | None = None  # hertz; --query-gpu=clocks.max.sm
    mem_clock_max: float | None = None  # hertz; clocks.max.memory
    power_limit: float | None = None  # watts; enforced.power.limit
    power_limit_default: float | None = None  # watts; power.default_limit
    pcie_link_gen_max: float | None = None  # pcie.link.gen.max
    pcie_link_width_max: float | None = None  # pcie.link.width.max
    ecc_enabled: float | None = None  # 0/1; ecc.mode.current
    ecc_pending: float | None = None  # 0/1; ecc.mode.pending
    persistence_mode: float | None = None  # 0/1; persistence_mode
    compute_mode: float | None = None  # 0-3; compute_mode
    mig_mode: float | None = None  # 0/1; mig.mode.current


@dataclass(frozen=True, slots=True)
class FastReading:
    """The cheap (about 2 µs per NVML call) dynamic values, read every tick."""

    util: float | None = None  # ratio; utilization.gpu / 100
    mem_util: float | None = None  # ratio; utilization.memory / 100
    memory_total: float | None = None  # bytes; memory.total
    memory_used: float | None = None  # bytes; memory.used
    memory_free: float | None = None  # bytes; memory.free
    memory_reserved: float | None = None  # bytes; memory.reserved
    temperature: float | None = None  # celsius; temperature.gpu
    power: float | None = None  # watts; power.draw
    sm_clock: float | None = None  # hertz; clocks.sm
    mem_clock: float | None = None  # hertz; clocks.mem
    pstate: float | None = None  # 0-15, 32 unknown; pstate
    clock_event_reasons: int | None = None  # bitmask; clocks_event_reasons.active


@dataclass(frozen=True, slots=True)
class SlowReading:
    """The expensive counters (0.1-3 ms per NVML call), read every slow_interval."""

    memory_temperature: float | None = None  # celsius; temperature.memory
    energy: float | None = None  # joules; total_energy_consumption / 1000
    bar1_total: float | None = None  # bytes (no --query-gpu field; -q "BAR1 Memory Usage")
    bar1_used: float | None = None  # bytes
    clock_event_time: Mapping[str, float] = field(default_factory=dict)  # seconds by reason
    pcie_link_gen: float | None = None  # pcie.link.gen.current
    pcie_link_width: float | None = None  # pcie.link.width.current
    pcie_replays: float | None = None  # -q "Replays Since Reset"
    ecc_volatile_corrected: float | None = None  # ecc.errors.corrected.volatile.total
    ecc_volatile_uncorrected: float | None = None  # ecc.errors.uncorrected.volatile.total
    ecc_aggregate_corrected: float | None = None  # ecc.errors.corrected.aggregate.total
    ecc_aggregate_uncorrected: float | None = None  # ecc.errors.uncorrected.aggregate.total
    retired_pages_sbe: float | None = None  # retired_pages.sbe
    retired_pages_dbe: float | None = None  # retired_pages.dbe
    retired_pages_pending: float | None = None  # 0/1; retired_pages.pending
    remapped_rows_correctable: float | None = None  # remapped_rows.correctable
    remapped_rows_uncorrectable: float | None = None  # remapped_rows.uncorrectable
    remap_pending: float | None = None  # 0/1; remapped_rows.pending
    remap_failure: float | None = None  # 0/1; remapped_rows.failure
    nvlink_links_active: float | None = None  # links whose state is up
    nvlink_errors: Mapping[str, float] = field(default_factory=dict)  # summed over links
    # Per link (label "link", the NVML link index as text): state 1 up / 0 down, and from one
    # batched field-values call with scopeId = link the DL error counters (keys
    # "<link>:<counter>", NVLINK_LINK_COUNTERS) and the data bytes ("<link>:tx", "<link>:rx").
    nvlink_link_up: Mapping[str, float] = field(default_factory=dict)
    nvlink_link_errors: Mapping[str, float] = field(default_factory=dict)
    nvlink_link_bytes: Mapping[str, float] = field(default_factory=dict)
    mig_devices: tuple[MigReading, ...] = ()  # MIG on only
    recovery_action: float | None = None  # field 230; -q "GPU Recovery Action"
    processes: tuple[ProcessReading, ...] = ()


@dataclass(frozen=True, slots=True)
class ProfileReading:
    """NVML's GPM metrics over the window between two consecutive GPM samples (Hopper and
    newer). gpm_supported is 0 where the GPU has no GPM (then every metric is None) and
    1 where it has; a metric is None until a second sample gives a window, or when NVML
    refuses that one metric. Ratios are GPM's percentages / 100; throughputs are GPM's
    MiB/s in bytes/s."""

    gpm_supported: float | None = None  # 0/1; nvmlGpmQueryDeviceSupport
    gr_engine_active: float | None = None  # ratio; NVML_GPM_METRIC_GRAPHICS_UTIL
    sm_active: float | None = None  # ratio; NVML_GPM_METRIC_SM_UTIL
    sm_occupancy: float | None = None  # ratio; NVML_GPM_METRIC_SM_OCCUPANCY
    tensor_active: float | None = None  # ratio; NVML_GPM_METRIC_ANY_TENSOR_UTIL
    dram_active: float | None = None  # ratio; NVML_GPM_METRIC_DRAM_BW_UTIL
    fp64_active: float | None = None  # ratio; NVML_GPM_METRIC_FP64_UTIL
    fp32_active: float | None = None  # ratio; NVML_GPM_METRIC_FP32_UTIL
    fp16_active: float | None = None  # ratio; NVML_GPM_METRIC_FP16_UTIL
    pcie_tx_bytes: float | None = None  # bytes/s; NVML_GPM_METRIC_PCIE_TX_PER_SEC
    pcie_rx_bytes: float | None = None  # bytes/s; NVML_GPM_METRIC_PCIE_RX_PER_SEC
    nvlink_tx_bytes: float | None = None  # bytes/s; NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
    nvlink_rx_bytes: float | None = None  # bytes/s; NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    # Under MIG: "<gpu instance>:<metric>" -> ratio, metric one of MIG_ACTIVITY_METRICS.
    mig_activity: Mapping[str, float] = field(default_factory=dict)


class GpuBackend(Protocol):
    """What the NVML collector needs from a source of readings (live NVML or a recording).

    A GPU is named by its NVML index. ``read_*`` may raise GpuLost (that GPU only) or
    NvmlCallError; they may block (the collector calls them on a per-GPU thread).
    """

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def read_static(self, index: int) -> StaticReading: ...
    def read_fast(self, index: int) -> FastReading: ...
    def read_slow(self, index: int) -> SlowReading:
        """Everything of SlowReading except the costly values (see read_costly)."""
        ...

    def read_costly(self, index: int, energy: bool = True) -> SlowReading:
        """Only energy and the COSTLY_CLOCK_EVENT_COUNTERS; other fields None/empty.
        energy=False leaves the total-energy counter (3 ms, the dearest call) unread."""
        ...

    def read_profile(self, index: int) -> ProfileReading:
        """GPM metrics since the previous read_profile of this GPU (one GPM sample and one
        metrics computation per call)."""
        ...

    def wait_xid(self, timeout_ms: int) -> list[tuple[int, int]]:
        """Block up to timeout_ms for Xid events; returns (gpu index, xid) pairs."""
        ...

    def stop_waiting(self) -> None:
        """Make a wait_xid under way return soon, where the source allows it (NVML's
        event wait cannot be interrupted: it returns within its timeout)."""
        ...


def split_costly(r: SlowReading) -> tuple[SlowReading, SlowReading]:
    """(the slow tier's part, the costly tier's part) of one full SlowReading."""
    cheap = {k: v for k, v in r.clock_event_time.items() if k not in COSTLY_CLOCK_EVENT_COUNTERS}
    dear = {k: v for k, v in r.clock_event_time.items() if k in COSTLY_CLOCK_EVENT_COUNTERS}
    return (
        dataclasses.replace(r, energy=None, clock_event_time=cheap),
        SlowReading(energy=r.energy, clock_event_time=dear),
    )


def merge_costly(slow: SlowReading | None, costly: SlowReading | None) -> SlowReading | None:
    """One SlowReading from the two tiers' latest parts."""
    if costly is None:
        return slow
    if slow is None:
        return costly
    return dataclasses.replace(
        slow,
        energy=costly.energy,
        clock_event_time={**slow.clock_event_time, **costly.clock_event_time},
    )


R = TypeVar("R", StaticReading, FastReading, SlowReading, ProfileReading)
AnyReading = StaticReading | FastReading | SlowReading | ProfileReading


def reading_to_dict(reading: AnyReading) -> dict[str, Any]:
    """A JSON-ready dict; None fields are left out to keep recordings small."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(reading):
        v = getattr(reading, f.name)
        if v is None or (isinstance(v, (dict, tuple)) and not v):
            continue
        if f.name == "mig_devices":
            v = [dataclasses.asdict(m) for m in v]
        elif f.name == "processes":
            v = [
                {
                    k: x
                    for k, x in dataclasses.asdict(p).items()
                    if x is not None or k not in PROCESS_UTIL_FIELDS
                }
                for p in v
            ]
        elif isinstance(v, Mapping):
            v = dict(v)
        out[f.name] = v
    return out


def reading_from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
    """Inverse of reading_to_dict; unknown keys are ignored, wrong types raise ValueError."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        v = data[f.name]
        if f.name == "processes":
            v = tuple(
                ProcessReading(
                    int(p["pid"]),
                    _opt_float(p.get("used_memory")),
                    str(p.get("type", "C")),
                    str(p.get("name", "")),
                    *(_opt_float(p.get(k)) for k in PROCESS_UTIL_FIELDS),
                )
                for p in v
            )
        elif f.name == "mig_devices":
            v = tuple(
                MigReading(
                    int(m["gpu_instance"]),
                    int(m["compute_instance"]),
                    str(m.get("uuid", "")),
                    _opt_float(m.get("memory_total")),
                    _opt_float(m.get("memory_used")),
                )
                for m in v
            )
        elif f.name in ("clock_event_time", "nvlink_errors", "mig_activity", *NVLINK_MAPPINGS):
            v = {str(k): float(x) for k, x in dict(v).items()}
        elif f.name in ("index", "clock_event_reasons"):
            v = None if v is None else int(v)
        elif f.name in ("uuid", "pci_bus_id", "name", "serial", "vbios", "driver_version"):
            v = str(v)
        else:
            v = _opt_float(v)
        kwargs[f.name] = v
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(str(exc)) from exc


def _opt_float(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {v!r}")
    return float(v)
