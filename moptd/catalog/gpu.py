"""Per-GPU signals from NVML (subject ``gpu:<index>``) and per-process GPU memory.

Cadence, stated in each HELP so scrapers know what they read: "fast" values are read
every tick (NVML calls of about 2 µs), "slow" ones every ``slow_interval`` (5 s; field
values, BAR1, PCIe: 5-150 µs each), "costly" ones every ``costly_interval`` (10 s; total
energy about 3 ms, two clock-event counters about 0.6 ms for both; energy itself only every
``energy_interval``, 60 s), "profile" ones (NVML GPM,
Hopper and newer) every ``profile_interval`` (5 s; averaged over the interval between two
GPM samples; 1-3 ms), "static" ones at start and every ``static_interval`` (300 s; max
clocks about 1.4 ms each). Costs measured on an H200,
driver 580 (bench/nvml_cost.py). moptd_gpu_sample_age_seconds gives the age of each tier.
"""

from moptd.catalog.spec import SignalSpec

# nvmlClocksEventReason* bits (nvml.h; docs/reference/gpu-health-anchors.md §c1): the label
# values of gpu.clock_event_active, the names rules use for the bits (HW_SLOWDOWN, ...) and
# the table `moptd status` decodes the bitmask with. Declared here once.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

_G = "gpu"


def _g(
    name: str,
    kind: str,
    unit: str,
    help: str,
    metric: str | None,
    dcgm: str = "",
    labels: tuple[str, ...] = (),
) -> SignalSpec:
    return SignalSpec(f"gpu.{name}", kind, unit, help, _G, metric, labels, dcgm)  # type: ignore[arg-type]


SIGNALS = [
    _g(
        "info",
        "info",
        "",
        "GPU identity; value 1. Join on gpu and uuid.",
        "moptd_gpu_info",
        labels=("name", "pci_bus_id", "serial", "vbios", "driver_version"),
    ),
    _g(
        "lost",
        "gauge",
        "bool",
        "1 when NVML reports the GPU lost or in an unknown state (GPU_IS_LOST, UNKNOWN, "
        "RESET_REQUIRED); its other metrics are then absent.",
        "moptd_gpu_lost",
    ),
    _g(
        "nvml_error",
        "gauge",
        "",
        "NVML return code of the last failed per-GPU query (0 when the last pass had none).",
        "moptd_gpu_nvml_last_error_code",
    ),
    SignalSpec(
        "gpu.nvml_init_error",
        "gauge",
        "",
        "NVML return code of nvmlInit (9 driver not loaded, 18 driver/library version "
        "mismatch; 0 when NVML initialised): 0 from the NVML collector while it reads GPUs; "
        "in a bundle, read from nvidia-smi's output or its own failure messages.",
        "node",
        None,
    ),
    _g(
        "sample_age",
        "gauge",
        "seconds",
        "Age of the values of one cadence tier (fast, slow, costly, energy, profile, "
        "static) at the last "
        "collection.",
        "moptd_gpu_sample_age_seconds",
        labels=("tier",),
    ),
    # --- fast tier ---
    _g(
        "util",
        "gauge",
        "ratio",
        "GPU (SM) busy ratio over the driver's sample period; fast tier.",
        "moptd_gpu_utilization_ratio",
        "DCGM_FI_DEV_GPU_UTIL",
    ),
    _g(
        "mem_util",
        "gauge",
        "ratio",
        "Memory controller busy ratio; fast tier.",
        "moptd_gpu_memory_utilization_ratio",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
    ),
    _g(
        "memory_total",
        "gauge",
        "bytes",
        "Framebuffer memory size; fast tier.",
        "moptd_gpu_memory_total_bytes",
    ),
    _g(
        "memory_used",
        "gauge",
        "bytes",
        "Framebuffer memory in use; fast tier.",
        "moptd_gpu_memory_used_bytes",
        "DCGM_FI_DEV_FB_USED",
    ),
    _g(
        "memory_free",
        "gauge",
        "bytes",
        "Framebuffer memory free; fast tier.",
        "moptd_gpu_memory_free_bytes",
        "DCGM_FI_DEV_FB_FREE",
    ),
    _g(
        "memory_reserved",
        "gauge",
        "bytes",
        "Framebuffer memory reserved by the driver; fast tier.",
        "moptd_gpu_memory_reserved_bytes",
        "DCGM_FI_DEV_FB_RESERVED",
    ),
    _g(
        "temperature",
        "gauge",
        "celsius",
        "GPU core temperature; fast tier.",
        "moptd_gpu_temperature_celsius",
        "DCGM_FI_DEV_GPU_TEMP",
    ),
    _g(
        "power",
        "gauge",
        "watts",
        "Power draw; fast tier. Prefer rate() of the energy counter.",
        "moptd_gpu_power_usage_watts",
        "DCGM_FI_DEV_POWER_USAGE",
    ),
    _g(
        "sm_clock",
        "gauge",
        "hertz",
        "SM clock; fast tier.",
        "moptd_gpu_sm_clock_hertz",
        "DCGM_FI_DEV_SM_CLOCK",
    ),
    _g(
        "mem_clock",
        "gauge",
        "hertz",
        "Memory clock; fast tier.",
        "moptd_gpu_memory_clock_hertz",
        "DCGM_FI_DEV_MEM_CLOCK",
    ),
    _g(
        "pstate",
        "gauge",
        "",
        "Performance state (0 = P0, fastest; 32 = unknown); fast tier.",
        "moptd_gpu_performance_state",
    ),
    _g(
        "clock_event_reasons",
        "gauge",
        "",
        "Bitmask of active clock-event (throttle) reasons, nvmlClocksEventReason*; fast tier.",
        "moptd_gpu_clock_event_reasons",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    ),
    _g(
        "clock_event_active",
        "gauge",
        "bool",
        "1 while the named clock-event reason is active (decoded from the bitmask); fast tier.",
        "moptd_gpu_clock_event_active",
        labels=("reason",),
    ),
    # --- slow tier ---
    _g(
        "memory_temperature",
        "gauge",
        "celsius",
        "HBM temperature; slow tier.",
        "moptd_gpu_memory_temperature_celsius",
        "DCGM_FI_DEV_MEMORY_TEMP",
    ),
    _g(
        "energy",
        "counter",
        "joules",
        "Energy used since the driver loaded; energy tier (60 s).",
        "moptd_gpu_energy_joules_total",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    ),
    _g(
        "bar1_total",
        "gauge",
        "bytes",
        "BAR1 aperture size; slow tier.",
        "moptd_gpu_bar1_total_bytes",
    ),
    _g(
        "bar1_used",
        "gauge",
        "bytes",
        "BAR1 aperture in use; slow tier.",
        "moptd_gpu_bar1_used_bytes",
        "DCGM_FI_DEV_BAR1_USED",
    ),
    _g(
        "clock_event_time",
        "counter",
        "seconds",
        "Cumulative time clocks were held down for the named reason (NVML field values; they "
        "catch throttling between samples); slow tier, but hw_thermal_slowdown and "
        "hw_power_brake_slowdown costly tier (10 s).",
        "moptd_gpu_clock_event_seconds_total",
        "DCGM_FI_DEV_POWER_VIOLATION (and kin)",
        labels=("reason",),
    ),
    _g(
        "pcie_link_gen",
        "gauge",
        "",
        "Current PCIe link generation (drops at idle by design); slow tier.",
        "moptd_gpu_pcie_link_generation",
        "DCGM_FI_DEV_PCIE_LINK_GEN",
    ),
    _g(
        "pcie_link_width",
        "gauge",
        "",
        "Current PCIe link width (lanes); slow tier.",
        "moptd_gpu_pcie_link_width",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    ),
    _g(
        "pcie_replays",
        "counter",
        "count",
        "PCIe replay counter; slow tier.",
        "moptd_gpu_pcie_replays_total",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    ),
    _g(
        "ecc_volatile_corrected",
        "counter",
        "count",
        "Corrected ECC errors since the driver loaded; slow tier.",
        "moptd_gpu_ecc_volatile_corrected_errors_total",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    ),
    _g(
        "ecc_volatile_uncorrected",
        "counter",
        "count",
        "Uncorrected ECC errors since the driver loaded; slow tier.",
        "moptd_gpu_ecc_volatile_uncorrected_errors_total",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ),
    _g(
        "ecc_aggregate_corrected",
        "counter",
        "count",
        "Corrected ECC errors over the board's life; slow tier.",
        "moptd_gpu_ecc_aggregate_corrected_errors_total",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    ),
    _g(
        "ecc_aggregate_uncorrected",
        "counter",
        "count",
        "Uncorrected ECC errors over the board's life; slow tier.",
        "moptd_gpu_ecc_aggregate_uncorrected_errors_total",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    ),
    _g(
        "retired_pages",
        "gauge",
        "count",
        "Retired framebuffer pages by cause (single_bit, double_bit; pre-Ampere page "
        "retirement); slow tier.",
        "moptd_gpu_retired_pages",
        "DCGM_FI_DEV_RETIRED_SBE / _DBE",
        labels=("cause",),
    ),
    _g(
        "retired_pages_pending",
        "gauge",
        "bool",
        "1 when a page retirement waits for the next driver reload; slow tier.",
        "moptd_gpu_retired_pages_pending",
        "DCGM_FI_DEV_RETIRED_PENDING",
    ),
    _g(
        "remapped_rows_correctable",
        "gauge",
        "count",
        "Rows remapped because of correctable errors (Ampere+); slow tier.",
        "moptd_gpu_remapped_rows_correctable",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    ),
    _g(
        "remapped_rows_uncorrectable",
        "gauge",
        "count",
        "Rows remapped because of uncorrectable errors (Ampere+); slow tier.",
        "moptd_gpu_remapped_rows_uncorrectable",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    ),
    _g(
        "remap_pending",
        "gauge",
        "bool",
        "1 when a row remap waits for a GPU reset; slow tier.",
        "moptd_gpu_row_remap_pending",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
    ),
    _g(
        "remap_failure",
        "gauge",
        "bool",
        "1 when a row remap has ever failed; slow tier.",
        "moptd_gpu_row_remap_failure",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    ),
    _g(
        "nvlink_links_active",
        "gauge",
        "count",
        "NVLink links up; slow tier.",
        "moptd_gpu_nvlink_links_active",
    ),
    _g(
        "nvlink_errors",
        "counter",
        "count",
        "NVLink error counters summed over links, by counter (replay, recovery, crc_flit, "
        "crc_data, ecc_data); slow tier.",
        "moptd_gpu_nvlink_errors_total",
        "DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL",
        labels=("counter",),
    ),
    _g(
        "nvlink_link_up",
        "gauge",
        "bool",
        "1 when the NVLink link is up, 0 when down, by link (nvmlDeviceGetNvLinkState); absent "
        "on a GPU without NVLink; slow tier.",
        "moptd_gpu_nvlink_link_up",
        "DCGM_FI_DEV_NVLINK_LINK_STATUS (nvidia-smi nvlink -s)",
        labels=("link",),
    ),
    _g(
        "nvlink_link_errors",
        "counter",
        "count",
        "NVLink data-link error counters by link and counter (replay, recovery, crc; NVML "
        "fields 161-163 with scopeId = link), for links that are up; slow tier.",
        "moptd_gpu_nvlink_link_errors_total",
        "DCGM_FI_DEV_NVLINK_{REPLAY,RECOVERY,CRC_FLIT}_ERROR_COUNT_L*",
        labels=("link", "counter"),
    ),
    _g(
        "nvlink_link_bytes",
        "counter",
        "bytes",
        "NVLink data bytes by link and direction (tx, rx) since the driver loaded (NVML "
        "fields 138/139 with scopeId = link, KiB x 1024), for links that are up; slow tier.",
        "moptd_gpu_nvlink_link_data_bytes_total",
        "DCGM_FI_PROF_NVLINK_L*_TX_BYTES / _RX_BYTES (rates)",
        labels=("link", "direction"),
    ),
    _g(
        "mig_memory_used",
        "gauge",
        "bytes",
        "Memory in use in a MIG device's GPU instance, by GPU and compute instance id (MIG on "
        "only); slow tier.",
        "moptd_gpu_mig_memory_used_bytes",
        "DCGM_FI_DEV_FB_USED (per MIG instance)",
        labels=("gpu_instance", "compute_instance"),
    ),
    _g(
        "mig_memory_total",
        "gauge",
        "bytes",
        "Memory of a MIG device's GPU instance (MIG on only); slow tier.",
        "moptd_gpu_mig_memory_total_bytes",
        "DCGM_FI_DEV_FB_TOTAL (per MIG instance)",
        labels=("gpu_instance", "compute_instance"),
    ),
    _g(
        "recovery_action",
        "gauge",
        "",
        "The driver's recommended recovery action (field 230): 0 none, 1 GPU reset, 2 node "
        "reboot, 3 drain P2P, 4 drain and reset; slow tier.",
        "moptd_gpu_recovery_action",
        "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
    ),
    # --- profile tier (NVML GPM) ---
    _g(
        "gpm_supported",
        "gauge",
        "bool",
        "1 when the GPU has NVML's GPM profiling metrics (Hopper and newer), 0 when it has "
        "not (the profile metrics are then absent); profile tier.",
        "moptd_gpu_gpm_supported",
    ),
    _g(
        "gr_engine_active",
        "gauge",
        "ratio",
        "Ratio of time the graphics or compute engine was active (GPM GRAPHICS_UTIL); profile "
        "tier.",
        "moptd_gpu_gr_engine_active_ratio",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    ),
    _g(
        "sm_active",
        "gauge",
        "ratio",
        "Ratio of SMs busy, averaged over the interval (GPM SM_UTIL). Unlike gpu.util, which says "
        "a kernel ran at all, this says how much of the GPU it used; profile tier.",
        "moptd_gpu_sm_active_ratio",
        "DCGM_FI_PROF_SM_ACTIVE",
    ),
    _g(
        "sm_occupancy",
        "gauge",
        "ratio",
        "Ratio of resident warps to the SMs' maximum (GPM SM_OCCUPANCY); profile tier.",
        "moptd_gpu_sm_occupancy_ratio",
        "DCGM_FI_PROF_SM_OCCUPANCY",
    ),
    _g(
        "tensor_active",
        "gauge",
        "ratio",
        "Ratio of time the SMs' tensor pipes were busy, any precision (GPM ANY_TENSOR_UTIL); "
        "profile tier.",
        "moptd_gpu_tensor_active_ratio",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ),
    _g(
        "dram_active",
        "gauge",
        "ratio",
        "Ratio of the memory bandwidth's peak in use (GPM DRAM_BW_UTIL); profile tier.",
        "moptd_gpu_dram_active_ratio",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    ),
    _g(
        "fp64_active",
        "gauge",
        "ratio",
        "Ratio of time the non-tensor FP64 pipe was busy (GPM FP64_UTIL); profile tier.",
        "moptd_gpu_fp64_active_ratio",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    ),
    _g(
        "fp32_active",
        "gauge",
        "ratio",
        "Ratio of time the non-tensor FP32 pipe was busy (GPM FP32_UTIL); profile tier.",
        "moptd_gpu_fp32_active_ratio",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    ),
    _g(
        "fp16_active",
        "gauge",
        "ratio",
        "Ratio of time the non-tensor FP16 pipe was busy (GPM FP16_UTIL); profile tier.",
        "moptd_gpu_fp16_active_ratio",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    ),
    _g(
        "pcie_tx_bytes",
        "gauge",
        "bytes_per_second",
        "PCIe traffic from the GPU, averaged over the interval (GPM, protocol headers included); "
        "profile tier.",
        "moptd_gpu_pcie_transmit_bytes_per_second",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
    ),
    _g(
        "pcie_rx_bytes",
        "gauge",
        "bytes_per_second",
        "PCIe traffic to the GPU, averaged over the interval (GPM, protocol headers included); "
        "profile tier.",
        "moptd_gpu_pcie_receive_bytes_per_second",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    ),
    _g(
        "nvlink_tx_bytes",
        "gauge",
        "bytes_per_second",
        "NVLink traffic from the GPU, all links, averaged over the interval (GPM, protocol headers"
        " included); profile tier.",
        "moptd_gpu_nvlink_transmit_bytes_per_second",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
    ),
    _g(
        "nvlink_rx_bytes",
        "gauge",
        "bytes_per_second",
        "NVLink traffic to the GPU, all links, averaged over the interval (GPM, protocol headers "
        "included); profile tier.",
        "moptd_gpu_nvlink_receive_bytes_per_second",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
    ),
    _g(
        "mig_activity",
        "gauge",
        "ratio",
        "GPM activity of one MIG GPU instance, by instance and metric (gr_engine_active, "
        "sm_active, sm_occupancy, tensor_active, dram_active, fp64/fp32/fp16_active; "
        "nvmlGpmMigSampleGet); MIG on only; profile tier.",
        "moptd_gpu_mig_activity_ratio",
        "DCGM_FI_PROF_* with GPU_I_ID",
        labels=("gpu_instance", "metric"),
    ),
    # --- static tier ---
    _g(
        "sm_clock_max",
        "gauge",
        "hertz",
        "Maximum SM clock; static tier.",
        "moptd_gpu_sm_clock_max_hertz",
        "DCGM_FI_DEV_MAX_SM_CLOCK",
    ),
    _g(
        "mem_clock_max",
        "gauge",
        "hertz",
        "Maximum memory clock; static tier.",
        "moptd_gpu_memory_clock_max_hertz",
        "DCGM_FI_DEV_MAX_MEM_CLOCK",
    ),
    _g(
        "power_limit",
        "gauge",
        "watts",
        "Enforced power limit; static tier.",
        "moptd_gpu_power_limit_watts",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    ),
    _g(
        "power_limit_default",
        "gauge",
        "watts",
        "Default power limit; static tier.",
        "moptd_gpu_power_limit_default_watts",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",
    ),
    _g(
        "pcie_link_gen_max",
        "gauge",
        "",
        "Maximum PCIe generation of GPU and slot; static tier.",
        "moptd_gpu_pcie_link_generation_max",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    ),
    _g(
        "pcie_link_width_max",
        "gauge",
        "",
        "Maximum PCIe link width; static tier.",
        "moptd_gpu_pcie_link_width_max",
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
    ),
    _g(
        "ecc_enabled",
        "gauge",
        "bool",
        "1 when ECC is on (current mode); static tier.",
        "moptd_gpu_ecc_enabled",
        "DCGM_FI_DEV_ECC_CURRENT",
    ),
    _g(
        "ecc_pending",
        "gauge",
        "bool",
        "ECC mode after the next reboot; static tier.",
        "moptd_gpu_ecc_pending_enabled",
        "DCGM_FI_DEV_ECC_PENDING",
    ),
    _g(
        "persistence_mode",
        "gauge",
        "bool",
        "1 when persistence mode is on; static tier.",
        "moptd_gpu_persistence_mode",
        "DCGM_FI_DEV_PERSISTENCE_MODE",
    ),
    _g(
        "compute_mode",
        "gauge",
        "",
        "Compute mode: 0 default, 1 exclusive thread, 2 prohibited, 3 exclusive process; "
        "static tier.",
        "moptd_gpu_compute_mode",
        "DCGM_FI_DEV_COMPUTE_MODE",
    ),
    _g(
        "mig_mode",
        "gauge",
        "bool",
        "1 when MIG mode is on (current); static tier.",
        "moptd_gpu_mig_mode",
        "DCGM_FI_DEV_MIG_MODE",
    ),
    SignalSpec(
        "gpu.xid_event",
        "event",
        "",
        "An Xid error the driver reported through NVML's event set (read by a dedicated "
        "thread as it happens). The legacy NVML event carries no time: t is when moptd "
        "received it. The kernel log's NVRM Xid lines are the kernel collector's stream.",
        "gpu",
        None,
        fields=("code", "source"),
    ),
    SignalSpec(
        "process.gpu_memory",
        "gauge",
        "bytes",
        "GPU memory used by a compute process on one GPU; slow tier. Processes "
        "disappear when they exit.",
        "process",
        "moptd_gpu_process_memory_used_bytes",
        ("gpu",),
    ),
    SignalSpec(
        "process.gpu_sm_util",
        "gauge",
        "ratio",
        "Share of the SM time used by a process on one GPU, NVML's newest "
        "per-process sample (nvidia-smi pmon's sm column / 100); slow tier. Only "
        "processes running now, at most the 32 busiest per GPU; 0 for a process NVML "
        "saw idle since the last read.",
        "process",
        "moptd_gpu_process_sm_utilization_ratio",
        ("gpu",),
    ),
    SignalSpec(
        "process.gpu_mem_util",
        "gauge",
        "ratio",
        "Share of the memory controller time used by a process on one GPU, NVML's newest "
        "per-process sample (nvidia-smi pmon's mem column / 100); slow tier. Only "
        "processes running now, at most the 32 busiest per GPU; 0 for a process NVML "
        "saw idle since the last read.",
        "process",
        "moptd_gpu_process_mem_utilization_ratio",
        ("gpu",),
    ),
    SignalSpec(
        "process.gpu_enc_util",
        "gauge",
        "ratio",
        "Share of the video encoder time used by a process on one GPU, NVML's newest "
        "per-process sample (nvidia-smi pmon's enc column / 100); slow tier. Only "
        "processes running now, at most the 32 busiest per GPU; 0 for a process NVML "
        "saw idle since the last read.",
        "process",
        "moptd_gpu_process_enc_utilization_ratio",
        ("gpu",),
    ),
    SignalSpec(
        "process.gpu_dec_util",
        "gauge",
        "ratio",
        "Share of the video decoder time used by a process on one GPU, NVML's newest "
        "per-process sample (nvidia-smi pmon's dec column / 100); slow tier. Only "
        "processes running now, at most the 32 busiest per GPU; 0 for a process NVML "
        "saw idle since the last read.",
        "process",
        "moptd_gpu_process_dec_utilization_ratio",
        ("gpu",),
    ),
]
