"""Driver collector: is the NVIDIA driver stack whole and consistent?

Loaded modules, kernel-module version against the user-space (NVML) version, DKMS build
against the running kernel, taint, Secure Boot and lockdown, /dev/nvidia* nodes and
whether the serving user can open them, nvidia-persistenced, fabric manager where
NVSwitches exist, GSP firmware. The cheap facts (files under /proc, /sys and /dev) are
read every pass; the costly ones (NVML init, ``dkms status``, ``nvidia-smi -q``) every
``slow_interval``. Files are read under the context's roots and everything else (tools,
NVML, device nodes, the kernel release) through its Source, so bundle replay runs this
same code over a bundle's kernel/ and host/ files (moptd.bundle). modprobe / insmod output
(why the kernel refused a module) is read from a file when one is named (``modprobe_log``;
a bundle's kernel/modprobe.txt): moptd never loads a module to find out.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from moptd.collector import Collector, CollectorContext, Option, Source, Unavailable
from moptd.host_source import source_of
from moptd.kernel.patterns import module_name
from moptd.observations import NODE, Batch, gpu_subject, labels_of
from moptd.proc.pci import pci_key

log = logging.getLogger(__name__)

MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-e98c0e5b6a9a"
_VERSION = re.compile(
    r"NVRM version: NVIDIA UNIX (?P<open>Open )?(?:\S+ )?Kernel Module(?: for \S+)?\s+"
    r"(?P<version>\d+\.\d+(?:\.\d+)?)"
)
_DKMS_TAIL = r", (?P<kernel>[^,\s]+)(?:, (?P<arch>[^:\s]+))?: (?P<status>.+)"
_DKMS_NEW = re.compile(r"(?P<module>[^/,\s]+)/(?P<version>[^,\s]+)" + _DKMS_TAIL)
_DKMS_OLD = re.compile(r"(?P<module>[^/,\s]+), (?P<version>[^,\s]+)" + _DKMS_TAIL)
_SMI_GPU = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_SMI_GSP = re.compile(r"^\s*GSP Firmware Version\s*:\s*(?P<version>.+?)\s*$")
_DEV_NODE = re.compile(r"nvidia(\d+|ctl|-uvm(-tools)?|-modeset)")
# What modprobe, insmod and systemd-modules-load print when the kernel refuses a module
# (kmod's "could not insert", module-init-tools' "FATAL: Error inserting", insmod with the
# file's path), after whatever prefix the paste has (a journal's "... gdm3[7055]: ").
# Matched in two parts around the words, found with str.find: one pattern over the whole
# line, all of its prefix optional, backtracked two \s* against each other at every position
# of a run of blanks (cubic: 110 s for "could not insert" and 4,000 spaces, in a paste).
_INSERT_WORDS = ("could not insert", "Error inserting", "Failed to insert")
_INSERT_PREFIX = re.compile(
    r"(?P<tool>modprobe|insmod|systemd-modules-load)?(?:\[\d+\])?:?\s*+(?:ERROR|FATAL)?:?\s*+\Z"
)
_INSERT_PREFIX_MAX = 64  # "systemd-modules-load[4294967295]: FATAL: " and its blanks
_INSERT_FAILED = re.compile(
    r"(?:could not insert (?:module )?'?(?P<kmod>[^'\s:]{1,255})'?"
    r"|Error inserting (?P<mit>\S{1,255})(?: \([^)]{0,512}\))?"
    r"|Failed to insert (?:module )?'(?P<sd>[^']{1,255})')"
    r": (?P<error>[^\n]{1,256}?)\s*$"
)
_NOT_FOUND = re.compile(
    r"(?P<tool>modprobe): (?:FATAL|ERROR): Module (?P<kmod>[\w-]{1,255}) not found"
)
# strerror of init_module(2)'s errno as kmod prints it -> the class a rule reads. The
# kernel returns EKEYREJECTED for a module whose signature is enforced and missing or not
# trusted, ENOKEY (older kernels) for a key it does not hold (kernel/module/signing.c,
# Documentation/admin-guide/module-signing.rst); ENODEV when the module's probe found no
# device it drives; ENOENT ("Unknown symbol in module") and ENOEXEC ("Exec format error",
# insmod's "Invalid module format") for a module built against another kernel or driver.
# EPERM ("Operation not permitted") from a root modprobe is the lockdown LSM refusing an
# unsigned module (module_sig_check: security_locked_down(LOCKDOWN_MODULE_SIGNATURE), with
# "Lockdown: modprobe: unsigned module loading is restricted" in the kernel log), else
# kernel.modules_disabled=1 or a container without CAP_SYS_MODULE: the rule decides.
MODPROBE_ERRORS = (
    ("Operation not permitted", "not_permitted"),
    ("Key was rejected by service", "key_rejected"),
    ("Required key not available", "key_unavailable"),
    ("No such device", "no_such_device"),
    ("Unknown symbol in module", "unknown_symbol"),
    ("Exec format error", "exec_format"),
    ("Invalid module format", "exec_format"),
)
MODPROBE_REFUSALS = frozenset({"key_rejected", "key_unavailable"})
# the NVIDIA stack's modules a modprobe failure is reported for (0 when it names none)
MODPROBE_MODULES = (*MODULES, "nvidia_fs", "nv_peer_mem", "gdrdrv")
# Ubuntu's versioned names of the same modules: nvidia_current, nvidia_367,
# nvidia_331_updates_uvm (the packages' modprobe aliases)
_NVIDIA_ALIAS = re.compile(
    r"nvidia_(?:current|\d{3})(?:_updates)?(?P<part>_uvm|_modeset|_drm|_peermem)?"
)


# --- parsers (shared with bundle replay) ---------------------------------------------
def parse_module_version(text: str) -> tuple[str, str] | None:
    """/proc/driver/nvidia/version -> (version, flavor open|proprietary)."""
    m = _VERSION.search(text)
    if m is None:
        return None
    return m.group("version"), "open" if m.group("open") else "proprietary"


def parse_proc_modules(text: str) -> set[str]:
    return {line.split(" ", 1)[0] for line in text.splitlines() if line.strip()}


@dataclass(frozen=True, slots=True)
class DkmsEntry:
    module: str
    version: str
    kernel: str
    arch: str
    status: str


def parse_dkms_status(text: str) -> list[DkmsEntry]:
    """``dkms status`` in the new (module/version, kernel, arch: status) and the old
    (module, version, kernel, arch: status) layouts; other lines are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        m = _DKMS_NEW.fullmatch(line) or _DKMS_OLD.fullmatch(line)
        if m is None:
            continue
        out.append(
            DkmsEntry(
                m.group("module"),
                m.group("version"),
                m.group("kernel"),
                m.group("arch") or "",
                m.group("status").strip(),
            )
        )
    return out


def dkms_kernel_match(entries: list[DkmsEntry], kernel: str) -> bool | None:
    """True: DKMS installed nvidia for the running kernel; False: only for others; None:
    DKMS does not manage nvidia here."""
    nvidia = [e for e in entries if e.module.startswith("nvidia")]
    if not nvidia:
        return None
    return any(e.kernel == kernel and e.status.startswith("installed") for e in nvidia)


@dataclass(frozen=True, slots=True)
class ModprobeFailure:
    module: str  # as /proc/modules spells it (nvidia, nvidia_fs, ...)
    error: str  # a class of MODPROBE_ERRORS, not_found, or other
    message: str  # the tool's words for it
    tool: str
    line: int


def modprobe_module(name: str) -> str:
    """The module a modprobe / insmod argument names: a file path or an alias reduced to
    the module (``/lib/.../nvidia-current.ko`` and Ubuntu's ``nvidia_current`` or
    ``nvidia_367`` are nvidia.ko)."""
    base = name.rsplit("/", 1)[-1]
    if base.endswith((".ko", ".ko.xz", ".ko.zst", ".ko.gz")):
        base = base[: base.index(".ko")]
    base = module_name(base)
    alias = _NVIDIA_ALIAS.fullmatch(base)
    return base if alias is None else "nvidia" + (alias.group("part") or "")


def _insert_failed(line: str) -> tuple[re.Match[str], str | None] | None:
    """The first "could not insert ..." (or its kin) that runs to the line's end, and the
    tool named just before it, if any."""
    starts = sorted(i for word in _INSERT_WORDS for i in _find_all(line, word))
    for at in starts:
        m = _INSERT_FAILED.match(line, at)
        if m is None:
            continue
        window = line[max(0, at - _INSERT_PREFIX_MAX) : at]
        prefix = _INSERT_PREFIX.search(window)
        return m, prefix.group("tool") if prefix is not None else None
    return None


def _find_all(line: str, word: str) -> list[int]:
    found, at = [], line.find(word)
    while at >= 0:
        found.append(at)
        at = line.find(word, at + 1)
    return found


def parse_modprobe_output(text: str) -> list[ModprobeFailure]:
    """The modules modprobe, insmod or systemd-modules-load failed to insert, with why;
    lines of other kinds (verbose ``insmod /lib/...``, other programs) are skipped."""
    out: list[ModprobeFailure] = []
    # lines end at "\n" only: splitlines() also breaks at \x1c-\x1e and \x85, which a
    # pasted text may hold inside a line (hypothesis found "...\x1e..." read as two lines)
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if len(line) > 4096:
            line = line[:4096]
        found = _insert_failed(line) if "nsert" in line else None
        if found is not None:
            m, tool_said = found
            name = m.group("kmod") or m.group("mit") or m.group("sd") or ""
            message = m.group("error").strip()
            error = next((c for t, c in MODPROBE_ERRORS if message.startswith(t)), "other")
            tool = tool_said or ("systemd-modules-load" if m.group("sd") else "modprobe")
            out.append(ModprobeFailure(modprobe_module(name), error, message, tool, n))
            continue
        nf = _NOT_FOUND.search(line) if "not found" in line else None
        if nf is not None:
            message = line[nf.start() :].split(": ", 2)[-1].strip()[:256]
            out.append(
                ModprobeFailure(
                    modprobe_module(nf.group("kmod")), "not_found", message, "modprobe", n
                )
            )
    return out


def is_modprobe_output(text: str) -> bool:
    """Whether a text holds any line modprobe, insmod or systemd-modules-load prints."""
    return any(
        tag in line
        for line in text.splitlines()
        for tag in ("modprobe", "insmod", "Failed to insert", "Error inserting")
    )


def parse_gsp_versions(smi_q: str) -> dict[str, str]:
    """``nvidia-smi -q`` text -> {pci bus id: GSP firmware version}."""
    out: dict[str, str] = {}
    bus = ""
    for line in smi_q.splitlines():
        m = _SMI_GPU.match(line)
        if m is not None:
            bus = pci_key(m.group("bus"))
            continue
        g = _SMI_GSP.match(line)
        if g is not None and bus:
            out[bus] = g.group("version")
    return out


def parse_secure_boot(data: bytes) -> bool | None:
    # efivarfs: 4 bytes of attributes, then the value byte
    if len(data) < 5:
        return None
    return data[4] == 1


MAX_MODPROBE_MODULES = 32  # module names one modprobe output may add beyond MODPROBE_MODULES


def modprobe_batch(b: Batch, failures: list[ModprobeFailure]) -> None:
    """The NVIDIA modules' failures as samples: for each module of MODPROBE_MODULES (and
    any other nvidia* module named) whether it failed to insert and whether the kernel
    refused its signature, 0 or 1, so a rule reads "not failed" where the output is there;
    and each distinct failure as driver.modprobe_error with the tool's words."""
    ours = [f for f in failures if f.module in MODPROBE_MODULES or f.module.startswith("nvidia")]
    named = sorted({f.module for f in ours} - set(MODPROBE_MODULES))[:MAX_MODPROBE_MODULES]
    for module in (*MODPROBE_MODULES, *named):
        failed = [f for f in ours if f.module == module]
        refused = any(f.error in MODPROBE_REFUSALS for f in failed)
        b.add("driver.modprobe_failed", NODE, float(bool(failed)), labels_of(module=module))
        b.add("driver.modprobe_refused", NODE, float(refused), labels_of(module=module))
        for error, message in sorted({(f.error, f.message) for f in failed}):
            labels = labels_of(module=module, error=error, message=message)
            b.add("driver.modprobe_error", NODE, 1.0, labels)


def user_can_open(st: os.stat_result, uid: int, gids: set[int]) -> bool:
    """Read-write by permission bits, as the kernel decides for a non-root user."""
    if uid == 0:
        return True
    mode = st.st_mode
    if st.st_uid == uid:
        return bool(mode & stat.S_IRUSR and mode & stat.S_IWUSR)
    if st.st_gid in gids:
        return bool(mode & stat.S_IRGRP and mode & stat.S_IWGRP)
    return bool(mode & stat.S_IROTH and mode & stat.S_IWOTH)


def user_ids(user: str) -> tuple[int, set[int]] | None:
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None
    gids = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    return pw.pw_uid, gids


def running_commands(procfs: Path) -> set[str]:
    """The comm of every process (truncated by the kernel to 15 characters)."""
    names: set[str] = set()
    try:
        entries = list(procfs.iterdir())
    except OSError:
        return names
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            names.add((entry / "comm").read_text().strip())
        except OSError:
            continue
    return names


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


@dataclass
class _Slow:
    at: float = -1e18
    user_version: str = ""
    user_source: str = ""
    dkms: list[DkmsEntry] | None = None
    gsp: dict[str, str] | None = None
    index_by_bus: dict[str, int] | None = None


class DriverCollector(Collector):
    name = "driver"
    default_interval = 30.0
    default_timeout = 30.0
    options: ClassVar[Mapping[str, Option]] = {
        "serving_user": Option(
            str, "", "User the serving engine runs as; /dev/nvidia* access is checked for it."
        ),
        "dev_dir": Option(
            str, "/dev", "Where the /dev/nvidia* nodes live (tests point elsewhere)."
        ),
        "slow_interval": Option(
            (int, float), 600, "Seconds between NVML, dkms and nvidia-smi -q reads."
        ),
        "use_tools": Option(bool, True, "Run dkms, nvidia-smi (false: files only)."),
        "modprobe_log": Option(
            str,
            "",
            "A file holding modprobe / insmod output to read (a provisioning log); empty: "
            "none. moptd never runs modprobe itself.",
        ),
    }

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._slow = _Slow()

    async def collect(self) -> Batch:
        return await self.blocking(self.read)

    def read(self) -> Batch:
        """One pass over the sources (blocking)."""
        proc, sys = self.ctx.procfs, self.ctx.sysfs
        source = source_of(self.ctx)
        recorded = self.ctx.recorded
        modules_text = _read(proc / "modules")
        if modules_text is None and not recorded:
            raise Unavailable(f"cannot read {proc / 'modules'}")
        b = Batch()
        loaded = parse_proc_modules(modules_text or "")
        if modules_text is not None:
            for module in MODULES:
                loaded_f = float(module in loaded)
                b.add("driver.module_loaded", NODE, loaded_f, labels_of(module=module))
        module_version: tuple[str, str] | None = None
        text = _read(proc / "driver/nvidia/version")
        if text is not None:
            module_version = parse_module_version(text)
        if module_version is None:
            sys_version = (_read(sys / "module/nvidia/version") or "").strip()
            if sys_version:
                module_version = (sys_version, "")
        if module_version is not None:
            b.add(
                "driver.kernel_module_version",
                NODE,
                1.0,
                labels_of(version=module_version[0], flavor=module_version[1]),
            )
        self._refresh_slow(proc, source)
        slow = self._slow
        if slow.user_version:
            b.add(
                "driver.user_space_version",
                NODE,
                1.0,
                labels_of(version=slow.user_version, source=slow.user_source),
            )
            if module_version is not None:
                match = slow.user_version == module_version[0]
                b.add("driver.nvml_version_match", NODE, float(match))
        kernel = (_read(proc / "sys/kernel/osrelease") or source.kernel_release() or "").strip()
        if slow.dkms is not None and kernel:
            verdict = dkms_kernel_match(slow.dkms, kernel)
            if verdict is not None:
                b.add("driver.dkms_kernel_match", NODE, float(verdict))
        tainted = (_read(proc / "sys/kernel/tainted") or "").strip()
        if tainted.isdigit():
            b.add("driver.tainted", NODE, float(int(tainted)))
        try:
            sb = parse_secure_boot((sys / "firmware/efi/efivars" / SECURE_BOOT_VAR).read_bytes())
        except OSError:
            sb = None
        if sb is not None:
            b.add("driver.secure_boot", NODE, float(sb))
        lockdown = _read(sys / "kernel/security/lockdown")
        if lockdown is not None:
            m = re.search(r"\[(\w+)\]", lockdown)
            if m:
                b.add("driver.kernel_lockdown", NODE, float(m.group(1) != "none"))
        self._dev_nodes(b, loaded, source)
        log_path = str(self.option("modprobe_log"))
        modprobe = _read(self.ctx.host_path(log_path)) if log_path else None
        if modprobe is not None:
            modprobe_batch(b, parse_modprobe_output(modprobe))
        if not recorded:  # a recording holds no process list and no NVSwitch directory
            commands = running_commands(proc)
            b.add("driver.persistenced_running", NODE, float("nvidia-persiste" in commands))
            try:
                nvswitch = any((proc / "driver/nvidia-nvswitch/devices").iterdir())
            except OSError:
                nvswitch = False
            b.add("driver.nvswitch_present", NODE, float(nvswitch))
            if nvswitch:
                running = float("nv-fabricmanage" in commands)
                b.add("driver.fabricmanager_running", NODE, running)
        for bus, version in (slow.gsp or {}).items():
            index = (slow.index_by_bus or {}).get(bus)
            subject = gpu_subject(index if index is not None else bus)
            b.add("driver.gsp_firmware_version", subject, 1.0, labels_of(version=version))
        return b

    def _refresh_slow(self, proc: Path, source: Source) -> None:
        now = time.monotonic()
        if now - self._slow.at < float(self.option("slow_interval")):
            return
        slow = _Slow(at=now)
        ids = source.gpu_identities(proc)
        slow.index_by_bus = dict(ids.index_by_bus)
        version = ids.user_version
        if version:
            slow.user_version, slow.user_source = version, ids.user_version_source
        if self.option("use_tools"):
            if not version:
                query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
                out = source.run(query)
                if out and out.strip():
                    slow.user_version = out.strip().splitlines()[0].strip()
                    slow.user_source = "nvidia-smi"
            dkms = source.run(["dkms", "status"])
            slow.dkms = None if dkms is None else parse_dkms_status(dkms)
            smi = source.run(["nvidia-smi", "-q"])
            slow.gsp = None if smi is None else parse_gsp_versions(smi)
        self._slow = slow

    def _dev_nodes(self, b: Batch, loaded: set[str], source: Source) -> None:
        dev = self.ctx.host_path(str(self.option("dev_dir")))
        listed = source.device_nodes(dev)
        if listed is None:
            return  # not recorded
        expected = ["nvidiactl", "nvidia-uvm"]
        if "nvidia_modeset" in loaded:
            expected.append("nvidia-modeset")
        present = sorted(name for name in listed if _DEV_NODE.fullmatch(name))
        user = str(self.option("serving_user"))
        ids = user_ids(user) if user else None
        if user and ids is None:
            log.debug("serving_user %s does not exist", user)
        for name in sorted(set(expected) | set(present)):
            st = listed[name] if name in listed else source.stat(dev / name)
            if st is None:
                b.add("driver.dev_node_present", NODE, 0.0, labels_of(node=name))
                continue
            is_chr = stat.S_ISCHR(st.st_mode)
            b.add("driver.dev_node_present", NODE, float(is_chr), labels_of(node=name))
            b.add(
                "driver.dev_node_mode", NODE, float(stat.S_IMODE(st.st_mode)), labels_of(node=name)
            )
            if ids is not None:
                ok = is_chr and user_can_open(st, ids[0], ids[1])
                b.add(
                    "driver.dev_node_accessible", NODE, float(ok), labels_of(node=name, user=user)
                )
