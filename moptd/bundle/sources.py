"""A bundle as the host, driver and container collectors' sources.

The collectors read files under filesystem roots and ask a Source (moptd.collector) for
the rest. Over a bundle, the roots are a temporary tree in the live layout holding the
bundle's copies of those files (host/meminfo becomes proc/meminfo, and so on: FILES), and
BundleSource answers from the files that stand for a call (df.txt for statvfs,
dkms_status.txt for `dkms status`, dev_nodes.txt for /dev). kernel/modprobe.txt is the
driver collector's modprobe_log. The collectors then run as they
do live, with ``recorded`` set: what the bundle does not hold is not emitted.

Before a file is used it is checked, so a malformed one is a BundleError naming the bundle
file and line rather than a silent absence.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from moptd.bundle.errors import BundleError
from moptd.bundle.meta import read_text
from moptd.collector import CollectorContext, DiskUsage, GpuIdentities
from moptd.collectors import container, driver
from moptd.collectors.container import ContainerCollector
from moptd.collectors.driver import DriverCollector
from moptd.collectors.host import HostCollector
from moptd.observations import Batch
from moptd.proc import procfs

# bundle file -> where a live host has it, under the tree's roots
FILES: tuple[tuple[str, str], ...] = (
    ("host/meminfo", "proc/meminfo"),
    ("host/swappiness", "proc/sys/vm/swappiness"),
    ("kernel/proc_modules", "proc/modules"),
    ("kernel/driver_version", "proc/driver/nvidia/version"),
    ("kernel/tainted", "proc/sys/kernel/tainted"),
    ("kernel/uname_r", "proc/sys/kernel/osrelease"),
    ("container/daemon.json", "etc/docker/daemon.json"),
)
DF = "host/df.txt"
DEV_NODES = "host/dev_nodes.txt"
DKMS = "kernel/dkms_status.txt"
MODPROBE = "kernel/modprobe.txt"  # modprobe / insmod output: the driver collector's modprobe_log
TOOLKIT = "container/toolkit_version.txt"
CDI = "container/cdi"
# files whose absence is reported as missing evidence
EXPECTED = (*(rel for rel, _ in FILES), DF, DEV_NODES, DKMS)
# the tool runs a bundle holds the output of
_TOOLS: dict[tuple[str, ...], str] = {
    ("dkms", "status"): DKMS,
    ("nvidia-ctk", "--version"): TOOLKIT,
    ("nvidia-container-cli", "--version"): TOOLKIT,
}
_DEV_LINE = re.compile(
    r"^(?P<mode>[-bcdlps][-rwxsStT]{9})\S*\s.*/dev/"
    r"(?P<name>nvidia(?:\d+|ctl|-uvm(?:-tools)?|-modeset))\s*$",
    re.MULTILINE,
)
_KINDS = {
    "-": stat.S_IFREG,
    "b": stat.S_IFBLK,
    "c": stat.S_IFCHR,
    "d": stat.S_IFDIR,
    "l": stat.S_IFLNK,
    "p": stat.S_IFIFO,
    "s": stat.S_IFSOCK,
}


@dataclass
class BundleSource:
    """moptd.collector.Source over a bundle's files (see the module docstring)."""

    root: Path
    disks: Mapping[str, DiskUsage]
    nodes: Mapping[str, os.stat_result | None] | None
    identities: GpuIdentities

    def disk_usage(self, path: Path) -> DiskUsage | None:
        return self.disks.get(str(path))

    def cpu_count(self) -> int | None:
        return None

    def kernel_release(self) -> str | None:
        return None  # kernel/uname_r is proc/sys/kernel/osrelease in the tree

    def run(self, argv: Sequence[str], search_path: str | None = None) -> str | None:
        rel = _TOOLS.get(tuple(argv))
        path = self.root / rel if rel else None
        return read_text(path) if path is not None and path.is_file() else None

    def engine_present(
        self, engine: str, binaries: Sequence[str], socket: Path, search_path: str | None
    ) -> bool | None:
        # docker's daemon.json in the bundle says docker is installed; nothing says the rest
        if engine == "docker" and (self.root / "container/daemon.json").is_file():
            return True
        return None

    def device_nodes(self, dev: Path) -> Mapping[str, os.stat_result | None] | None:
        return self.nodes

    def stat(self, path: Path) -> os.stat_result | None:
        return None  # not in `ls -l /dev/nvidia*`: absent

    def gpu_identities(self, procfs: Path) -> GpuIdentities:
        return self.identities


def collect_stack(
    root: Path, missing: list[str], identities: GpuIdentities
) -> list[tuple[str, Batch]]:
    """The host, driver and container collectors over the bundle at ``root``: (source
    name, batch) for each that has samples. Absent files are added to ``missing``."""
    for rel in EXPECTED:
        if not (root / rel).exists():
            missing.append(rel)
    with tempfile.TemporaryDirectory(prefix="moptd-bundle-tree-") as tmp:
        tree = Path(tmp)
        for rel, live in FILES:
            src = root / rel
            if src.exists():
                text = read_text(src)
                _CHECKS.get(rel, _no_check)(text, str(src))
                _put(tree / live, text)
        for spec in _cdi_specs(root):
            text = read_text(spec)
            try:
                container.parse_cdi_spec(text, str(spec))
            except container.ConfigError as e:
                raise _config_error(e) from None
            _put(tree / "etc/cdi" / spec.name, text)
        source = BundleSource(root, _disks(root), _dev_nodes(root), identities)
        driver_options = _modprobe_log(root, tree, {"use_tools": True})
        host = HostCollector(
            _context(tree, source, global_options={"watch_paths": list(source.disks)})
        )
        drv = DriverCollector(_context(tree, source, options=driver_options))
        ctr = ContainerCollector(_context(tree, source, options={"cdi_dirs": ["/etc/cdi"]}))
        try:
            batches = [("host", host.read()), ("driver", drv.read()), ("container", ctr.read())]
        finally:
            host.close()
    return [(name, b) for name, b in batches if b.samples]


def _context(
    tree: Path,
    source: BundleSource,
    options: Mapping[str, object] | None = None,
    global_options: Mapping[str, object] | None = None,
) -> CollectorContext:
    return CollectorContext(
        options=options or {},
        procfs=tree / "proc",
        sysfs=tree / "sys",
        devfs=tree / "dev",
        etc=tree / "etc",
        source=source,
        recorded=True,
        global_options=global_options or {},
    )


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", errors="surrogateescape")


def _cdi_specs(root: Path) -> list[Path]:
    folder = root / CDI
    if not folder.is_dir():
        return []
    return [p for p in sorted(folder.iterdir()) if p.suffix in (".yaml", ".yml", ".json")]


# --- kernel/modprobe.txt: the driver collector's modprobe_log -------------------------


def _modprobe_log(root: Path, tree: Path, options: dict[str, object]) -> dict[str, object]:
    """The driver collector's options with ``modprobe_log`` naming the tree's file of
    modprobe / insmod output: kernel/modprobe.txt (checked first), and the failure lines
    a kernel log of the bundle holds (a whole journal pasted as one: "gdm3[7055]: modprobe:
    ERROR: could not insert 'nvidia': ..." is no kernel record, and would be lost)."""
    texts: list[str] = []
    path = root / MODPROBE
    if path.exists():
        text = read_text(path)
        _check_modprobe(text, str(path))
        texts.append(text)
    for log in sorted((root / "kernel").glob("dmesg*.txt")):
        texts.extend(_modprobe_lines(log))
    if not texts:
        return options
    _put(tree / "modprobe.txt", "\n".join(texts) + "\n")
    return {**options, "modprobe_log": str(tree / "modprobe.txt")}


def _modprobe_lines(log: Path) -> list[str]:
    out: list[str] = []
    try:
        with log.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if ("nsert" in line or "not found" in line) and len(out) < 256:
                    if driver.parse_modprobe_output(line):
                        out.append(line.rstrip("\n")[:4096])
    except OSError as e:
        raise BundleError(str(log), 0, f"cannot read: {e.strerror or e}") from None
    return out


def _check_modprobe(text: str, file: str) -> None:
    if not driver.is_modprobe_output(text):
        raise BundleError(file, 1, "no modprobe, insmod or systemd-modules-load line")


# --- checks: a present file must be what its name says ------------------------------


def _no_check(text: str, file: str) -> None:
    pass


def _check_meminfo(text: str, file: str) -> None:
    if "MemTotal" not in procfs.parse_meminfo(text):
        raise BundleError(file, 1, "no MemTotal line: not a copy of /proc/meminfo")


def _check_swappiness(text: str, file: str) -> None:
    if procfs.parse_int(text) is None:
        raise BundleError(file, 1, f"not a number: {text.strip()[:40]!r}")


def _check_modules(text: str, file: str) -> None:
    if text.strip() and not any(len(line.split()) >= 3 for line in text.splitlines()):
        raise BundleError(file, 1, "not a copy of /proc/modules")


def _check_driver_version(text: str, file: str) -> None:
    if driver.parse_module_version(text) is None:
        raise BundleError(file, 1, "no 'NVRM version' line")


def _check_daemon_json(text: str, file: str) -> None:
    try:
        container.parse_daemon_json(text, file)
    except container.ConfigError as e:
        raise _config_error(e) from None


_CHECKS: dict[str, Callable[[str, str], None]] = {
    "host/meminfo": _check_meminfo,
    "host/swappiness": _check_swappiness,
    "kernel/proc_modules": _check_modules,
    "kernel/driver_version": _check_driver_version,
    "container/daemon.json": _check_daemon_json,
}


def _config_error(e: Exception) -> BundleError:
    # The container parsers say "FILE:LINE: message" (or "FILE: message").
    m = re.match(r"(.*?):(\d+): (.*)", str(e))
    if m:
        return BundleError(m.group(1), int(m.group(2)), m.group(3))
    file, _, msg = str(e).partition(": ")
    return BundleError(file, 0, msg)


# --- the files that stand for a call --------------------------------------------------


def _disks(root: Path) -> dict[str, DiskUsage]:
    path = root / DF
    return parse_df_usage(read_text(path), str(path)) if path.exists() else {}


def parse_df_usage(text: str, file: str) -> dict[str, DiskUsage]:
    """`df -P` output -> usage by mount point, as statvfs would give it."""
    rows = procfs.parse_df(text)
    if text.strip() and not rows:
        raise BundleError(file, 1, "no filesystem line: not the output of df -P")
    out: dict[str, DiskUsage] = {}
    for row in rows:
        size, used, avail = (int(str(row[k])) for k in ("size", "used", "available"))
        out.setdefault(str(Path(str(row["mount"]))), DiskUsage(size, used, avail))
    return out


def _dev_nodes(root: Path) -> dict[str, os.stat_result | None] | None:
    path = root / DEV_NODES
    return parse_dev_nodes(read_text(path)) if path.exists() else None


def parse_dev_nodes(text: str) -> dict[str, os.stat_result | None]:
    """`ls -l /dev/nvidia*` -> the nodes with their type and mode."""
    out: dict[str, os.stat_result | None] = {}
    for m in _DEV_LINE.finditer(text):
        mode = _mode(m.group("mode"))
        # owner and group are names on the recorded host; no ids to compare here
        out[m.group("name")] = os.stat_result((mode, 0, 0, 1, -1, -1, 0, 0, 0, 0))
    return out


def _mode(perm: str) -> int:
    """`ls -l`'s "crw-rw-rw-" -> st_mode."""
    mode = _KINDS[perm[0]]
    for i, ch in enumerate(perm[1:10]):
        shift = 6 - 3 * (i // 3)
        pos = i % 3
        if ch in "rwx" and ch == "rwx"[pos]:
            mode |= (4 >> pos) << shift
        elif ch in "sStT" and pos == 2:
            if ch in "st":
                mode |= 1 << shift
            mode |= (stat.S_ISUID, stat.S_ISGID, stat.S_ISVTX)[i // 3]
    return mode
