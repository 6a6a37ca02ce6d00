"""Host signals (subject ``node``): memory, swap, CPU, load, disks, vm.swappiness."""

from moptd.catalog.spec import SignalSpec


def _n(
    name: str, kind: str, unit: str, help: str, metric: str | None, labels: tuple[str, ...] = ()
) -> SignalSpec:
    return SignalSpec(f"node.{name}", kind, unit, help, "node", metric, labels)  # type: ignore[arg-type]


SIGNALS = [
    _n(
        "memory_total",
        "gauge",
        "bytes",
        "Host memory size (MemTotal).",
        "moptd_node_memory_total_bytes",
    ),
    _n(
        "memory_available",
        "gauge",
        "bytes",
        "Host memory available for new work (MemAvailable).",
        "moptd_node_memory_available_bytes",
    ),
    _n(
        "memory_available_ratio",
        "gauge",
        "ratio",
        "MemAvailable / MemTotal.",
        "moptd_node_memory_available_ratio",
    ),
    _n("swap_total", "gauge", "bytes", "Swap space size.", "moptd_node_swap_total_bytes"),
    _n("swap_used", "gauge", "bytes", "Swap space in use.", "moptd_node_swap_used_bytes"),
    _n(
        "swap_in",
        "counter",
        "bytes",
        "Bytes swapped in since boot (pswpin).",
        "moptd_node_swap_in_bytes_total",
    ),
    _n(
        "swap_out",
        "counter",
        "bytes",
        "Bytes swapped out since boot (pswpout).",
        "moptd_node_swap_out_bytes_total",
    ),
    _n(
        "cpu_util",
        "gauge",
        "ratio",
        "Busy share of all CPUs since the previous collection.",
        "moptd_node_cpu_utilization_ratio",
    ),
    _n("cpu_count", "gauge", "count", "Logical CPUs.", "moptd_node_cpus"),
    _n("load1", "gauge", "", "1-minute load average.", "moptd_node_load1"),
    _n("load5", "gauge", "", "5-minute load average.", "moptd_node_load5"),
    _n("load15", "gauge", "", "15-minute load average.", "moptd_node_load15"),
    _n(
        "disk_total",
        "gauge",
        "bytes",
        "Size of the file system holding a watched path.",
        "moptd_node_filesystem_size_bytes",
        ("path",),
    ),
    _n(
        "disk_available",
        "gauge",
        "bytes",
        "Space available to unprivileged users on the file system holding a watched path.",
        "moptd_node_filesystem_available_bytes",
        ("path",),
    ),
    _n(
        "disk_used_ratio",
        "gauge",
        "ratio",
        "Used share of the file system holding a watched path.",
        "moptd_node_filesystem_used_ratio",
        ("path",),
    ),
    _n("swappiness", "gauge", "", "vm.swappiness.", "moptd_node_vm_swappiness"),
    _n(
        "kernel_release",
        "info",
        "",
        "The running kernel's release (/proc/sys/kernel/osrelease); exported as "
        'moptd_software_version_info{component="kernel"}.',
        None,
        ("release",),
    ),
    # WSL2 (moptd/proc/wsl.py, docs/wsl.md): the GPU belongs to the Windows driver there.
    _n(
        "wsl2",
        "gauge",
        "",
        "1 when the host is a WSL2 guest (a microsoft-standard kernel release or /dev/dxg), "
        "0 when its kernel release says otherwise.",
        "moptd_node_wsl2",
    ),
    _n(
        "wsl_lib_present",
        "gauge",
        "",
        "On WSL2: 1 when the Windows driver's libcuda.so.1 is in /usr/lib/wsl/lib.",
        "moptd_node_wsl_lib_present",
    ),
    _n(
        "wsl_guest_driver_libs",
        "gauge",
        "count",
        "On WSL2: libraries of a Linux NVIDIA driver installed inside the guest "
        "(libcuda.so.NNN.x, libnvidia-*.so.NNN.x), which shadow the Windows driver's.",
        "moptd_node_wsl_guest_driver_libraries",
    ),
    _n(
        "boot_time",
        "gauge",
        "seconds",
        "Unix time the host booted.",
        "moptd_node_boot_time_seconds",
    ),
]
