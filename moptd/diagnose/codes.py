"""The stable diagnosis codes (docs: docs/diagnosis-codes.md) with layer and default severity.

Codes are a contract with Grafana alerts, runbooks and `moptd replay --json`: a code never
changes meaning; new ones may be added here.
"""

from __future__ import annotations

from typing import Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")

# code -> (layer, default severity)
CODES: dict[str, tuple[str, Severity]] = {
    "GPU_LOST": ("hardware", "critical"),
    "ECC_UNCORRECTABLE": ("hardware", "critical"),
    "ECC_CORRECTABLE_RATE_HIGH": ("hardware", "warning"),
    "ROW_REMAP_PENDING": ("hardware", "warning"),
    "ROW_REMAP_FAILURE": ("hardware", "critical"),
    "NVLINK_ERROR": ("hardware", "warning"),
    "PCIE_LINK_DEGRADED": ("hardware", "warning"),
    "PCIE_REPLAY_RATE_HIGH": ("hardware", "warning"),
    "THERMAL_THROTTLE": ("hardware", "warning"),
    "HW_SLOWDOWN": ("hardware", "critical"),
    "POWER_CAPPED": ("hardware", "info"),
    "POWER_LIMIT_REDUCED": ("hardware", "warning"),
    "GPU_RESET_REQUIRED": ("hardware", "critical"),
    "DRIVER_NOT_LOADED": ("driver", "critical"),
    "DRIVER_VERSION_MISMATCH": ("driver", "critical"),
    "UVM_NOT_LOADED": ("driver", "critical"),
    "DEVICE_NODE_PROBLEM": ("driver", "critical"),
    "PERSISTENCE_MODE_OFF": ("driver", "info"),
    "MODULE_KERNEL_MISMATCH": ("driver", "critical"),
    "SECURE_BOOT_BLOCKED": ("driver", "critical"),
    "GSP_FIRMWARE_ERROR": ("driver", "critical"),
    "XID_APPLICATION_FAULT": ("driver", "warning"),
    "CONTAINER_RUNTIME_NOT_CONFIGURED": ("container", "warning"),
    "CDI_SPEC_STALE": ("container", "critical"),
    "SERVING_DOWN": ("framework", "critical"),
    "ENGINE_DEAD": ("framework", "critical"),
    "SCHEDULER_STALL": ("framework", "critical"),
    "GPU_UNDERUTILIZED_QUEUEING": ("framework", "warning"),
    "SERVING_CPU_BOUND": ("framework", "warning"),
    "KV_CACHE_PRESSURE": ("framework", "warning"),
    "PREEMPTION_STORM": ("framework", "warning"),
    "QUEUE_LATENCY_HIGH": ("framework", "warning"),
    "CUDA_GRAPHS_DISABLED": ("framework", "info"),
    "PORT_CONFLICT": ("framework", "critical"),
    "TOKENIZER_MISSING": ("model", "critical"),
    "UNSAFE_WEIGHT_FORMAT": ("model", "info"),
    "CUDA_OOM": ("memory", "critical"),
    "CUDA_OOM_FRAGMENTATION": ("memory", "warning"),
    "GPU_MEMORY_LEAK": ("memory", "warning"),
    "HOST_OOM_KILL": ("host", "critical"),
    "HOST_MEMORY_LOW": ("host", "warning"),
    "SWAP_ACTIVE": ("host", "warning"),
    "DISK_SPACE_LOW": ("host", "warning"),
}

LAYERS = ("hardware", "driver", "container", "framework", "model", "memory", "host")
# The layers whose codes the default rules in this repository must all reach.
ENGINE_LAYERS = ("hardware", "driver", "container", "host")
