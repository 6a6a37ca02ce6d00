"""The units dcgm-exporter gives the DCGM fields that moptd's GPU signals name (their
``dcgm`` column), so recording rules can offer an existing dcgm-exporter dashboard or alert
the DCGM_FI_* series it reads, converted from moptd's base units.

Source: NVIDIA/dcgm-exporter etc/default-counters.csv and etc/dcp-metrics-included.csv at
d5e5f51 (the help texts say "(in MHz)", "(in MiB)", "(in mJ)", "(in %)", "(in C)", "(in
W)", "Ratio of ...", "in bytes per second"), and DCGM's dcgm_fields.h for the fields the
CSVs leave out (DCGM_FI_DEV_BAR1_USED: MB, the limits: W, PCIe link: plain numbers).
A field listed here with a unit moptd cannot convert to is a bug the generator refuses.
"""

from __future__ import annotations

# DCGM field -> its unit in dcgm-exporter's output
DCGM_UNITS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "percent",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "percent",
    "DCGM_FI_DEV_FB_USED": "MiB",
    "DCGM_FI_DEV_FB_FREE": "MiB",
    "DCGM_FI_DEV_FB_RESERVED": "MiB",
    "DCGM_FI_DEV_BAR1_USED": "MiB",
    "DCGM_FI_DEV_GPU_TEMP": "celsius",
    "DCGM_FI_DEV_MEMORY_TEMP": "celsius",
    "DCGM_FI_DEV_POWER_USAGE": "watts",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "watts",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": "watts",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "millijoules",
    "DCGM_FI_DEV_SM_CLOCK": "MHz",
    "DCGM_FI_DEV_MEM_CLOCK": "MHz",
    "DCGM_FI_DEV_MAX_SM_CLOCK": "MHz",
    "DCGM_FI_DEV_MAX_MEM_CLOCK": "MHz",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "count",
    "DCGM_FI_DEV_PCIE_LINK_GEN": "count",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": "count",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": "count",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": "count",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "count",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "count",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "count",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "count",
    "DCGM_FI_DEV_RETIRED_PENDING": "count",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "count",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "count",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "count",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "count",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "count",
    "DCGM_FI_DEV_COMPUTE_MODE": "count",
    "DCGM_FI_DEV_PERSISTENCE_MODE": "count",
    "DCGM_FI_DEV_MIG_MODE": "count",
    "DCGM_FI_DEV_ECC_CURRENT": "count",
    "DCGM_FI_DEV_ECC_PENDING": "count",
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION": "count",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "ratio",
    "DCGM_FI_PROF_SM_ACTIVE": "ratio",
    "DCGM_FI_PROF_SM_OCCUPANCY": "ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "ratio",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "ratio",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "ratio",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "ratio",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "bytes_per_second",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "bytes_per_second",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "bytes_per_second",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "bytes_per_second",
}

# (moptd unit, dcgm-exporter unit) -> the factor from moptd's value to DCGM's
FACTORS: dict[tuple[str, str], float] = {
    ("ratio", "percent"): 100.0,
    ("ratio", "ratio"): 1.0,
    ("bytes", "MiB"): 1.0 / (1 << 20),
    ("hertz", "MHz"): 1e-6,
    ("joules", "millijoules"): 1000.0,
    ("celsius", "celsius"): 1.0,
    ("watts", "watts"): 1.0,
    ("bytes_per_second", "bytes_per_second"): 1.0,
    ("count", "count"): 1.0,
    ("", "count"): 1.0,
    ("bool", "count"): 1.0,
}

# The default dcgm-exporter fields moptd cannot honestly give, and why (docs/metrics.md).
NOT_PROVIDED: dict[str, str] = {
    "DCGM_FI_DEV_ENC_UTIL": "moptd reads encoder use per process, not per GPU",
    "DCGM_FI_DEV_DEC_UTIL": "moptd reads decoder use per process, not per GPU",
    "DCGM_FI_DEV_XID_ERRORS": (
        "DCGM keeps the value of the last Xid; moptd counts every Xid by number "
        "(moptd_xid_errors_total{xid}), which says more but is not the same series"
    ),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "moptd does not read vGPU licensing",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (
        "DCGM's counter sums lanes in its own unit; moptd gives bytes per link "
        "(moptd_gpu_nvlink_link_data_bytes_total) and the GPM rates"
    ),
    "DCGM_FI_DEV_POWER_VIOLATION": (
        "a DCGM counter in ns; moptd's moptd_gpu_clock_event_seconds_total{reason} is the "
        "same time in seconds per reason, but the reasons do not map one to one"
    ),
}
