"""The stable diagnosis codes, declared once: code -> layer, default severity, meaning.

Codes are a contract with Grafana alerts, runbooks and `moptd replay --json`: a code never
changes meaning; new ones may be added here. Everything else that lists the codes derives
from this table: `python tools/gen_docs.py` writes the rule schema's enum and the tables of
docs/diagnosis-codes.md and docs/runbooks/README.md (the tests fail when they are stale), and
`tools/check_runbooks.py` (run by the tests) wants one runbook per code here.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


class Code(NamedTuple):
    layer: str
    severity: Severity  # the default; a rule may raise it with evidence
    meaning: str  # one line, for the docs tables (no "|")


CODES: dict[str, Code] = {
    "GPU_LOST": Code(
        "hardware",
        "critical",
        "GPU fell off the bus / NVML reports it lost; node needs a drain and reboot",
    ),
    "ECC_UNCORRECTABLE": Code(
        "hardware",
        "critical",
        "uncorrectable ECC error (Xid 48, 94, 95, volatile DBE count rising)",
    ),
    "ECC_CORRECTABLE_RATE_HIGH": Code(
        "hardware",
        "warning",
        "single-bit ECC errors arriving fast (Xid 92, corrected count rising)",
    ),
    "ROW_REMAP_PENDING": Code(
        "hardware",
        "warning",
        "a row remap is pending: reset the GPU when drained to apply it",
    ),
    "ROW_REMAP_FAILURE": Code(
        "hardware",
        "critical",
        "row remapping failed (Xid 64, remap failure flag): RMA candidate",
    ),
    "NVLINK_ERROR": Code(
        "hardware",
        "warning",
        "NVLink errors (Xid 74, CRC/replay/recovery counters rising)",
    ),
    "PCIE_LINK_DEGRADED": Code(
        "hardware",
        "warning",
        (
            "link width below the maximum, or generation below the maximum while the GPU is "
            "busy (a lower generation at idle is power saving, not a fault)"
        ),
    ),
    "PCIE_REPLAY_RATE_HIGH": Code(
        "hardware",
        "warning",
        "PCIe replay counter rising: signal-integrity trouble",
    ),
    "PCIE_FATAL_ERROR": Code(
        "hardware",
        "critical",
        "a PCIe uncorrectable (fatal) AER error on a GPU or on the port above it "
        '("Uncorrectable (Fatal)", "device recovery failed"): the GPU is likely gone from the '
        "bus; drain, reboot, inspect the slot/riser",
    ),
    "THERMAL_THROTTLE": Code(
        "hardware",
        "warning",
        "HW or SW thermal slowdown active",
    ),
    "HW_SLOWDOWN": Code(
        "hardware",
        "critical",
        "HW slowdown or power-brake slowdown active (external signal, PSU, sensors)",
    ),
    "POWER_CAPPED": Code(
        "hardware",
        "info",
        (
            "clocks held down by the software power cap under load (normal at full load; shown so "
            "util figures are read right)"
        ),
    ),
    "POWER_LIMIT_REDUCED": Code(
        "hardware",
        "warning",
        "enforced power limit below the default limit",
    ),
    "GPU_RESET_REQUIRED": Code(
        "hardware",
        "critical",
        (
            "the driver asks for a GPU reset or node reboot (Xid 154 recovery action, Xid "
            "62/119/120 and kin)"
        ),
    ),
    "GPU_INIT_FAILED": Code(
        "hardware",
        "critical",
        (
            'the driver failed to initialise one GPU (NVRM "RmInitAdapter failed", GPU absent '
            "from NVML) while the module is loaded and other GPUs work"
        ),
    ),
    "NVSWITCH_FATAL_ERROR": Code(
        "hardware",
        "critical",
        (
            "an NVSwitch reports a fatal SXid (nvidia-nvswitchN: SXid ...): NVLink traffic "
            "through it stalls; drain, then reset GPUs and switches"
        ),
    ),
    "GPU_FAULT_RECURRING": Code(
        "hardware",
        "critical",
        (
            "the same board (by serial, across resets, reboots and re-enumeration) has had "
            "hardware-class faults again and again (uncorrectable ECC, row-remap failure, fallen "
            "off the bus, GSP, fatal NVLink or PCIe): another reset will not fix it; RMA "
            "candidate, with its history"
        ),
    ),
    "GPU_FAULT_SAME_LOCATION": Code(
        "hardware",
        "warning",
        (
            "Xid 13/31-class faults from different processes at the same GPC/TPC/SM: the "
            "pattern NVIDIA's Xid 13 workflow reads as a suspect GPU rather than an application "
            "bug; run the field diagnostic"
        ),
    ),
    "DRIVER_NOT_LOADED": Code(
        "driver",
        "critical",
        "nvidia kernel module not loaded / NVML cannot initialise",
    ),
    "DRIVER_VERSION_MISMATCH": Code(
        "driver",
        "critical",
        'user-space driver (NVML) and kernel module versions differ, or NVRM "API mismatch"',
    ),
    "UVM_NOT_LOADED": Code(
        "driver",
        "critical",
        "nvidia_uvm missing or /dev/nvidia-uvm absent: CUDA cannot start",
    ),
    "DEVICE_NODE_PROBLEM": Code(
        "driver",
        "critical",
        "/dev/nvidia* node missing or not accessible to the serving user",
    ),
    "PERSISTENCE_MODE_OFF": Code(
        "driver",
        "info",
        "neither persistence mode nor nvidia-persistenced: slow first CUDA init, lost state",
    ),
    "MODULE_KERNEL_MISMATCH": Code(
        "driver",
        "critical",
        "DKMS built the module for another kernel than the running one",
    ),
    "SECURE_BOOT_BLOCKED": Code(
        "driver",
        "critical",
        "module load refused by lockdown / signature checks",
    ),
    "GSP_FIRMWARE_ERROR": Code(
        "driver",
        "critical",
        "GSP RPC timeout or GSP error (Xid 119, 120)",
    ),
    "XID_APPLICATION_FAULT": Code(
        "driver",
        "warning",
        "Xid 13, 31, 43, 45 and kin: a process faulted on the GPU; the GPU itself is fine",
    ),
    "AUX_MODULE_LOAD_FAILURE": Code(
        "driver",
        "warning",
        (
            "a companion module (nvidia-fs, nvidia-peermem, nv_peer_mem, gdrdrv) fails to load "
            "while nvidia.ko works: GPUDirect Storage/RDMA unavailable"
        ),
    ),
    "CUDA_DRIVER_TOO_OLD": Code(
        "driver",
        "critical",
        (
            "the serving stack's CUDA runtime is newer than the loaded driver supports "
            '("CUDA driver version is insufficient for CUDA runtime version")'
        ),
    ),
    "NCCL_COLLECTIVE_TIMEOUT": Code(
        "driver",
        "critical",
        (
            "an NCCL collective (all-reduce, all-gather, broadcast) of a tensor-parallel "
            'group timed out or aborted ("Watchdog caught collective operation timeout", '
            '"NCCL error", "unhandled cuda error"): one rank or the GPU-to-GPU path (NVLink, '
            "PCIe P2P, network) stalls the whole group; name the rank and the link when the "
            "evidence does"
        ),
    ),
    "FABRIC_MANAGER_NOT_READY": Code(
        "driver",
        "critical",
        (
            "on an NVSwitch / multi-node NVLink system the NVLink fabric is not initialised "
            '(fabric manager not running or failed, persistenced "NVLink fabric is not ready", '
            'CUDA "system not yet initialized"): CUDA cannot start on any GPU; never raised '
            "where the topology has no fabric"
        ),
    ),
    "WSL_GUEST_DRIVER_INSTALLED": Code(
        "driver",
        "critical",
        (
            "a Linux NVIDIA driver is installed inside a WSL2 guest: its libraries shadow the "
            "Windows driver's in /usr/lib/wsl/lib, which NVIDIA's CUDA on WSL guide forbids"
        ),
    ),
    "CONTAINER_RUNTIME_NOT_CONFIGURED": Code(
        "container",
        "warning",
        "a container engine is present but neither the nvidia runtime nor a CDI spec is set up",
    ),
    "CDI_SPEC_STALE": Code(
        "container",
        "critical",
        "CDI spec names a driver version other than the running one (after a driver upgrade)",
    ),
    "CUDA_ARCH_UNSUPPORTED": Code(
        "compiler",
        "critical",
        (
            "the serving stack's CUDA binaries (PyTorch, vLLM, TensorRT) carry no kernels for "
            'this GPU\'s compute capability ("no kernel image is available", "sm_120 is not '
            'compatible with the current PyTorch installation")'
        ),
    ),
    "TRT_ENGINE_INCOMPATIBLE": Code(
        "compiler",
        "critical",
        (
            "a TensorRT / TensorRT-LLM engine was built for another TensorRT version, GPU "
            "architecture or plugin set than this host runs (plan deserialisation fails)"
        ),
    ),
    "QUANTIZATION_UNSUPPORTED_ON_GPU": Code(
        "compiler",
        "critical",
        (
            "the model's quantization method needs a newer GPU than this one (\"The "
            "quantization method fp8 is not supported for the current GPU. Minimum "
            'capability: 89/90", AWQ needing 7.5 on 7.0): a different checkpoint or GPU is '
            "the fix, not a rebuild"
        ),
    ),
    "SERVING_DOWN": Code(
        "framework",
        "critical",
        "the serving process is gone or its health probe fails",
    ),
    "ENGINE_DEAD": Code(
        "framework",
        "critical",
        "the process answers but its engine is dead (EngineDeadError, generation probe fails)",
    ),
    "SCHEDULER_STALL": Code(
        "framework",
        "critical",
        "requests wait, none finish, no tokens are generated",
    ),
    "GPU_UNDERUTILIZED_QUEUEING": Code(
        "framework",
        "warning",
        "GPU busy well below capacity while requests queue (scheduler, CPU or config bound)",
    ),
    "GPU_UTILIZATION_MISLEADING": Code(
        "framework",
        "info",
        "nvidia-smi reports the GPU busy while under half of its SMs are active (GPM)",
    ),
    "GPU_MEMORY_BANDWIDTH_BOUND": Code(
        "framework",
        "info",
        "memory bandwidth near its peak with the tensor pipes less busy: bound by HBM, not compute",
    ),
    "SERVING_CPU_BOUND": Code(
        "framework",
        "warning",
        "the serving process's CPU use sits at its ceiling while the GPU waits",
    ),
    "KV_CACHE_PRESSURE": Code(
        "framework",
        "warning",
        "KV-cache usage pinned near full",
    ),
    "PREEMPTION_STORM": Code(
        "framework",
        "warning",
        "requests preempted at a high rate for lack of KV-cache space",
    ),
    "QUEUE_LATENCY_HIGH": Code(
        "framework",
        "warning",
        "time spent queued (p99) above the objective",
    ),
    "CUDA_GRAPHS_DISABLED": Code(
        "framework",
        "info",
        "serving runs eager (--enforce-eager or graph capture failed) in production",
    ),
    "PORT_CONFLICT": Code(
        "framework",
        "critical",
        "the serving port is held by another process",
    ),
    "CUDA_ILLEGAL_ADDRESS": Code(
        "framework",
        "critical",
        (
            "a kernel of the serving process hit an illegal memory access (a sticky CUDA error: "
            "the process must restart); a software fault unless Xid 48/79-class errors come "
            "with it"
        ),
    ),
    "ONNXRUNTIME_CPU_FALLBACK": Code(
        "framework",
        "critical",
        (
            "ONNX Runtime could not load its CUDA execution provider and runs the model on the "
            "CPU (Failed to create CUDAExecutionProvider, Falling back to CPUExecutionProvider): "
            "it still answers, at CPU speed"
        ),
    ),
    "GPU_MEMORY_OCCUPIED_AT_START": Code(
        "framework",
        "critical",
        (
            "the engine refuses to start, or starts with a smaller KV cache, because other "
            'processes already hold GPU memory (vLLM "Free memory on device ... is less than '
            'desired GPU memory utilization"): find and stop the holder, or lower the budget'
        ),
    ),
    "TOKENIZER_MISSING": Code(
        "model",
        "critical",
        "model directory lacks tokenizer files, or the tokenizer fails to load",
    ),
    "UNSAFE_WEIGHT_FORMAT": Code(
        "model",
        "info",
        "weights in a pickle format (.bin/.pt/.pth) rather than safetensors",
    ),
    "KV_CACHE_CAPACITY_INSUFFICIENT": Code(
        "model",
        "critical",
        (
            "the engine refuses to start: the KV cache that fits its GPU-memory budget is empty "
            "or smaller than one max_model_len sequence (give it more memory or lower "
            "max_model_len; not an OOM)"
        ),
    ),
    "MAX_MODEL_LEN_EXCEEDS_MODEL_CONTEXT": Code(
        "model",
        "critical",
        (
            "the engine refuses to start: the configured max_model_len is larger than the "
            "model's own context length (derived from its config)"
        ),
    ),
    "CHAT_TEMPLATE_MISSING": Code(
        "model",
        "critical",
        (
            "chat requests fail (HTTP 400) because the tokenizer has no chat template and "
            "none was given; the server itself stays up"
        ),
    ),
    "CUDA_OOM": Code(
        "memory",
        "critical",
        "a CUDA out-of-memory error in the serving log",
    ),
    "CUDA_OOM_FRAGMENTATION": Code(
        "memory",
        "warning",
        "a CUDA OOM where memory reserved-but-unallocated is a large share (fragmentation)",
    ),
    "GPU_MEMORY_LEAK": Code(
        "memory",
        "warning",
        "a process's GPU memory grows steadily while its load does not",
    ),
    "HOST_OOM_KILL": Code(
        "host",
        "critical",
        "the kernel OOM killer killed a process",
    ),
    "HOST_MEMORY_LOW": Code(
        "host",
        "warning",
        "available host memory low",
    ),
    "SWAP_ACTIVE": Code(
        "host",
        "warning",
        "the host is swapping",
    ),
    "DISK_SPACE_LOW": Code(
        "host",
        "warning",
        "a watched filesystem (model dir, /tmp, state dir) nearly full",
    ),
    # moptd's own health: made by the engine itself, never by a rule (its layer is no rule's).
    "RULE_EVALUATION_FAILED": Code(
        "moptd",
        "warning",
        "a rule raised while it ran (an overflow, a recursion too deep): it diagnoses nothing",
    ),
    "UNCLASSIFIED_ERROR": Code(
        "moptd",
        "warning",
        (
            "a source moptd reads holds error records that no pattern of moptd's knows (an "
            "ERROR/CRITICAL log record, a Python exception, a kernel line at priority err or "
            "worse from a GPU-related emitter): moptd quotes them, names the emitter, and never "
            'answers "no findings" over them. It never replaces a specific code: a record '
            "that a pattern classifies is not unclassified"
        ),
    ),
    "REMEDIATION_SUSPENDED": Code(
        "moptd",
        "warning",
        (
            "the remediation circuit breaker tripped: after too many remedies in its window "
            "moptd stopped acting on the engine until an operator restarts it"
        ),
    ),
    # The one moptd-layer code a rule raises (rules/driver/kernel-log.rules.yaml): the gap
    # is in the store as kernel.log_gap events, so the lifecycle is any finding's.
    "KERNEL_LOG_RECORDS_LOST": Code(
        "moptd",
        "warning",
        (
            "kernel-log records were overwritten before moptd read them (the ring wrapped, or "
            "the daemon was down longer than the ring holds): Xids may have been missed; "
            "read `journalctl -k` for the gap"
        ),
    ),
}

# The layers a rule may declare; moptd's own health (layer "moptd") is no rule's.
LAYERS = ("hardware", "driver", "container", "compiler", "framework", "model", "memory", "host")
# The layers whose codes the default rules in this repository must all reach.
ENGINE_LAYERS = ("hardware", "driver", "container", "host")
