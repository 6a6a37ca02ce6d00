"""The live NVML backend: the only module that imports pynvml (nvidia-ml-py).

Every query goes through ``query()``: NotSupported (and NO_PERMISSION, FUNCTION_NOT_FOUND,
logged once per function) becomes None; GPU_IS_LOST, UNKNOWN and RESET_REQUIRED raise
GpuLost; other NVML errors raise NvmlCallError. Reads are split into three tiers by cost
(measured on an H200, driver 580): most queries cost about 2 µs; BAR1, the PCIe replay
counter, ECC mode, MIG mode and field values 130-155 µs; each max-clock query about
1.3 ms; total energy about 3 ms. Every call is read-only: nothing here changes a setting.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from moptd.gpu.readings import (
    CLOCK_EVENT_COUNTERS,
    COSTLY_CLOCK_EVENT_COUNTERS,
    MIG_ACTIVITY_METRICS,
    NVLINK_COUNTERS,
    NVLINK_LINK_COUNTERS,
    BackendUnavailable,
    FastReading,
    GpuLost,
    MigReading,
    NvmlCallError,
    ProcessReading,
    ProfileReading,
    SlowReading,
    StaticReading,
)
from moptd.proc.pci import pci_key

log = logging.getLogger(__name__)
T = TypeVar("T")

MIB = 1024 * 1024
MHZ = 1e6

_AS_NONE = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }
)
_LOST = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_RESET_REQUIRED,
    }
)
_NO_DRIVER = frozenset(
    {
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    }
)

# Field values read in one nvmlDeviceGetFieldValues call per slow pass (about 150 µs for
# the whole batch, against 2-150 µs for each single query they replace).
_F = pynvml
SLOW_FIELDS: dict[str, int] = {
    "memory_temperature": _F.NVML_FI_DEV_MEMORY_TEMP,
    "pcie_replays": _F.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    "ecc_volatile_corrected": _F.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    "ecc_volatile_uncorrected": _F.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    "ecc_aggregate_corrected": _F.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    "ecc_aggregate_uncorrected": _F.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    "retired_pages_sbe": _F.NVML_FI_DEV_RETIRED_SBE,
    "retired_pages_dbe": _F.NVML_FI_DEV_RETIRED_DBE,
    "retired_pages_pending": _F.NVML_FI_DEV_RETIRED_PENDING,
    "remapped_rows_correctable": _F.NVML_FI_DEV_REMAPPED_COR,
    "remapped_rows_uncorrectable": _F.NVML_FI_DEV_REMAPPED_UNC,
    "remap_pending": _F.NVML_FI_DEV_REMAPPED_PENDING,
    "remap_failure": _F.NVML_FI_DEV_REMAPPED_FAILURE,
    "recovery_action": 230,  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (driver 570+)
    # Cumulative clock-event time in ns (nvidia-smi prints these as µs).
    "cet:sw_power_cap": _F.NVML_FI_DEV_PERF_POLICY_POWER,
    "cet:sync_boost": _F.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST,
    "cet:sw_thermal_slowdown": 269,
    "nvl:crc_flit": _F.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    "nvl:crc_data": _F.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    "nvl:replay": _F.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    "nvl:recovery": _F.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    "nvl:ecc_data": _F.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL,
}
# The costly tier: about 0.6 ms each (against 5 µs for the fields above).
COSTLY_FIELDS: dict[str, int] = {
    "cet:hw_thermal_slowdown": 270,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    "cet:hw_power_brake_slowdown": 271,  # ..._HW_POWER_BRAKE_SLOWDOWN
}
# Per-link NVLink fields, read in one nvmlDeviceGetFieldValues call with scopeId = link
# (the probe: 180 per-link fields cost 273 µs, 18 NvLinkState calls 213 µs).
NVLINK_LINK_FIELDS: dict[str, int] = {
    "tx": _F.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,  # KiB since the driver loaded
    "rx": _F.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    "replay": _F.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    "recovery": _F.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    "crc": _F.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
}
KIB = 1024.0
assert set(NVLINK_LINK_FIELDS) - {"tx", "rx"} == set(NVLINK_LINK_COUNTERS)

# The GPM metrics moptd exports: (ProfileReading field, metric id, scale to base units).
# GPM gives percentages (0-100) and MiB/s.
GPM_METRICS: tuple[tuple[str, int, float], ...] = (
    ("gr_engine_active", _F.NVML_GPM_METRIC_GRAPHICS_UTIL, 0.01),
    ("sm_active", _F.NVML_GPM_METRIC_SM_UTIL, 0.01),
    ("sm_occupancy", _F.NVML_GPM_METRIC_SM_OCCUPANCY, 0.01),
    ("tensor_active", _F.NVML_GPM_METRIC_ANY_TENSOR_UTIL, 0.01),
    ("dram_active", _F.NVML_GPM_METRIC_DRAM_BW_UTIL, 0.01),
    ("fp64_active", _F.NVML_GPM_METRIC_FP64_UTIL, 0.01),
    ("fp32_active", _F.NVML_GPM_METRIC_FP32_UTIL, 0.01),
    ("fp16_active", _F.NVML_GPM_METRIC_FP16_UTIL, 0.01),
    ("pcie_tx_bytes", _F.NVML_GPM_METRIC_PCIE_TX_PER_SEC, float(MIB)),
    ("pcie_rx_bytes", _F.NVML_GPM_METRIC_PCIE_RX_PER_SEC, float(MIB)),
    ("nvlink_tx_bytes", _F.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, float(MIB)),
    ("nvlink_rx_bytes", _F.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, float(MIB)),
)

assert {k[4:] for k in (*SLOW_FIELDS, *COSTLY_FIELDS) if k.startswith("cet:")} == set(
    CLOCK_EVENT_COUNTERS
)
assert {k[4:] for k in COSTLY_FIELDS} == set(COSTLY_CLOCK_EVENT_COUNTERS)
assert {k[4:] for k in SLOW_FIELDS if k.startswith("nvl:")} == set(NVLINK_COUNTERS)


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def field_value(fv: Any) -> float | None:
    """One c_nvmlFieldValue_t -> number, or None when its own return code is an error."""
    if fv.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    t = fv.valueType
    u = fv.value
    if t == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(u.dVal)
    if t == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(u.uiVal)
    if t == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(u.ulVal)
    if t == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return float(u.ullVal)
    if t == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(u.sllVal)
    if t == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return float(u.siVal)
    if t == pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return float(u.usVal)
    return None


class NvmlBackend:
    """Live readings through NVML. Thread-safe per GPU: the collector gives each GPU its
    own thread, and NVML itself is thread-safe."""

    def __init__(self) -> None:
        self._handles: dict[int, Any] = {}
        self._quiet: set[str] = set()
        self._quiet_lock = threading.Lock()
        self._nvlink: dict[int, int] = {}  # index -> number of links that answered
        self._event_set: Any = None
        self._driver = ""
        self._gpm: dict[int, _Gpm] = {}  # index -> GPM state (samples kept between reads)
        self._util_seen: dict[int, int] = {}  # index -> newest process-utilisation timestamp
        self._mig_on: dict[int, bool] = {}  # index -> MIG mode, from the last static read
        self._mig_gis: dict[int, tuple[int, ...]] = {}  # index -> GPU instances, last slow read
        self._gpm_mig: dict[tuple[int, int], _Gpm] = {}  # (index, GPU instance) -> GPM state

    # --- the error policy -------------------------------------------------------
    def query(self, index: int, fn: Callable[..., T], *args: Any) -> T | None:
        """Call one NVML function; see the module docstring for what errors become."""
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            if code in _AS_NONE:
                self._log_once(fn, code)
                return None
            if code in _LOST:
                raise GpuLost(index, code, str(exc)) from None
            raise NvmlCallError(index, code, f"{fn.__name__}: {exc}") from None

    def _log_once(self, fn: Callable[..., Any], code: int) -> None:
        name = getattr(fn, "__name__", repr(fn))
        if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return  # a value, not news
        with self._quiet_lock:
            if name in self._quiet:
                return
            self._quiet.add(name)
        log.info("NVML %s: %s; the value is reported as absent", name, pynvml.nvmlErrorString(code))

    # --- lifecycle ----------------------------------------------------------------
    def init(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if int(exc.value) in _NO_DRIVER:
                raise BackendUnavailable(str(exc)) from None
            raise NvmlCallError(-1, int(exc.value), f"nvmlInit: {exc}") from None
        self._driver = _text(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            self._handles[i] = pynvml.nvmlDeviceGetHandleByIndex(i)

    def shutdown(self) -> None:
        for gpm in (*self._gpm.values(), *self._gpm_mig.values()):
            gpm.free()
        self._gpm.clear()
        self._gpm_mig.clear()
        if self._event_set is not None:
            try:
                pynvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError:
                log.debug("nvmlEventSetFree failed", exc_info=True)
            self._event_set = None
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            log.debug("nvmlShutdown failed", exc_info=True)

    def driver_version(self) -> str:
        return self._driver

    def device_count(self) -> int:
        return len(self._handles)

    def _h(self, index: int) -> Any:
        try:
            return self._handles[index]
        except KeyError:
            raise NvmlCallError(index, pynvml.NVML_ERROR_INVALID_ARGUMENT, "no such GPU") from None

    # --- tiers ----------------------------------------------------------------------
    def read_static(self, index: int) -> StaticReading:
        """Identity, maxima, limits and modes. Costs about 3 ms (the max-clock queries)."""
        h = self._h(index)
        q = self.query
        pci = q(index, pynvml.nvmlDeviceGetPciInfo, h)
        ecc = q(index, pynvml.nvmlDeviceGetEccMode, h)
        mig = q(index, pynvml.nvmlDeviceGetMigMode, h)
        sm_max = q(index, pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
        mem_max = q(index, pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM)
        self._mig_on[index] = mig is not None and bool(mig[0])
        limit = q(index, pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        default = q(index, pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h)
        return StaticReading(
            index=index,
            uuid=_text(q(index, pynvml.nvmlDeviceGetUUID, h) or ""),
            pci_bus_id=pci_key(_text(pci.busId)) if pci is not None else "",
            name=_text(q(index, pynvml.nvmlDeviceGetName, h) or ""),
            serial=_text(q(index, pynvml.nvmlDeviceGetSerial, h) or ""),
            vbios=_text(q(index, pynvml.nvmlDeviceGetVbiosVersion, h) or ""),
            driver_version=self._driver,
            sm_clock_max=None if sm_max is None else sm_max * MHZ,
            mem_clock_max=None if mem_max is None else mem_max * MHZ,
            power_limit=None if limit is None else limit / 1000.0,
            power_limit_default=None if default is None else default / 1000.0,
            pcie_link_gen_max=_num(q(index, pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)),
            pcie_link_width_max=_num(q(index, pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)),
            ecc_enabled=None if ecc is None else float(bool(ecc[0])),
            ecc_pending=None if ecc is None else float(bool(ecc[1])),
            persistence_mode=_num(q(index, pynvml.nvmlDeviceGetPersistenceMode, h)),
            compute_mode=_num(q(index, pynvml.nvmlDeviceGetComputeMode, h)),
            mig_mode=None if mig is None else float(bool(mig[0])),
        )

    def read_fast(self, index: int) -> FastReading:
        """Seven cheap queries (about 2 µs each in the driver)."""
        h = self._h(index)
        q = self.query
        util = q(index, pynvml.nvmlDeviceGetUtilizationRates, h)
        mem = q(index, pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2)
        power = q(index, pynvml.nvmlDeviceGetPowerUsage, h)
        sm = q(index, pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        memclk = q(index, pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        reasons = q(index, pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        return FastReading(
            util=None if util is None else util.gpu / 100.0,
            mem_util=None if util is None else util.memory / 100.0,
            memory_total=None if mem is None else float(mem.total),
            memory_used=None if mem is None else float(mem.used),
            memory_free=None if mem is None else float(mem.free),
            memory_reserved=None if mem is None else float(mem.reserved),
            temperature=_num(
                q(index, pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            ),
            power=None if power is None else power / 1000.0,
            sm_clock=None if sm is None else sm * MHZ,
            mem_clock=None if memclk is None else memclk * MHZ,
            pstate=_num(q(index, pynvml.nvmlDeviceGetPerformanceState, h)),
            clock_event_reasons=None if reasons is None else int(reasons),
        )

    def read_slow(self, index: int) -> SlowReading:
        """Field values in one batch (about 150 µs), BAR1 (130 µs), PCIe link, NVLink
        state, processes. Energy and two clock-event counters are read_costly's."""
        h = self._h(index)
        q = self.query
        keys = list(SLOW_FIELDS)
        raw = q(index, pynvml.nvmlDeviceGetFieldValues, h, [SLOW_FIELDS[k] for k in keys])
        vals: dict[str, float | None] = {}
        for k, fv in zip(keys, raw or [], strict=False):
            vals[k] = field_value(fv)
        bar1 = q(index, pynvml.nvmlDeviceGetBAR1MemoryInfo, h)
        cet = {k[4:]: v / 1e9 for k, v in vals.items() if k.startswith("cet:") and v is not None}
        nvl = {k[4:]: v for k, v in vals.items() if k.startswith("nvl:") and v is not None}
        link_up = self._nvlink_states(index, h)
        links_up = float(sum(link_up.values())) if link_up else None
        link_errors, link_bytes = self._nvlink_links(index, h, link_up)
        return SlowReading(
            memory_temperature=vals.get("memory_temperature"),
            bar1_total=None if bar1 is None else float(bar1.bar1Total),
            bar1_used=None if bar1 is None else float(bar1.bar1Used),
            clock_event_time=cet,
            pcie_link_gen=_num(q(index, pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)),
            pcie_link_width=_num(q(index, pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)),
            pcie_replays=vals.get("pcie_replays"),
            ecc_volatile_corrected=vals.get("ecc_volatile_corrected"),
            ecc_volatile_uncorrected=vals.get("ecc_volatile_uncorrected"),
            ecc_aggregate_corrected=vals.get("ecc_aggregate_corrected"),
            ecc_aggregate_uncorrected=vals.get("ecc_aggregate_uncorrected"),
            retired_pages_sbe=vals.get("retired_pages_sbe"),
            retired_pages_dbe=vals.get("retired_pages_dbe"),
            retired_pages_pending=vals.get("retired_pages_pending"),
            remapped_rows_correctable=vals.get("remapped_rows_correctable"),
            remapped_rows_uncorrectable=vals.get("remapped_rows_uncorrectable"),
            remap_pending=vals.get("remap_pending"),
            remap_failure=vals.get("remap_failure"),
            nvlink_links_active=links_up,
            nvlink_errors=nvl if links_up else {},
            nvlink_link_up=link_up,
            nvlink_link_errors=link_errors,
            nvlink_link_bytes=link_bytes,
            mig_devices=self._mig_devices(index, h),
            recovery_action=vals.get("recovery_action"),
            processes=self._processes(index, h),
        )

    def read_costly(self, index: int, energy: bool = True) -> SlowReading:
        """Total energy (about 3 ms, p99 16 ms; only with ``energy``) and the HW thermal /
        power-brake clock-event counters (0.6 ms for both: one field-values call costs what
        one of them costs alone), for the slower "costly" cadence."""
        h = self._h(index)
        q = self.query
        total = q(index, pynvml.nvmlDeviceGetTotalEnergyConsumption, h) if energy else None
        keys = list(COSTLY_FIELDS)
        raw = q(index, pynvml.nvmlDeviceGetFieldValues, h, [COSTLY_FIELDS[k] for k in keys])
        cet: dict[str, float] = {}
        for k, fv in zip(keys, raw or [], strict=False):
            v = field_value(fv)
            if v is not None:
                cet[k[4:]] = v / 1e9
        return SlowReading(energy=None if total is None else total / 1000.0, clock_event_time=cet)

    def _nvlink_states(self, index: int, h: Any) -> dict[str, float]:
        """Link index -> 1 up / 0 down; empty on a GPU without NVLink (learned once: the
        first refusal)."""
        known = self._nvlink.get(index)
        if known == 0:
            return {}
        states: dict[str, float] = {}
        for link in range(known or pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = pynvml.nvmlDeviceGetNvLinkState(h, link)
            except pynvml.NVMLError as exc:
                if int(exc.value) in _LOST:
                    raise GpuLost(index, int(exc.value), str(exc)) from None
                break  # NotSupported / InvalidArgument: no such link
            states[str(link)] = 1.0 if state == pynvml.NVML_FEATURE_ENABLED else 0.0
        self._nvlink[index] = len(states)
        return states

    def _nvlink_links(
        self, index: int, h: Any, links: dict[str, float]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """(errors "<link>:<counter>", data bytes "<link>:tx|rx") of the links that are up,
        in one field-values call; a refused field is left out."""
        if not any(links.values()):
            return {}, {}
        up = [int(k) for k, v in links.items() if v]
        keys = [(link, name) for link in up for name in NVLINK_LINK_FIELDS]
        ids = [(NVLINK_LINK_FIELDS[name], link) for link, name in keys]
        raw = self.query(index, pynvml.nvmlDeviceGetFieldValues, h, ids)
        errors: dict[str, float] = {}
        data: dict[str, float] = {}
        for (link, name), fv in zip(keys, raw or [], strict=False):
            v = field_value(fv)
            if v is None:
                continue
            if name in ("tx", "rx"):
                data[f"{link}:{name}"] = v * KIB
            else:
                errors[f"{link}:{name}"] = v
        return errors, data

    def _processes(self, index: int, h: Any) -> tuple[ProcessReading, ...]:
        found: dict[int, ProcessReading] = {}
        for fn, kind in (
            (pynvml.nvmlDeviceGetComputeRunningProcesses, "C"),
            (pynvml.nvmlDeviceGetGraphicsRunningProcesses, "G"),
        ):
            for p in self.query(index, fn, h) or []:
                used = p.usedGpuMemory
                mem = None if used is None else float(used)
                prev = found.get(p.pid)
                if prev is not None:
                    found[p.pid] = ProcessReading(p.pid, prev.used_memory, "C+G")
                else:
                    found[p.pid] = ProcessReading(int(p.pid), mem, kind)
        if not found:
            return ()
        util = self._process_util(index, h)
        if util is not None:
            for pid, p in found.items():
                sm, mem_util, enc, dec = util.get(pid, (0.0, 0.0, 0.0, 0.0))
                found[pid] = dataclasses.replace(
                    p, sm_util=sm, mem_util=mem_util, enc_util=enc, dec_util=dec
                )
        return tuple(found[pid] for pid in sorted(found))

    def _process_util(
        self, index: int, h: Any
    ) -> dict[int, tuple[float, float, float, float]] | None:
        """pid -> (sm, mem, enc, dec) ratios of NVML's newest per-process samples since the
        previous call (lastSeenTimeStamp), or None where the GPU cannot give them. NVML
        answers NOT_FOUND when no process was busy since then: every ratio is 0."""
        seen = self._util_seen.get(index, 0)
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, seen)
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            if code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS):
                return {}  # pynvml raises the first call's SUCCESS when no sample is due
            if code in _AS_NONE:
                self._log_once(pynvml.nvmlDeviceGetProcessUtilization, code)
                return None
            if code in _LOST:
                raise GpuLost(index, code, str(exc)) from None
            raise NvmlCallError(index, code, f"nvmlDeviceGetProcessUtilization: {exc}") from None
        newest: dict[int, Any] = {}
        for s in samples:
            prev = newest.get(int(s.pid))
            if prev is None or s.timeStamp > prev.timeStamp:
                newest[int(s.pid)] = s
            seen = max(seen, int(s.timeStamp))
        self._util_seen[index] = seen
        return {
            pid: (
                _ratio(s.smUtil),
                _ratio(s.memUtil),
                _ratio(s.encUtil),
                _ratio(s.decUtil),
            )
            for pid, s in newest.items()
        }

    # --- the profile tier (GPM) ------------------------------------------------------
    def read_profile(self, index: int) -> ProfileReading:
        """One GPM sample; the exported metrics over the window since the previous one,
        and under MIG the same per GPU instance. A GPU without GPM reads gpm_supported = 0
        (learned once; None when NVML will not say, e.g. without permission)."""
        h = self._h(index)
        gpm = self._gpm.get(index)
        if gpm is None:
            support = self.query(index, pynvml.nvmlGpmQueryDeviceSupport, h)
            supported = support is not None and bool(support.isSupportedDevice)
            gpm = self._gpm[index] = _Gpm(supported)
            gpm.answer = None if support is None else float(supported)
        if not gpm.supported:
            return ProfileReading(gpm_supported=gpm.answer)
        values = self._gpm_window(index, gpm, pynvml.nvmlGpmSampleGet, h)
        return ProfileReading(
            gpm_supported=1.0, mig_activity=self._mig_activity(index, h), **values
        )

    def _gpm_window(
        self, index: int, gpm: _Gpm, sample: Callable[..., Any], *args: Any
    ) -> dict[str, float | None]:
        """Take one sample with ``sample(*args, buffer)``; the metrics between it and the
        previous one, or {} while there is no window (the first sample, a refused call)."""
        cur = gpm.take_spare()
        if self.query(index, sample, *args, cur) is None:
            gpm.spare = cur
            return {}
        prev, gpm.prev = gpm.prev, cur
        if prev is None:
            return {}
        gpm.spare = prev
        mg = gpm.request(prev, cur)
        if self.query(index, pynvml.nvmlGpmMetricsGet, mg) is None:
            return {}
        return _metric_values(mg)

    # --- MIG ------------------------------------------------------------------------
    def _mig_devices(self, index: int, h: Any) -> tuple[MigReading, ...]:
        """The MIG devices of a GPU with MIG on (its mode from the last static read): one
        nvmlDeviceGetMigDeviceHandleByIndex per slot, then its instance ids and memory."""
        if not self._mig_on.get(index):
            self._mig_gis.pop(index, None)
            return ()
        count = self._mig_query(index, pynvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0
        out: list[MigReading] = []
        for slot in range(int(count)):
            mh = self._mig_query(index, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, slot)
            if mh is None:
                continue  # an empty slot: NOT_FOUND
            gi = self._mig_query(index, pynvml.nvmlDeviceGetGpuInstanceId, mh)
            ci = self._mig_query(index, pynvml.nvmlDeviceGetComputeInstanceId, mh)
            if gi is None or ci is None:
                continue
            mem = self._mig_query(index, pynvml.nvmlDeviceGetMemoryInfo, mh)
            uuid = self._mig_query(index, pynvml.nvmlDeviceGetUUID, mh)
            out.append(
                MigReading(
                    int(gi),
                    int(ci),
                    _text(uuid or ""),
                    None if mem is None else float(mem.total),
                    None if mem is None else float(mem.used),
                )
            )
        self._mig_gis[index] = tuple(sorted({m.gpu_instance for m in out}))
        return tuple(out)

    def _mig_query(self, index: int, fn: Callable[..., T], *args: Any) -> T | None:
        """query() for the MIG calls: NOT_FOUND and INVALID_ARGUMENT (an empty slot, an
        instance destroyed meanwhile) are None too, and a failed MIG call is logged once
        and None rather than costing the whole slow tier; a lost GPU still raises."""
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            if code in _LOST:
                raise GpuLost(index, code, str(exc)) from None
            if code not in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                self._log_once(fn, code)
            return None

    def _mig_activity(self, index: int, h: Any) -> dict[str, float]:
        """GPM ratios per GPU instance (nvmlGpmMigSampleGet), for the instances the last
        slow read found; "<gpu instance>:<metric>"."""
        out: dict[str, float] = {}
        gis = self._mig_gis.get(index, ())
        for key in [k for k in self._gpm_mig if k[0] == index and k[1] not in gis]:
            self._gpm_mig.pop(key).free()  # an instance destroyed since
        for gi in gis:
            gpm = self._gpm_mig.setdefault((index, gi), _Gpm(True))
            try:
                values = self._gpm_window(index, gpm, pynvml.nvmlGpmMigSampleGet, h, gi)
            except NvmlCallError as exc:  # one instance's refusal costs only its values
                log.debug("nvml: GPU %d instance %d: %s", index, gi, exc)
                continue
            for name, v in values.items():
                if v is not None and name in MIG_ACTIVITY_METRICS:
                    out[f"{gi}:{name}"] = v
        return out

    # --- for bench/nvml_cost.py -------------------------------------------------------------
    def calls(self, index: int) -> list[tuple[str, str, Callable[[], Any]]]:
        """(tier, name, zero-argument call) for every NVML query the tiers make, so the
        per-call cost table can be measured without importing pynvml elsewhere."""
        h = self._h(index)
        p = pynvml
        fields = list(SLOW_FIELDS.values())
        gpm = _GpmPair(h)
        link_ids = [(fid, link) for link in range(18) for fid in NVLINK_LINK_FIELDS.values()]
        return [
            ("static", "nvmlDeviceGetUUID", lambda: p.nvmlDeviceGetUUID(h)),
            ("static", "nvmlDeviceGetPciInfo", lambda: p.nvmlDeviceGetPciInfo(h)),
            ("static", "nvmlDeviceGetName", lambda: p.nvmlDeviceGetName(h)),
            ("static", "nvmlDeviceGetSerial", lambda: p.nvmlDeviceGetSerial(h)),
            ("static", "nvmlDeviceGetVbiosVersion", lambda: p.nvmlDeviceGetVbiosVersion(h)),
            (
                "static",
                "nvmlDeviceGetMaxClockInfo(SM)",
                lambda: p.nvmlDeviceGetMaxClockInfo(h, p.NVML_CLOCK_SM),
            ),
            (
                "static",
                "nvmlDeviceGetMaxClockInfo(MEM)",
                lambda: p.nvmlDeviceGetMaxClockInfo(h, p.NVML_CLOCK_MEM),
            ),
            (
                "static",
                "nvmlDeviceGetEnforcedPowerLimit",
                lambda: p.nvmlDeviceGetEnforcedPowerLimit(h),
            ),
            (
                "static",
                "nvmlDeviceGetPowerManagementDefaultLimit",
                lambda: p.nvmlDeviceGetPowerManagementDefaultLimit(h),
            ),
            (
                "static",
                "nvmlDeviceGetMaxPcieLinkGeneration",
                lambda: p.nvmlDeviceGetMaxPcieLinkGeneration(h),
            ),
            ("static", "nvmlDeviceGetMaxPcieLinkWidth", lambda: p.nvmlDeviceGetMaxPcieLinkWidth(h)),
            ("static", "nvmlDeviceGetEccMode", lambda: p.nvmlDeviceGetEccMode(h)),
            ("static", "nvmlDeviceGetPersistenceMode", lambda: p.nvmlDeviceGetPersistenceMode(h)),
            ("static", "nvmlDeviceGetComputeMode", lambda: p.nvmlDeviceGetComputeMode(h)),
            ("static", "nvmlDeviceGetMigMode", lambda: p.nvmlDeviceGetMigMode(h)),
            ("fast", "nvmlDeviceGetUtilizationRates", lambda: p.nvmlDeviceGetUtilizationRates(h)),
            (
                "fast",
                "nvmlDeviceGetMemoryInfo(v2)",
                lambda: p.nvmlDeviceGetMemoryInfo(h, p.nvmlMemory_v2),
            ),
            (
                "fast",
                "nvmlDeviceGetTemperature",
                lambda: p.nvmlDeviceGetTemperature(h, p.NVML_TEMPERATURE_GPU),
            ),
            ("fast", "nvmlDeviceGetPowerUsage", lambda: p.nvmlDeviceGetPowerUsage(h)),
            (
                "fast",
                "nvmlDeviceGetClockInfo(SM)",
                lambda: p.nvmlDeviceGetClockInfo(h, p.NVML_CLOCK_SM),
            ),
            (
                "fast",
                "nvmlDeviceGetClockInfo(MEM)",
                lambda: p.nvmlDeviceGetClockInfo(h, p.NVML_CLOCK_MEM),
            ),
            ("fast", "nvmlDeviceGetPerformanceState", lambda: p.nvmlDeviceGetPerformanceState(h)),
            (
                "fast",
                "nvmlDeviceGetCurrentClocksEventReasons",
                lambda: p.nvmlDeviceGetCurrentClocksEventReasons(h),
            ),
            (
                "slow",
                f"nvmlDeviceGetFieldValues({len(fields)} fields)",
                lambda: p.nvmlDeviceGetFieldValues(h, fields),
            ),
            ("slow", "nvmlDeviceGetBAR1MemoryInfo", lambda: p.nvmlDeviceGetBAR1MemoryInfo(h)),
            (
                "slow",
                "nvmlDeviceGetTotalEnergyConsumption",
                lambda: p.nvmlDeviceGetTotalEnergyConsumption(h),
            ),
            (
                "slow",
                "nvmlDeviceGetCurrPcieLinkGeneration",
                lambda: p.nvmlDeviceGetCurrPcieLinkGeneration(h),
            ),
            ("slow", "nvmlDeviceGetCurrPcieLinkWidth", lambda: p.nvmlDeviceGetCurrPcieLinkWidth(h)),
            ("slow", "nvmlDeviceGetNvLinkState(0)", lambda: p.nvmlDeviceGetNvLinkState(h, 0)),
            (
                "slow",
                f"nvmlDeviceGetFieldValues(per-link NVLink, {len(link_ids)} fields)",
                lambda: p.nvmlDeviceGetFieldValues(h, link_ids),
            ),
            (
                "slow",
                "nvmlDeviceGetComputeRunningProcesses",
                lambda: p.nvmlDeviceGetComputeRunningProcesses(h),
            ),
            (
                "slow",
                "nvmlDeviceGetGraphicsRunningProcesses",
                lambda: p.nvmlDeviceGetGraphicsRunningProcesses(h),
            ),
            (
                "slow",
                "nvmlDeviceGetProcessUtilization",
                _allow_not_found(lambda: p.nvmlDeviceGetProcessUtilization(h, 0)),
            ),
            (
                "costly",
                f"nvmlDeviceGetFieldValues({'+'.join(map(str, COSTLY_FIELDS.values()))})",
                lambda: p.nvmlDeviceGetFieldValues(h, list(COSTLY_FIELDS.values())),
            ),
            ("profile", "nvmlGpmSampleGet", lambda: p.nvmlGpmSampleGet(h, gpm.sample())),
            (
                "profile",
                f"nvmlGpmMetricsGet({len(GPM_METRICS)} metrics)",
                lambda: p.nvmlGpmMetricsGet(gpm.request()),
            ),
            ("ref", "nvmlDeviceGetPcieReplayCounter", lambda: p.nvmlDeviceGetPcieReplayCounter(h)),
            ("ref", "nvmlDeviceGetRemappedRows", lambda: p.nvmlDeviceGetRemappedRows(h)),
            *[
                ("field", f"field {fid} {name}", _one_field(h, fid))
                for name, fid in [
                    *SLOW_FIELDS.items(),
                    *COSTLY_FIELDS.items(),
                    ("total_energy_consumption", p.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION),
                    ("energy", p.NVML_FI_DEV_ENERGY),
                ]
            ],
        ]

    # --- Xid events -----------------------------------------------------------------
    def wait_xid(self, timeout_ms: int) -> list[tuple[int, int]]:
        """Blocks up to timeout_ms in nvmlEventSetWait; (gpu index, xid) pairs."""
        if self._event_set is None:
            self._event_set = pynvml.nvmlEventSetCreate()
            for index, h in self._handles.items():
                try:
                    supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
                    mask = supported & pynvml.nvmlEventTypeXidCriticalError
                    if mask:
                        pynvml.nvmlDeviceRegisterEvents(h, mask, self._event_set)
                except pynvml.NVMLError as exc:
                    log.info("GPU %d: Xid events not available: %s", index, exc)
        try:
            data = pynvml.nvmlEventSetWait(self._event_set, timeout_ms)
        except pynvml.NVMLError as exc:
            if int(exc.value) == pynvml.NVML_ERROR_TIMEOUT:
                return []
            raise NvmlCallError(-1, int(exc.value), f"nvmlEventSetWait: {exc}") from None
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return []
        return [(self._index_of(data.device), int(data.eventData))]

    def stop_waiting(self) -> None:
        """nvmlEventSetWait cannot be interrupted; it returns within its timeout."""

    def _index_of(self, device: Any) -> int:
        try:
            return int(pynvml.nvmlDeviceGetIndex(device))
        except pynvml.NVMLError:
            return -1


class _Gpm:
    """One GPU's GPM state: the previous sample, a spare buffer and the request struct,
    allocated once and reused (each read swaps the two samples)."""

    def __init__(self, supported: bool) -> None:
        self.supported = supported
        self.answer: float | None = float(supported)  # gpm_supported as reported
        self.prev: Any = None
        self.spare: Any = None
        self._request: Any = None

    def take_spare(self) -> Any:
        spare, self.spare = self.spare, None
        return spare if spare is not None else pynvml.nvmlGpmSampleAlloc()

    def request(self, first: Any, second: Any) -> Any:
        mg = self._request
        if mg is None:
            mg = self._request = pynvml.c_nvmlGpmMetricsGet_t()
            mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            for i, (_name, mid, _scale) in enumerate(GPM_METRICS):
                mg.metrics[i].metricId = mid
        mg.sample1, mg.sample2 = first, second
        return mg

    def free(self) -> None:
        for sample in (self.prev, self.spare):
            if sample is not None:
                try:
                    pynvml.nvmlGpmSampleFree(sample)
                except pynvml.NVMLError:
                    log.debug("nvmlGpmSampleFree failed", exc_info=True)
        self.prev = self.spare = None


class _GpmPair:
    """Two GPM samples taken once, for timing nvmlGpmSampleGet and nvmlGpmMetricsGet
    alone (bench/nvml_cost.py; the samples live as long as the process). A GPU without
    GPM makes both calls raise NotSupported."""

    def __init__(self, h: Any) -> None:
        self._h = h
        self._gpm: _Gpm | None = None

    def _ready(self) -> _Gpm:
        if self._gpm is None:
            gpm = _Gpm(True)
            gpm.prev, gpm.spare = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(self._h, gpm.prev)
            pynvml.nvmlGpmSampleGet(self._h, gpm.spare)
            self._gpm = gpm
        return self._gpm

    def sample(self) -> Any:
        return self._ready().spare

    def request(self) -> Any:
        gpm = self._ready()
        return gpm.request(gpm.prev, gpm.spare)


def _allow_not_found(fn: Callable[[], Any]) -> Callable[[], Any]:
    """NOT_FOUND (no process was busy) is an answer of the call, not a failure."""

    def call() -> Any:
        try:
            return fn()
        except pynvml.NVMLError as exc:
            if int(exc.value) != pynvml.NVML_ERROR_NOT_FOUND:
                raise
            return None

    return call


def _metric_values(mg: Any) -> dict[str, float | None]:
    """GPM_METRICS' values from a computed request, in base units; None where refused."""
    values: dict[str, float | None] = {}
    for i, (name, _mid, scale) in enumerate(GPM_METRICS):
        m = mg.metrics[i]
        v = float(m.value) if m.nvmlReturn == pynvml.NVML_SUCCESS else math.nan
        values[name] = v * scale if math.isfinite(v) and v >= 0 else None
    return values


def _ratio(pct: Any) -> float:
    """A per-process sample's % -> ratio (the arithmetic of util.gpu / 100.0)."""
    return float(pct) / 100.0


def _one_field(h: Any, fid: int) -> Callable[[], Any]:
    return lambda: pynvml.nvmlDeviceGetFieldValues(h, [fid])


def _num(v: Any) -> float | None:
    return None if v is None else float(v)
