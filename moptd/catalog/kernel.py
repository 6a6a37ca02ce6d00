"""Kernel-log, driver-stack and container-runtime signals.

Event streams come from the kernel collector (``kernel.*``); the ``driver.*`` facts from
the driver collector and the ``container.*`` facts from the container collector. Info
signals carry their text in labels and the value 1.
"""

from moptd.catalog.spec import SignalSpec

_XID_FIELDS = (
    "code",
    "pci_bus_id",
    "uuid",
    "pid",
    "process",
    "message",
    "caused_by",
    "gpu_instance",
    "compute_instance",
    "severity",
    "container",
    "incident",
    "mnemonic",
    "diagnoses",
    "plan",
    "recovery_action",
    "recovery_action_code",
    "previous_recovery_action",
    "previous_recovery_action_code",
    "nvlink_unit",
    "nvlink_xc",
    # where an Xid 13 / 31 hit (moptd/kernel/patterns.py _set_location)
    "location",
    "gpc",
    "tpc",
    "sm",
    "mmu_engine",
    "mmu_client",
    "mmu_fault_type",
    "mmu_access_type",
    "link",
    "link_scope",
    "intrinfo",
    "error_status",
    # NVIDIA's Xid 144-150 decode of those two words (moptd/kernel/nvlink5.py)
    "nvlink5_action",
    "nvlink5_severity",
    "user",
    "cmdline",
    "pod_uid",
)


def _ev(name: str, subject: str, help: str, fields: tuple[str, ...]) -> SignalSpec:
    # facility: set only when the record is not the kernel's own (a line written to
    # /dev/kmsg from user space arrives as facility "user"; it cannot claim "kern")
    if name.startswith("kernel."):
        fields = (*fields, "facility")
    return SignalSpec(name, "event", "", help, subject, None, (), "", fields)  # type: ignore[arg-type]


SIGNALS = [
    # --- kernel-log event streams (the log line itself is the event's text) ---
    _ev(
        "kernel.xid",
        "gpu",
        "An NVRM Xid line. Subject gpu:<index> when the PCI address maps to a known GPU, "
        "else gpu:<pci bus id>. severity comes from an NVLink5 tail (fatal, nonfatal); "
        "link_scope is one_link, or no_particular_link (the line says Link -1, link is "
        "None); recovery_action_code (Xid 154) is NVML's 0 none .. 4 drain and reset; "
        "plan is the Xid catalog's plan for the line (moptd/kernel/xid_catalog.yaml); "
        "location is where an Xid 13 or 31 hit (GPC 7, TPC 7, SM 0; GRAPHICS GPC2 "
        "GPCCLIENT_T1_7), with gpc, tpc, sm and the MMU fault's engine, client and types.",
        _XID_FIELDS,
    ),
    _ev(
        "kernel.gpu_fallen_off_bus",
        "gpu",
        "The driver's 'fallen off the bus' message without an Xid (single- or multi-line).",
        ("pci_bus_id", "pci_id", "uuid"),
    ),
    _ev(
        "kernel.gpu_init_failed",
        "gpu",
        "NVRM 'GPU <bus>: RmInitAdapter failed!': the driver could not initialise that one "
        "GPU (the module itself loaded). Subject as for kernel.xid. open_module_unsupported "
        "is true when the open kernel module said just before that it is only ready for "
        "Data Center GPUs; release_unsupported when the driver said the GPU 'is not "
        "supported by the NVIDIA <version> driver release'.",
        (
            "module",
            "reason",
            "pci_bus_id",
            "uuid",
            "open_module_unsupported",
            "release_unsupported",
        ),
    ),
    _ev(
        "kernel.sxid",
        "node",
        "An NVSwitch SXid; fatal is None when the line gives no severity. Its follow-up "
        "lines are kernel.sxid_detail, unless no header was seen: then the follow-up stands "
        "for the SXid, headerless true (the SXid's own line, with its name and link, is not "
        "in the log).",
        (
            "code",
            "pci_bus_id",
            "fatal",
            "severity",
            "link",
            "device",
            "message",
            "severity_level",
            "engine_instance",
            "subengine_instance",
            "data",
            "headerless",
        ),
    ),
    _ev(
        "kernel.sxid_detail",
        "node",
        "A follow-up line of an SXid ('Severity N Engine instance ...' or 'Data {...}'), "
        "not another SXid; severity_level 1 is fatal, 0 nonfatal.",
        (
            "code",
            "pci_bus_id",
            "device",
            "fatal",
            "severity",
            "message",
            "severity_level",
            "engine_instance",
            "subengine_instance",
            "data",
        ),
    ),
    _ev(
        "kernel.nvlink_rx_detect_failure",
        "node",
        "The driver failed to update an NVLink post-RX-detection link mask (failure "
        "update_link_mask) or a peer's mask (peer_link_mask, peer set). The line names no GPU.",
        ("function", "failure", "peer"),
    ),
    _ev(
        "kernel.api_mismatch",
        "node",
        "NVRM 'API mismatch': a user-space driver component of another version than the "
        "kernel module.",
        ("client_version", "kernel_version", "client", "pid"),
    ),
    _ev(
        "kernel.module_load_failure",
        "node",
        "An NVIDIA kernel module failed to load or initialise (unknown symbol, version "
        "magic, probe failure, the NVLink core failing its init, or an RmInitAdapter failure "
        "that names no GPU); module names it as /proc/modules does (nvidia, nvidia_fs, "
        "nvidia_peermem, nvidia_uvm, ...). release_unsupported: the GPU is not supported by "
        "this driver release ('installed in this system is not supported by the NVIDIA ... "
        "driver release').",
        ("module", "reason", "pci_bus_id", "open_module_unsupported", "release_unsupported"),
    ),
    _ev(
        "kernel.secure_boot_refused",
        "node",
        "Module loading refused by kernel lockdown or signature enforcement (Secure Boot).",
        ("module", "process", "reason"),
    ),
    _ev(
        "kernel.oom_kill",
        "node",
        "The kernel OOM killer killed a process (scope system or cgroup).",
        ("pid", "process", "container", "pod_uid", "unit", "scope", "rss_bytes", "memcg"),
    ),
    _ev(
        "kernel.pcie_aer",
        "node",
        "A PCIe AER error report; severity corrected, nonfatal or fatal; gpu set when the "
        "device is a known GPU; driver is the device's driver as the line prints it "
        "(pcieport, nvidia). Fatal reports feed PCIE_FATAL_ERROR "
        "(rules/hardware/pcie-fatal.rules.yaml), non-fatal uncorrectable ones on a GPU or a "
        "port UNCLASSIFIED_ERROR (rules/driver/pcie-aer.rules.yaml). The port's own line "
        "naming where an uncorrectable error came from ('Uncorrected (Fatal) error received: "
        "<bdf>') is a report too, with source the device it names.",
        ("pci_bus_id", "severity", "type", "gpu", "driver", "source"),
    ),
    _ev(
        "kernel.unclassified",
        "gpu",
        "A record of a GPU-related kernel emitter (NVRM, nvidia-*, nvidia-drm) that says it "
        "failed and that no pattern classifies (moptd/kernel/unclassified.py). Subject the "
        "GPU when the line names its PCI address, else node. messages quotes the distinct "
        "messages of that emitter and subject so far with their counts (at most 8; more "
        "counts the rest).",
        ("emitter", "message", "level", "messages", "more", "pci_bus_id"),
    ),
    _ev(
        "kernel.gsp_error",
        "node",
        "A GSP failure the driver logs without an Xid: kind heartbeat ('GSP RM heartbeat "
        "timed out', 'Heartbeat timed out, currentTimeMs ...'), rpc_without_api_lock "
        "('Attempted to process RPC event ... without API lock'), boot_attempts_exceeded "
        "('Max GSP-RM boot attempts exceeded') or rpc_timeout (the '*** GSP Timeout ***' "
        "banner of an Xid 119 report); rm_gpu is the driver's "
        "GPU instance ('NVRM: GPU6 ...'), not nvidia-smi's index.",
        ("kind", "rm_gpu"),
    ),
    _ev(
        "kernel.pcie_recovery",
        "node",
        "AER recovery of a device: outcome failed ('device recovery failed', on the port "
        "above the device) or no_handler (the device's driver cannot take part: 'can't "
        "recover (no error_detected callback)', 'device has no AER-aware driver'); driver "
        "as the line prints it (pcieport, nvidia).",
        ("pci_bus_id", "driver", "outcome", "gpu"),
    ),
    _ev(
        "kernel.nccl_segfault",
        "node",
        "A process segfaulted inside an NVIDIA library (libnccl, libcuda, libnvidia-*, "
        "libcudart, libcublas, libcudnn); rule kernel-host-fault quotes it (UNCLASSIFIED_ERROR).",
        ("pid", "process", "library", "container", "user", "cmdline"),
    ),
    _ev(
        "kernel.peermem_error",
        "node",
        "An nvidia-peermem (GPUDirect RDMA) error line; rule kernel-host-fault quotes it "
        "(UNCLASSIFIED_ERROR).",
        ("message",),
    ),
    _ev(
        "kernel.host_fault",
        "node",
        "A host-kernel failure: kind hung_task ('INFO: task X:pid blocked for more than N "
        "seconds'), soft_lockup, hard_lockup or panic; line is the message, quoted by rule "
        "kernel-host-fault (UNCLASSIFIED_ERROR).",
        ("kind", "process", "pid", "line"),
    ),
    _ev(
        "kernel.log_gap",
        "node",
        "moptd's own: kernel-log records were overwritten before it read them (a gap in "
        "/dev/kmsg sequence numbers: the ring wrapped while it read, EPIPE, or while it was "
        "down). lost is the number of records in this gap, total the count since moptd "
        "started; what they said is unknown (KERNEL_LOG_RECORDS_LOST).",
        ("lost", "total", "source"),
    ),
    # --- kernel-log counters ---
    SignalSpec(
        "kernel.records_read",
        "counter",
        "count",
        "Kernel-log records read by moptd since it started (the records of this boot it "
        "had already handed on before a restart are read again, not counted again).",
        "node",
        "moptd_kernel_records_read_total",
    ),
    SignalSpec(
        "kernel.records_lost",
        "counter",
        "count",
        "Kernel-log records overwritten in the ring buffer before moptd read them: while "
        "it read (EPIPE on /dev/kmsg) and, after a restart, since its committed position.",
        "node",
        "moptd_kernel_records_lost_total",
    ),
    SignalSpec(
        "gpu.xid_errors",
        "counter",
        "count",
        "Xids per GPU and code since moptd started, from kernel-log lines and NVML Xid "
        "events: one that both report (the same GPU and code within 10 s) counts once. A "
        "true counter (repeats count, it never holds a stale last value).",
        "gpu",
        "moptd_xid_errors_total",
        ("xid",),
        "DCGM_FI_DEV_XID_ERRORS",
    ),
    SignalSpec(
        "gpu.xid_last_time",
        "gauge",
        "seconds",
        "Unix time of the last Xid seen for the GPU (kernel log or NVML event).",
        "gpu",
        "moptd_xid_last_timestamp_seconds",
    ),
    # --- driver stack ---
    SignalSpec(
        "driver.module_loaded",
        "gauge",
        "bool",
        "1 when the kernel module is loaded (/proc/modules).",
        "node",
        "moptd_driver_module_loaded",
        ("module",),
    ),
    SignalSpec(
        "driver.modprobe_failed",
        "gauge",
        "bool",
        "1 when modprobe / insmod output (the driver collector's modprobe_log, a bundle's "
        "kernel/modprobe.txt) shows the module failed to insert, 0 when it does not; for "
        "each NVIDIA-stack module. Absent without such output.",
        "node",
        None,
        ("module",),
    ),
    SignalSpec(
        "driver.modprobe_refused",
        "gauge",
        "bool",
        "1 when modprobe / insmod output shows the kernel refused the module's signature "
        "('Key was rejected by service', 'Required key not available'), else 0; absent "
        "without such output.",
        "node",
        None,
        ("module",),
    ),
    SignalSpec(
        "driver.modprobe_error",
        "info",
        "",
        "One failure in modprobe / insmod output: error is key_rejected, key_unavailable, "
        "no_such_device, unknown_symbol, exec_format, not_found or other; message the "
        "tool's words.",
        "node",
        None,
        ("module", "error", "message"),
    ),
    SignalSpec(
        "driver.kernel_module_version",
        "info",
        "",
        "Version of the loaded nvidia kernel module (/proc/driver/nvidia/version); flavor "
        "is open or proprietary.",
        "node",
        "moptd_driver_kernel_module_info",
        ("version", "flavor"),
    ),
    SignalSpec(
        "driver.user_space_version",
        "info",
        "",
        "Version of the user-space driver (NVML, or nvidia-smi when NVML is unavailable).",
        "node",
        "moptd_driver_user_space_info",
        ("version", "source"),
    ),
    SignalSpec(
        "driver.nvml_version_match",
        "gauge",
        "bool",
        "1 when the user-space driver version equals the kernel module version.",
        "node",
        "moptd_driver_version_match",
    ),
    SignalSpec(
        "driver.dkms_kernel_match",
        "gauge",
        "bool",
        "1 when DKMS has the nvidia module installed for the running kernel; absent without dkms.",
        "node",
        "moptd_driver_dkms_kernel_match",
    ),
    SignalSpec(
        "driver.tainted",
        "gauge",
        "",
        "The kernel taint bitmask (/proc/sys/kernel/tainted; 4096 = out-of-tree module).",
        "node",
        "moptd_kernel_taint_flags",
    ),
    SignalSpec(
        "driver.secure_boot",
        "gauge",
        "bool",
        "1 when UEFI Secure Boot is enabled; absent when the firmware does not say.",
        "node",
        "moptd_secure_boot_enabled",
    ),
    SignalSpec(
        "driver.kernel_lockdown",
        "gauge",
        "bool",
        "1 when kernel lockdown (integrity or confidentiality) is active.",
        "node",
        "moptd_kernel_lockdown_active",
    ),
    SignalSpec(
        "driver.dev_node_present",
        "gauge",
        "bool",
        "1 when the /dev/nvidia* node exists as a character device.",
        "node",
        "moptd_driver_dev_node_present",
        ("node",),
    ),
    SignalSpec(
        "driver.dev_node_mode",
        "gauge",
        "",
        "Permission bits of the /dev/nvidia* node (e.g. 438 = 0666).",
        "node",
        "moptd_driver_dev_node_mode",
        ("node",),
    ),
    SignalSpec(
        "driver.dev_node_accessible",
        "gauge",
        "bool",
        "1 when the configured serving user may open the node read-write (owner, group "
        "and other bits; ACLs are not read).",
        "node",
        "moptd_driver_dev_node_accessible",
        ("node", "user"),
    ),
    SignalSpec(
        "driver.persistenced_running",
        "gauge",
        "bool",
        "1 when nvidia-persistenced is running.",
        "node",
        "moptd_driver_persistenced_running",
    ),
    SignalSpec(
        "driver.nvswitch_present",
        "gauge",
        "bool",
        "1 when NVSwitch devices exist (/proc/driver/nvidia-nvswitch/devices).",
        "node",
        "moptd_driver_nvswitch_present",
    ),
    SignalSpec(
        "driver.fabricmanager_running",
        "gauge",
        "bool",
        "1 when nvidia-fabricmanager is running; reported only where NVSwitches exist "
        "(rules/driver/fabric-manager.rules.yaml reads it).",
        "node",
        "moptd_driver_fabricmanager_running",
    ),
    SignalSpec(
        "driver.gsp_firmware_version",
        "info",
        "",
        "GSP firmware version per GPU (nvidia-smi -q); N/A where the GPU runs without GSP.",
        "gpu",
        "moptd_gpu_gsp_firmware_info",
        ("version",),
    ),
    # --- container runtime ---
    SignalSpec(
        "container.engine_present",
        "gauge",
        "bool",
        "1 when the container engine's daemon answers on its socket (docker, podman: "
        "GET /_ping and /info; containerd, crio: it accepts a connection), or listens "
        "where moptd may not ask (a socket it may not open, a socket-activated service "
        "not started); a CLI alone is 0. In a bundle, which has no socket, 1 on file "
        "evidence (docker's daemon.json).",
        "node",
        "moptd_container_engine_present",
        ("engine",),
    ),
    SignalSpec(
        "container.engine_status",
        "info",
        "",
        "What asking the engine's daemon gave, in words: where it answers, or why not "
        "(a CLI with no daemon is no engine); for `moptd status`.",
        "node",
        None,
        ("engine",),
    ),
    SignalSpec(
        "container.nvidia_runtime_configured",
        "gauge",
        "bool",
        "1 when the engine has the nvidia runtime: the running daemon's /info (docker, "
        "podman), else its configuration (daemon.json; containerd's config.toml with its "
        "imports; crio.conf with crio.conf.d).",
        "node",
        "moptd_container_nvidia_runtime_configured",
        ("engine",),
    ),
    SignalSpec(
        "container.cdi_enabled",
        "gauge",
        "bool",
        "1 when the engine injects CDI devices: a non-empty CDISpecDirs in /info (docker), "
        "podman always, containerd's enable_cdi (on by default from config version 3), "
        "CRI-O's cdi_spec_dirs.",
        "node",
        "moptd_container_cdi_enabled",
        ("engine",),
    ),
    SignalSpec(
        "container.config_valid",
        "gauge",
        "bool",
        "0 when a container configuration file or CDI spec cannot be parsed.",
        "node",
        "moptd_container_config_valid",
        ("file",),
    ),
    SignalSpec(
        "container.config_error",
        "info",
        "",
        "Why a container configuration file or CDI spec is malformed (text; for rules).",
        "node",
        None,
        ("file",),
    ),
    SignalSpec(
        "container.cdi_spec_driver_match",
        "gauge",
        "bool",
        "1 when the CDI spec names the running driver's version, 0 when another.",
        "node",
        "moptd_container_cdi_spec_driver_match",
        ("file",),
    ),
    SignalSpec(
        "container.cdi_spec",
        "info",
        "",
        "A CDI spec: its kind and the driver version its library paths name.",
        "node",
        "moptd_container_cdi_spec_info",
        ("file", "kind", "driver_version"),
    ),
    SignalSpec(
        "container.toolkit_version",
        "info",
        "",
        "nvidia-container-toolkit version (nvidia-ctk or nvidia-container-cli).",
        "node",
        "moptd_container_toolkit_info",
        ("version",),
    ),
]
