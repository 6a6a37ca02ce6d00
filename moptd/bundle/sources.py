"""A bundle as the host, driver and container collectors' sources.

The collectors read files under filesystem roots and ask a Source (moptd.collector) for
the rest. Over a bundle, the roots are a temporary tree in the live layout holding the
bundle's copies of those files (host/meminfo becomes proc/meminfo, and so on: FILES), and
BundleSource answers from the files that stand for a call (df.txt for statvfs,
dkms_status.txt for `dkms status`, dev_nodes.txt for /dev). kernel/modprobe.txt is the
driver collector's modprobe_log. The collectors then run as they
do live, with ``recorded`` set: what the bundle does not hold is not emitted.

Before a file is used it is checked, so a malformed one is a BundleError naming the bundle
file and line rather than a silent absence. Pasted command output is taken where the file
stands for it: ``lsmod`` (or ``lsmod | grep nvidia``) for kernel/proc_modules, with the
command line and lsmod's header dropped; ``ls -l /dev/nvidia*`` with its ``total`` and
directory lines, or ls's "No such file or directory" (no node) for host/dev_nodes.txt;
``dkms status`` in both layouts, with dkms's own error lines, for kernel/dkms_status.txt;
``uname -a`` as well as ``uname -r`` for kernel/uname_r.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from moptd.bundle.errors import BundleError
from moptd.bundle.meta import read_text
from moptd.clock import VirtualClock
from moptd.collector import CollectorContext, DiskUsage, GpuIdentities
from moptd.collectors import container, driver
from moptd.collectors.container import ContainerCollector
from moptd.collectors.daemon_journals import UNIT_EMITTER, DaemonJournalCollector, journal_argv
from moptd.collectors.driver import DriverCollector
from moptd.collectors.host import HostCollector
from moptd.kernel.daemon_log import EMITTERS, parse_daemon_log
from moptd.observations import Batch, Event
from moptd.proc import procfs, wsl

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
# WSL2 (docs/wsl.md): `ls -l /usr/lib/wsl/lib`, and any listing naming the guest's driver
# libraries (ls, ldconfig -p, nvidia-container-cli's "selecting /path" lines)
WSL_LIB = "host/wsl_lib.txt"
GUEST_LIBS = "host/guest_libs.txt"
# the NVIDIA daemons' journals (journalctl -u UNIT -b -o short-iso), Fabric Manager's own log
# file, and nvidia-container-cli's errors as the container engines passed them on (their
# journals' lines, docker's error): the daemon_logs collector's sources
JOURNAL_DIR = "host/journal"
DAEMON_JOURNALS = {unit: f"{JOURNAL_DIR}/{unit}.txt" for unit in UNIT_EMITTER}
FABRICMANAGER_LOG = "host/fabricmanager.log"
CONTAINER_CLI_ERRORS = "container/cli_errors.txt"
CONTAINER_UNITS = ("docker", "containerd")
# files whose absence is reported as missing evidence
EXPECTED = (*(rel for rel, _ in FILES), DF, DEV_NODES, DKMS)
# the tool runs a bundle holds the output of
_TOOLS: dict[tuple[str, ...], str] = {
    ("dkms", "status"): DKMS,
    ("nvidia-ctk", "--version"): TOOLKIT,
    ("nvidia-container-cli", "--version"): TOOLKIT,
    **{tuple(journal_argv([unit])): rel for unit, rel in DAEMON_JOURNALS.items()},
    tuple(journal_argv(list(CONTAINER_UNITS))): CONTAINER_CLI_ERRORS,
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
                text = _CHECKS.get(rel, _no_check)(read_text(src), str(src))
                _put(tree / live, text)
        for spec in _cdi_specs(root):
            text = read_text(spec)
            try:
                container.parse_cdi_spec(text, str(spec))
            except container.ConfigError as e:
                raise _config_error(e) from None
            _put(tree / "etc/cdi" / spec.name, text)
        if (root / DKMS).is_file():
            check_dkms_status(read_text(root / DKMS), str(root / DKMS))
        source = BundleSource(root, _disks(root), _dev_nodes(root), identities)
        driver_options = _modprobe_log(root, tree, {"use_tools": True})
        host = HostCollector(
            _context(
                tree,
                source,
                options=_wsl_dirs(root, tree),
                global_options={"watch_paths": list(source.disks)},
            )
        )
        drv = DriverCollector(_context(tree, source, options=driver_options))
        ctr = ContainerCollector(_context(tree, source, options={"cdi_dirs": ["/etc/cdi"]}))
        try:
            batches = [("host", host.read()), ("driver", drv.read()), ("container", ctr.read())]
        finally:
            host.close()
    return [(name, b) for name, b in batches if b.samples]


def daemon_log_events(
    root: Path, identities: GpuIdentities, at: float | None
) -> tuple[list[Event], list[str]]:
    """The daemon_logs collector over the bundle's journals, Fabric Manager log and
    container-cli errors: (its events, the files it read). ``at`` (captured_at, else the
    first evidence's time) dates the year-less stamps and the lines with no time."""
    held = [
        rel for rel in (*DAEMON_JOURNALS.values(), CONTAINER_CLI_ERRORS) if (root / rel).is_file()
    ]
    log = root / FABRICMANAGER_LOG
    if log.is_file():
        held.append(FABRICMANAGER_LOG)
    source = BundleSource(root, {}, None, identities)
    options = {
        "fabricmanager_log": str(log) if log.is_file() else "",
        "container_units": list(CONTAINER_UNITS),
    }
    clock = VirtualClock(at or 0.0)
    ctx = CollectorContext(options=options, source=source, recorded=True, clock=clock)
    collector = DaemonJournalCollector(ctx)
    events = collector.read().events
    # a whole journal pasted as a kernel log (`journalctl -b`) holds the daemons' lines too:
    # the kernel parser passes over them (another program's), they are read here
    year = datetime.fromtimestamp(at or 0.0, UTC).year
    for log in sorted((root / "kernel").glob("dmesg*.txt")):
        recs = [r for r in parse_daemon_log(read_text(log), None, year) if r.emitter in EMITTERS]
        if recs:
            rel = log.relative_to(root).as_posix()
            events.extend(collector.reader.events(recs, rel, at or 0.0))
            held.append(rel)
    return events, held


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


def _wsl_dirs(root: Path, tree: Path) -> dict[str, object]:
    """The host collector's WSL directories, laid out in the tree from the bundle's
    listings (empty files at the names they list), for the files the bundle holds."""
    options: dict[str, object] = {}
    for rel, dirs, key in (
        (WSL_LIB, (wsl.WSL_LIB_DIR,), "wsl_lib_dir"),
        (GUEST_LIBS, wsl.GUEST_LIB_DIRS, "guest_lib_dirs"),
    ):
        path = root / rel
        if not path.is_file():
            continue
        text = read_text(path)
        names = wsl.listed_names(text, dirs)
        if not names and "No such file or directory" not in text:
            raise BundleError(
                str(path), 1, f"names no file of {', '.join(dirs)} (paste the output of ls -l)"
            )
        folder = tree / "wsl" / key
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).touch()
        options[key] = str(folder) if key == "wsl_lib_dir" else [str(folder)]
    return options


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


def _no_check(text: str, file: str) -> str:
    return text


def _check_meminfo(text: str, file: str) -> str:
    if "MemTotal" not in procfs.parse_meminfo(text):
        raise BundleError(file, 1, "no MemTotal line: not a copy of /proc/meminfo")
    return text


def _check_swappiness(text: str, file: str) -> str:
    if procfs.parse_int(text) is None:
        raise BundleError(file, 1, f"not a number: {text.strip()[:40]!r}")
    return text


# /proc/modules: "nvidia 14299136 - - Live 0x... (O)"; lsmod: "nvidia  34086912  1 nvidia_modeset"
_MODULE_LINE = re.compile(r"^[A-Za-z0-9_-]+\s+\d+\s+(?:\d+|-)(?:\s.*)?$")
_LSMOD_HEADER = re.compile(r"^Module\s+Size\s+Used by\s*$")
# the command a paste starts with: "$ lsmod | grep nvidia", "root@host:~# cat /proc/modules"
_COMMAND_LINE = re.compile(r"(?:^|[$#]\s*)(?:sudo\s+)?(?:lsmod|cat\s+/proc/modules)\b")


def modules_text(text: str, file: str) -> str:
    """/proc/modules or lsmod output -> the module lines (/proc/modules' first columns);
    BundleError naming the first line that is neither."""
    kept: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or _LSMOD_HEADER.match(s) or _COMMAND_LINE.search(s):
            continue
        if not _MODULE_LINE.match(s):
            raise BundleError(
                file, lineno, "not a copy of /proc/modules or the output of lsmod: " + repr(s[:60])
            )
        kept.append(s)
    return "".join(f"{line}\n" for line in kept)


# `uname -r`: "5.15.0-91-generic"; `uname -a`: "Linux host 5.15.0-91-generic #101-Ubuntu SMP ..."
_RELEASE = re.compile(r"^\d+\.\d+[\w.+~-]*$")
_UNAME_A = re.compile(r"^Linux \S+ (?P<release>\d+\.\d+[\w.+~-]*) ")


def kernel_release_text(text: str, file: str) -> str:
    """``uname -r`` output (or ``uname -a``, which holds it as its third field) -> the
    release alone, as /proc/sys/kernel/osrelease holds it; a shell prompt or the command
    line is skipped; BundleError naming the first other line."""
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or re.search(r"(?:^|[$#]\s*)uname\b", s):
            continue
        if _RELEASE.match(s):
            return s + "\n"
        m = _UNAME_A.match(s)
        if m is not None:
            return m.group("release") + "\n"
        raise BundleError(file, lineno, f"not the output of uname -r: {s[:60]!r}")
    return ""


def _check_driver_version(text: str, file: str) -> str:
    if driver.parse_module_version(text) is None:
        raise BundleError(file, 1, "no 'NVRM version' line")
    return text


def _check_daemon_json(text: str, file: str) -> str:
    try:
        container.parse_daemon_json(text, file)
    except container.ConfigError as e:
        raise _config_error(e) from None
    return text


_CHECKS: dict[str, Callable[[str, str], str]] = {
    "host/meminfo": _check_meminfo,
    "host/swappiness": _check_swappiness,
    "kernel/proc_modules": modules_text,
    "kernel/driver_version": _check_driver_version,
    "kernel/uname_r": kernel_release_text,
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
    if not path.exists():
        return None
    text = read_text(path)
    check_dev_nodes(text, str(path))
    return parse_dev_nodes(text)


# ls's message when the glob matched nothing: "ls: cannot access '/dev/nvidia*': No such
# file or directory" (older coreutils print the path without quotes)
_NO_NODE = re.compile(
    r"^(?:ls: )?cannot access '?/dev/nvidia[^:]*'?: No such file or directory", re.MULTILINE
)
_NAME_ONLY = re.compile(r"^/dev/nvidia\S*$")


def check_dev_nodes(text: str, file: str) -> None:
    """host/dev_nodes.txt must be ``ls -l /dev/nvidia*`` output: a node line, or ls saying
    there is no node. A names-only listing (``ls -1``) shows neither type nor mode."""
    if not text.strip() or _DEV_LINE.search(text) or _NO_NODE.search(text):
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if _NAME_ONLY.match(line.strip()):
            raise BundleError(
                file,
                lineno,
                "names only (ls -1): node types and modes are not shown; "
                "paste the output of ls -l /dev/nvidia*",
            )
    raise BundleError(file, 1, "no /dev/nvidia* line: not the output of ls -l /dev/nvidia*")


# dkms's own messages ("Error! Could not locate dkms.conf file.", "File: ... does not
# exist.", "Warning: ...", "Deprecated feature: ...") and the command line of a paste
_DKMS_MESSAGE = re.compile(
    r"^(?:Error!|Warning:|WARNING|File:|Deprecated feature:|Consult|Please)|(?:^|[$#]\s*)"
    r"(?:sudo\s+)?dkms\b"
)


# a module DKMS knows but built for no kernel: "nvidia/535.104.05: added" (the old layout
# "nvidia, 535.104.05: added"); the driver collector reads no kernel from it
_DKMS_UNBUILT = re.compile(r"^[^/,\s]+(?:/|, )[^,\s]+: \S.*$")


def check_dkms_status(text: str, file: str) -> None:
    """kernel/dkms_status.txt must be ``dkms status`` output: its entries (both layouts)
    or dkms's own error lines; anything else is named with its line."""
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or _DKMS_MESSAGE.search(s) or _DKMS_UNBUILT.match(s):
            continue
        if driver.parse_dkms_status(s):
            continue
        raise BundleError(file, lineno, f"not a line of dkms status output: {s[:60]!r}")


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


# --- sorting a paste by content -------------------------------------------------------


def host_paste_place(text: str) -> str | None:
    """Where a pasted host file belongs in a bundle, by its content: kernel/proc_modules
    (/proc/modules or lsmod), kernel/driver_version, host/dev_nodes.txt (ls -l
    /dev/nvidia*), kernel/dkms_status.txt; None when it is none of them (or is empty)."""
    if not text.strip():
        return None
    if driver.parse_module_version(text) is not None:
        return "kernel/driver_version"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if (
        _DEV_LINE.search(text)
        or _NO_NODE.search(text)
        or any(_NAME_ONLY.match(line) for line in lines)
    ):
        return DEV_NODES  # a names-only listing too: its check says what to paste instead
    if driver.parse_dkms_status(text) or "dkms" in text:
        return DKMS if _passes(check_dkms_status, text) else None
    if any(_MODULE_LINE.match(line) or _COMMAND_LINE.search(line) for line in lines):
        return "kernel/proc_modules" if _passes(modules_text, text) else None
    # a release names a build ("-generic", "_1", ".fc41"): a bare "535.104.05" is a driver
    if any(_UNAME_A.match(line) or re.search(r"[-_+~a-z]", line) for line in lines):
        return "kernel/uname_r" if _passes(kernel_release_text, text) else None
    return None


def _passes(check: Callable[[str, str], object], text: str) -> bool:
    try:
        check(text, "")
    except BundleError:
        return False
    return True
