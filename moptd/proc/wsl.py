"""Windows Subsystem for Linux 2: is this host a WSL2 guest, and what of NVIDIA's is in it.

Pure functions over what the host collector reads (moptd/collectors/host.py). What holds on
WSL2 comes from NVIDIA's CUDA on WSL User Guide (docs.nvidia.com/cuda/wsl-user-guide/): the
Windows driver is the GPU driver; it is exposed to the guest through /dev/dxg and its
user-space libraries mounted at /usr/lib/wsl/lib (libcuda.so.1 is a stub of the Windows
driver there), and "users must not install any NVIDIA GPU Linux driver within WSL 2". There is
no nvidia kernel module and no /dev/nvidia* node in a WSL2 guest, by design (docs/wsl.md).

The kernel release tells the WSL generation: WSL2 runs Microsoft's Linux kernel,
``5.15.167.4-microsoft-standard-WSL2`` (4.19 kernels: ``4.19.128-microsoft-standard``); WSL1
has no Linux kernel and reports ``4.4.0-19041-Microsoft``, and has no GPU support at all.
"""

from __future__ import annotations

import re

WSL_LIB_DIR = "/usr/lib/wsl/lib"
# Where a Linux driver's user-space libraries land: the .run installer and the distribution
# packages (libnvidia-compute-NNN, nvidia-utils-NNN, the CUDA repository's cuda-drivers).
GUEST_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu")

_WSL2_RELEASE = re.compile(r"-microsoft-standard(?:-WSL2)?\b", re.IGNORECASE)
# WSL1: "4.4.0-19041-Microsoft" (the Windows build), /proc/version "... (Microsoft@Microsoft.com)"
_WSL1_RELEASE = re.compile(r"^\d+\.\d+\.\d+-\d+-Microsoft\b")
# A Linux driver's libraries carry its version (libcuda.so.535.104.05,
# libnvidia-ml.so.550.54.14, libnvoptix.so.470.57.02); the Windows driver's stubs in
# /usr/lib/wsl/lib do not (libcuda.so.1.1, libnvidia-ml.so.1).
_DRIVER_LIB = re.compile(
    r"lib(?:cuda|nvcuvid|nvoptix|nvidia-[a-z0-9-]{1,40})\.so\.(?P<version>\d{3}\.\d{1,3}(?:\.\d{1,3})?)"
)


def release_of(text: str) -> str:
    """The kernel release in ``uname -r``, ``uname -a`` or /proc/version text ("" if none)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    m = re.match(r"Linux version (\S+)", line)
    if m is not None:
        return m.group(1)
    m = re.match(r"Linux \S+ (\S+) ", line)  # uname -a: Linux HOST RELEASE #N ...
    if m is not None:
        return m.group(1)
    return line.split()[0] if line and " " not in line.strip() else ""


def wsl_generation(release: str) -> int:
    """2 for a WSL2 kernel release, 1 for WSL1's, 0 for anything else."""
    if _WSL2_RELEASE.search(release):
        return 2
    if _WSL1_RELEASE.match(release):
        return 1
    return 0


def guest_driver_libraries(names: list[str]) -> list[str]:
    """The names, of files in a guest library directory, that belong to a Linux NVIDIA driver
    (versioned like the driver): on WSL2 they shadow the Windows driver's libraries."""
    return sorted(n for n in names if _DRIVER_LIB.fullmatch(n))


def driver_version_of(name: str) -> str:
    m = _DRIVER_LIB.fullmatch(name)
    return m.group("version") if m else ""


def has_cuda_stub(names: list[str]) -> bool:
    """/usr/lib/wsl/lib holds the Windows driver's libcuda.so.1, which CUDA loads."""
    return "libcuda.so.1" in names


# A path in a listing: `ls -l DIR` lines end in the name (or the path), `ldconfig -p` lines in
# "=> /path", nvidia-container-cli's debug log in "selecting /path".
_PATH = re.compile(r"(/[\w.+-]+(?:/[\w.+-]+)*)")
_LS_NAME = re.compile(r"^[-lcbdps][-rwxsStT]{9}\S*\s.*\s(?P<name>[^\s/]+)(?: -> \S+)?$")


def listed_names(text: str, directories: tuple[str, ...]) -> list[str]:
    """The names of files in ``directories`` a listing names: absolute paths under one of
    them (ls of the files, ``ldconfig -p``, nvidia-container-cli's "selecting" lines), and the
    bare names of ``ls -l DIR`` lines (the listing is of one of them). Bounded: 100,000
    lines, 4 KiB a line."""
    prefixes = tuple(d.rstrip("/") + "/" for d in directories)
    names: set[str] = set()
    for line in text.splitlines()[:100_000]:
        line = line[:4096]
        found = False
        for m in _PATH.finditer(line):
            path = m.group(1)
            for prefix in prefixes:
                if path.startswith(prefix) and "/" not in path[len(prefix) :]:
                    names.add(path[len(prefix) :])
                    found = True
        if not found:
            ls = _LS_NAME.match(line.strip())
            if ls is not None:
                names.add(ls.group("name"))
    return sorted(names)
