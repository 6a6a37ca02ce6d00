"""Matchers for the kernel-log messages that matter on a GPU host.

Each message form is quoted, with its source, in docs/xid.md and the tests. The matcher is
keyed on the text only (never the facility: a line a test writes to /dev/kmsg arrives as
a "user" record) and is fed line by line, because the same message arrives as one record
with embedded newlines (kmsg, syslog ``#012``) or as several records (dmesg). The little
state it keeps for multi-line messages is bounded.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from moptd.proc.info import parse_cgroup
from moptd.proc.pci import pci_key

_BUS = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"

XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>" + _BUS + r")"
    r"(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\): (?P<code>\d{1,6})(?:,\s*(?P<rest>.*))?"
)
_PID_NAME = re.compile(
    r"pid=(?P<pid>'<unknown>'|<unknown>|\d+)(?:, name=(?P<name>[^,]*))?(?:, (?P<msg>.*))?"
)
_CAUSED_BY = re.compile(r"caused by previous Xid (?P<code>\d{1,6})")
# NVLink5 (Xid 144-150): "<unit> <severity> XC<n> i<n> Link <nn> (<intrinfo> <errorstatus> ...)".
# The driver pads the columns ("NETIR_LINK_EVT  Fatal   XC0"), a unit may name a sub-unit
# ("TLW_RX/TLW_RX_PIPE0") and "Link -1" means the error concerns no particular link.
_NVLINK5 = re.compile(
    r"(?P<unit>[A-Z][A-Z0-9_]{0,63}(?:/[A-Z][A-Z0-9_]{0,63}){0,3}) +"
    r"(?P<sev>Fatal|Nonfatal|Non-fatal|NonFatal|Link Fatal)\b"
    r"(?: +XC(?P<xc>\d{1,3}))?(?: +i(?P<inst>\d{1,3}))?(?: +Link +(?P<link>-1|\d{1,4}))?"
    r"(?: +\((?P<intr>0x[0-9a-fA-F]{1,16})(?: +(?P<status>0x[0-9a-fA-F]{1,16}))?)?"
)
# Older NVLink Xid 74: "NVLink: fatal error detected on link 14(0x0, 0x0, ...)"
_NVLINK_LINK = re.compile(r"NVLink: .{0,64}?\bon link (?P<link>\d{1,4})\b")
# Where an Xid 13 or 31 hit (NVIDIA's Xid 13 and 31 workflows ask whether faults repeat at
# the same place). Xid 13: "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): ..." (gpud's
# xid README, NVSentinel's csv_test.go); older drivers name a unit of a TPC without an SM
# ("Graphics TEX Exception on (GPC 0, TPC 1): ..."). Xid 31: "MMU Fault: ENGINE GRAPHICS
# GPC2 GPCCLIENT_T1_7 faulted @ 0x2b57_b3000000. Fault is of type FAULT_PDE
# ACCESS_TYPE_VIRT_WRITE"; drivers 418 and older print no GPC ("ENGINE GRAPHICS
# GPCCLIENT_T1_3"). The faulting address is the process's own (virtual): not a location.
_SM_LOCATION = re.compile(
    r"\bon \(GPC (?P<gpc>\d{1,4})(?:, TPC (?P<tpc>\d{1,4}))?(?:, SM (?P<sm>\d{1,4}))?\)"
)
_MMU_FAULT = re.compile(
    r"MMU Fault: ENGINE (?P<engine>[A-Z][A-Z0-9_]{0,31})(?: (?P<gpc>GPC\d{1,4}))?"
    r" (?P<client>[A-Z][A-Z0-9_]{0,63}) faulted @ 0x[0-9a-fA-F_]{1,24}"
    r"(?:\.? ?Fault is of type (?P<type>[A-Z][A-Z0-9_]{0,63})"
    r"(?: (?P<access>ACCESS_TYPE_[A-Z0-9_]{1,32}))?)?"
)
# Xid 154: "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
_RECOVERY = re.compile(
    r"recovery action changed from (?P<old_code>0x[0-9a-fA-F]{1,8}|\d{1,8}) \((?P<old>[^)]{0,64})\)"
    r" to (?P<new_code>0x[0-9a-fA-F]{1,8}|\d{1,8}) \((?P<new>[^)]{0,64})\)"
)
GPU_UUID = re.compile(
    r"NVRM: GPU at (?:PCI:)?(?P<bus>" + _BUS + r"): (?P<uuid>GPU-[0-9a-fA-F-]{8,})"
)
FALLEN_SINGLE = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?(?P<bus>" + _BUS + r"):? (?:GPU )?has fallen off the bus"
)
FALLEN_HEAD = re.compile(r"NVRM: The NVIDIA GPU (?P<bus>" + _BUS + r")")
FALLEN_PCI_ID = re.compile(r"\(PCI ID: (?P<id>[0-9a-fA-F]{4}:[0-9a-fA-F]{4})\)")
FALLEN_TAIL = re.compile(r"fallen off the bus and is not\s+responding to commands")
SXID = re.compile(
    r"(?P<dev>nvidia-nvswitch\d*): SXid \((?:PCI:)?(?P<bus>" + _BUS + r")\): (?P<code>\d{1,6})"
    r"(?:, (?P<sev>Non-fatal|Fatal|Nonfatal))?(?:, (?P<msg>.*))?"
)
# An SXid's report is a header ("12028, Non-fatal, Link 32 egress ...") followed by lines
# of the same device, address and code that the NVSwitch driver's _nvswitch_dump_error_entry
# prints: "Severity <0 nonfatal|1 fatal> Engine instance NN Sub-engine instance NN" and
# "Data {0x..., ...}". They are details of that SXid, not SXids of their own.
_SXID_LINK = re.compile(r"Link (?P<link>\d{1,4})\b")
SXID_SEVERITY = re.compile(
    r"Severity (?P<level>\d{1,3}) Engine instance (?P<inst>\d{1,5})"
    r"(?: Sub-engine instance (?P<sub>\d{1,5}))?"
)
SXID_DATA = re.compile(r"Data \{(?P<data>[0-9a-fA-Fx, ]{0,512})\}")
# NVLink discovery after receiver detection failed (open-gpu-kernel-modules
# kernel_nvlink_gh100.c, knvlinkDiscoverPostRxDetLinks / knvlinkUpdatePostRxDetectLinkMask;
# the pattern is gpud's post_rx_detect_failure.go). The line names no GPU.
NVLINK_RX_DETECT = re.compile(
    r"NVRM: (?:(?P<update>knvlinkUpdatePostRxDetectLinkMask_[A-Za-z0-9_]{1,32}): Failed to "
    r"update Rx Detect Link mask!|(?P<discover>knvlinkDiscoverPostRxDetLinks_[A-Za-z0-9_]{1,32})"
    r": Getting peer(?P<peer>\d{1,4})(?:'s)? postRxDetLinkMask failed!)"
)
# "API mismatch" over several lines, in two wordings (nv.c): "the client has the version
# 535.104.05, but / this kernel module has the version 535.54.03." and, with the client
# named, "the client 'kwin_wayland' (pid 1005) / has the version 595.84, but this kernel
# module has / the version 595.80." The lines are joined without their "NVRM:" first.
API_HEAD = re.compile(r"NVRM: API mismatch: the client")
API_MISMATCH = re.compile(
    r"API mismatch: the client(?: '(?P<client_name>[^']{0,64})')?(?: \(pid (?P<pid>\d{1,10})\))?"
    r"(?: has the version (?P<client>\d+(?:\.\d+)+),? but)?"
    r"(?: (?:this kernel module has )?the version (?P<kernel>\d+(?:\.\d+)+))?"
)
API_MAX_LINES = 6
_MODULE = r"(?P<module>nvidia[\w-]*|nv_peer_mem|gdrdrv)"
# Prefixes that nvidia.ko itself prints under ("nvidia-nvlink: Nvlink Core is being
# initialized", "nvidia-nvswitch3: SXid ..."): the driver, not a module of their own.
_PARTS_OF_NVIDIA = re.compile(r"nvidia_(?:nvlink|nvswitch\d*)")


def module_name(printed: str) -> str:
    """The module a kernel message names, as /proc/modules and lsmod spell it.

    The kernel prints a module's name with "_" (kbuild's KBUILD_MODNAME: "nvidia_fs:
    Unknown symbol ..."), the NVIDIA modules their own prefixes with "-" ("nvidia-uvm:",
    "nvidia-modeset:"); both are one module. nvidia_fs, nvidia_peermem, nvidia_uvm,
    nvidia_drm and nvidia_modeset are modules of their own: their failure leaves nvidia.ko
    loaded, so it must not read as the driver's.
    """
    name = printed.replace("-", "_")
    return "nvidia" if _PARTS_OF_NVIDIA.fullmatch(name) else name


MODULE_FAILURES = (
    (re.compile(_MODULE + r": Unknown symbol (?P<sym>\S+)"), "unknown symbol {sym}"),
    (
        re.compile(_MODULE + r": disagrees about version of symbol (?P<sym>\S+)"),
        "symbol version mismatch: {sym}",
    ),
    (
        re.compile(_MODULE + r": version magic '(?P<have>[^']*)' should be '(?P<want>[^']*)'"),
        "built for another kernel: version magic '{have}', kernel wants '{want}'",
    ),
    (
        re.compile(r"NVRM: The NVIDIA probe routine (?P<what>was not called|failed) for"),
        "the probe routine {what}",
    ),
    (re.compile(r"NVRM: None of the NVIDIA devices were initialized"), "no device initialised"),
    # nvlink_core_init() (kernel-open/nvidia/nvlink_linux.c, 595.45.04 line 330), called by
    # nvidia.ko's module init before anything else: its failure fails the module's load
    (
        re.compile(r"nvidia-nvlink: Failed to initialize driver(?: : (?P<rc>-?\d{1,10}))?"),
        "the NVLink core failed to initialise {rc}",
    ),
    (
        re.compile(r"NVRM: (?:GPU (?P<bus>" + _BUS + r"): )?RmInitAdapter failed!\s*(?P<rc>\S*)"),
        "RmInitAdapter failed {rc}",
    ),
)
# The open kernel module declining a GPU it does not drive by default, just before
# RmInitAdapter fails for that GPU (NVIDIA/open-gpu-kernel-modules#230): "NVRM: Open
# nvidia.ko is only ready for use on Data Center GPUs." The driver README's
# NVreg_OpenRmEnableUnsupportedGpus=1, or the proprietary module, is the answer.
OPEN_MODULE_UNSUPPORTED = re.compile(
    r"NVRM: Open nvidia\.ko is only ready for use on Data Center GPUs"
)
# ... and a pre-Turing GPU, which the open module cannot drive at all (no GSP): "NVRM: The
# NVIDIA GPU 0000:af:00.0 (PCI ID: 10de:1db5) / installed in this system is not supported
# by open / nvidia.ko because it does not include the required GPU / System Processor
# (GSP)." (NVIDIA/open-gpu-kernel-modules#322); the GPU is named on the first line
OPEN_MODULE_NO_GSP = re.compile(r"does not include the required GPU")
# ... and a GPU this driver release does not support at all (osapi.c, 595.45.04 line 3747):
# "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2330) / installed in this system is not
# supported by the / NVIDIA 550.90.07 driver release." (NVIDIA/nvtrust#55)
RELEASE_UNSUPPORTED = re.compile(r"installed in this system is not supported by the\b")
# Lines that say why the next "RmInitAdapter failed!" happens, printed by RmInitAdapter
# itself before it names the GPU (osinit.c): they are that failure's first line, not a
# failure of their own. The open module declining a GeForce GPU is kept as its own flag.
INIT_CAUSE_LINES = 8  # the open module's notice is four lines; RmInitAdapter comes next
INIT_CAUSES = (
    (re.compile(r"Cannot initialize GSP firmware RM"), "GSP firmware RM could not start"),
    (OPEN_MODULE_UNSUPPORTED, "only ready for Data Center GPUs"),
)
# GSP failures that come with no Xid number (src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c,
# 595.45.04: _kgspIsHeartbeatTimedOut line 2303, _kgspRpcRecvPoll 2890/2894,
# _kgspProcessRpcEvent 1444). "GPU6" is the driver's own GPU instance, not a PCI address
# nor nvidia-smi's index. Also "Max GSP-RM boot attempts exceeded: %u/%u" (kgspBootGspRm
# line 5005, >= 575: GSP-RM never came up, RmInitAdapter fails next) and the "GSP Timeout"
# banner of _kgspLogXid119 (line 2375), which comes with an Xid 119 line: rule
# gsp-error-without-xid stays silent where that Xid is read, and speaks where the banner
# is all that was kept.
GSP_NO_XID = re.compile(
    r"NVRM: (?:GPU(?P<inst>\d{1,3}) )?(?:[A-Za-z_][\w]{0,63}: )?"
    r"(?P<what>GSP RM heartbeat timed out|LibOS heartbeat timed out|Heartbeat timed out"
    r"|Attempted to process RPC event .{0,160}?without API lock"
    r"|Max GSP-RM boot attempts exceeded|(?:\*{4,40} )?GSP Timeout \*{4,40})"
)
_GSP_HINTS = ("eartbeat timed out", "without API lock", "GSP-RM boot attempts", "GSP Timeout")
_GSP_KINDS = {"Attempted": "rpc_without_api_lock", "Max": "boot_attempts_exceeded"}
SECURE_BOOT = (
    re.compile(r"Lockdown: (?P<process>[^:]{1,64}): unsigned module loading is restricted"),
    # kernel/module/signing.c module_sig_check(): "Loading of %s is rejected" with the
    # reasons "unsigned module", "module with unavailable key", "module with unsupported crypto"
    re.compile(
        r"Loading of (?:unsigned module|module with (?:unavailable key|unsupported crypto))"
        r" is (?:rejected|restricted)"
    ),
)
OOM_KILL_INFO = re.compile(
    r"oom-kill:constraint=(?P<constraint>[\w]+),.*?task_memcg=(?P<memcg>[^,]*),"
    r"task=(?P<task>[^,]*),pid=(?P<pid>\d+)"
)
OOM_KILLED = re.compile(
    r"(?P<scope>Memory cgroup out of memory|Out of memory)(?: \([^)]*\))?: Killed process "
    r"(?P<pid>\d+) \((?P<name>[^)]*)\)(?:.*?anon-rss:(?P<rss>\d+)kB)?"
)
AER = re.compile(
    r"(?:(?P<driver>[\w-]{1,32}) )?(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): "
    r"(?:AER: )?PCIe Bus Error: "
    r"severity=(?P<sev>[^,]+)(?:, type=(?P<type>[^,]+))?"
)
# The port's line naming where an uncorrectable error came from (drivers/pci/pcie/aer.c
# aer_print_port_info()): "pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received:
# id=0010", "... AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0", newer
# kernels "AER: Uncorrectable (Non-Fatal) error message received from 0000:80:1b.4". It
# comes before the "PCIe Bus Error" line, which a paste or a ring that wrapped may lack.
# Corrected errors are left out: only their rate matters (PCIE_REPLAY_RATE_HIGH).
_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
AER_SOURCE = re.compile(
    r"(?P<driver>[\w-]{1,32}) (?P<bus>" + _BDF + r"): (?:AER: )?(?:Multiple )?"
    r"(?P<sev>Uncorrect(?:ed|able) \((?:Fatal|Non-Fatal)\)) error (?:message )?received"
    r"(?:: (?P<src>" + _BDF + r")| from (?P<src2>" + _BDF + r"))?"
)
# AER recovery (drivers/pci/pcie/err.c pcie_do_recovery, printed on the port above the
# device: "pcieport 0000:00:03.0: AER: device recovery failed"), and the GPU's own part in
# it: "nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)", older
# kernels "nvidia 0000:02:00.0: device has no AER-aware driver" (nv_pci_driver registers
# no pci_error_handlers: open-gpu-kernel-modules#1229)
AER_RECOVERY = re.compile(
    r"(?P<driver>[\w-]{1,32}) (?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): "
    r"(?:AER: )?(?P<what>[Dd]evice recovery failed|can't recover \(no error_detected callback\)"
    r"|device has no AER-aware driver)"
)
NCCL_SEGFAULT = re.compile(
    r"(?P<process>[^\s\[\]]{1,64})\[(?P<pid>\d+)\]: segfault at (?P<addr>[0-9a-fA-F]+)"
    r".*? in (?P<lib>(?:libnccl|libcuda|libnvidia-|libcudart|libcublas|libcudnn)[^\s\[]*)"
)
# Host-kernel failures that stall or stop a serving host (kernel/hung_task.c,
# kernel/watchdog.c, kernel/panic.c): no NVIDIA code names them, and moptd does not guess
# their cause, but they are never passed over (UNCLASSIFIED_ERROR quoting the line).
# gpud#117: "INFO: task cache_mgr_event:620917 blocked for more than 120 seconds." after
# an Xid 45 storm.
HOST_FAULTS = (
    (
        "hung_task",
        re.compile(
            r"INFO: task (?P<process>.{1,64}?):(?P<pid>\d{1,10}) blocked for more than "
            r"(?P<secs>\d{1,10}) seconds"
        ),
    ),
    (
        "soft_lockup",
        re.compile(
            r"BUG: soft lockup - CPU#(?P<cpu>\d{1,5}) stuck for (?P<secs>\d{1,10})s! "
            r"\[(?P<process>.{1,64}?):(?P<pid>\d{1,10})\]"
        ),
    ),
    ("hard_lockup", re.compile(r"Watchdog detected hard LOCKUP on cpu (?P<cpu>\d{1,5})")),
    ("panic", re.compile(r"Kernel panic - not syncing: (?P<reason>.{0,200})")),
)
PEERMEM = re.compile(
    r"(?:(?:nvidia[-_]peermem|nv_peer_mem)\b[^\n]*?\bERROR\b\s*(?P<msg>.*)"
    r"|(?P<ctx>ERROR detected invalid context, skipping further processing))"
)

# nvidia.ko's module init registers the NVLink core first ("nvidia-nvlink: Nvlink Core is
# being initialized, major device number 509") and, on a good load, then prints NVRM lines
# ("NVRM: loading NVIDIA UNIX ..."). An init that fails before any NVRM text unregisters the
# core at once ("nvidia-nvlink: Unregistered Nvlink Core, major device number 509"), and udev
# retries: the pair repeats with no error text of the driver's (ollama/ollama#11932).
NVLINK_CORE_INIT = "Nvlink Core is being initialized"
NVLINK_CORE_GONE = re.compile(r"nvidia-nvlink: Unregistered (?:the )?Nvlink Core")

MAX_UUIDS = 256
MAX_OOM_MEMCG = 64
MAX_SXID_OPEN = 64  # SXid headers whose follow-up lines may still come


def _aer_severity(raw: str) -> str:
    s = raw.strip().lower()
    if s.startswith("corrected"):
        return "corrected"
    if "non-fatal" in s or "nonfatal" in s:
        return "nonfatal"
    if "fatal" in s:
        return "fatal"
    return s[:32]


def _nvlink_severity(raw: str) -> str:
    s = raw.lower().replace("-", "").replace(" ", "_")
    return {"fatal": "fatal", "nonfatal": "nonfatal", "link_fatal": "link_fatal"}.get(s, s)


@dataclass(frozen=True, slots=True)
class Match:
    stream: str  # kernel.xid, kernel.oom_kill, ...
    fields: dict[str, Any]
    text: str  # the line(s) the match came from


def parse_xid(line: str) -> dict[str, Any] | None:
    """The fields of one NVRM Xid line, or None when the line is not one."""
    m = XID.search(line)
    if m is None:
        return None
    rest = (m.group("rest") or "").strip()
    pid: int | None = None
    process = ""
    message = rest
    pm = _PID_NAME.match(rest)
    if pm is not None:
        if pm.group("pid").isdigit():
            pid = int(pm.group("pid"))
        name = (pm.group("name") or "").strip()
        process = "" if name == "<unknown>" else name
        message = (pm.group("msg") or "").strip()
    fields: dict[str, Any] = {
        "code": int(m.group("code")),
        "pci_bus_id": pci_key(m.group("bus")),
        "pid": pid,
        "process": process,
        "message": message,
        "caused_by": None,
        "gpu_instance": None if m.group("gi") is None else int(m.group("gi")),
        "compute_instance": None if m.group("ci") is None else int(m.group("ci")),
        "severity": "",
    }
    cm = _CAUSED_BY.search(message)
    if cm is not None:
        fields["caused_by"] = int(cm.group("code"))
    nm = _NVLINK5.match(message)
    if nm is not None:
        fields["severity"] = _nvlink_severity(nm.group("sev"))
        fields["nvlink_unit"] = nm.group("unit")
        if nm.group("xc") is not None:
            fields["nvlink_xc"] = int(nm.group("xc"))
        if nm.group("link") is not None:
            _set_link(fields, int(nm.group("link")))
        if nm.group("intr") is not None:
            fields["intrinfo"] = nm.group("intr").lower()
        if nm.group("status") is not None:
            fields["error_status"] = nm.group("status").lower()
    else:
        lm = _NVLINK_LINK.search(message)
        if lm is not None:
            _set_link(fields, int(lm.group("link")))
    if fields["code"] in (13, 31):
        _set_location(fields, message)
    rm = _RECOVERY.search(message)
    if rm is not None:
        fields["recovery_action"] = rm.group("new").strip()
        fields["recovery_action_code"] = _number(rm.group("new_code"))
        fields["previous_recovery_action"] = rm.group("old").strip()
        fields["previous_recovery_action_code"] = _number(rm.group("old_code"))
    return fields


def _set_location(fields: dict[str, Any], message: str) -> None:
    """``location``: where on the GPU the fault hit, as one comparable text ("GPC 7, TPC 7,
    SM 0"; "GRAPHICS GPC2 GPCCLIENT_T1_7"), with its parts as fields of their own."""
    sm = _SM_LOCATION.search(message)
    if sm is not None:
        parts = [f"GPC {int(sm.group('gpc'))}"]
        fields["gpc"] = int(sm.group("gpc"))
        for key in ("tpc", "sm"):
            if sm.group(key) is not None:
                fields[key] = int(sm.group(key))
                parts.append(f"{key.upper()} {fields[key]}")
        fields["location"] = ", ".join(parts)
        return
    mmu = _MMU_FAULT.search(message)
    if mmu is not None:
        fields["mmu_engine"] = mmu.group("engine")
        fields["mmu_client"] = mmu.group("client")
        if mmu.group("gpc") is not None:
            fields["gpc"] = int(mmu.group("gpc")[3:])
        if mmu.group("type") is not None:
            fields["mmu_fault_type"] = mmu.group("type")
        if mmu.group("access") is not None:
            fields["mmu_access_type"] = mmu.group("access")
        fields["location"] = " ".join(
            p for p in (mmu.group("engine"), mmu.group("gpc"), mmu.group("client")) if p
        )


def _number(text: str) -> int:
    return int(text, 16) if text[:2].lower() == "0x" else int(text)


def _set_link(fields: dict[str, Any], link: int) -> None:
    # "Link -1": the driver names no particular link; a rule must not read it as a number
    if link < 0:
        fields["link"] = None
        fields["link_scope"] = "no_particular_link"
    else:
        fields["link"] = link
        fields["link_scope"] = "one_link"


def _sxid_detail(message: str) -> dict[str, Any] | None:
    """The fields of an SXid follow-up line, or None when the message is a header."""
    sm = SXID_SEVERITY.match(message)
    if sm is not None:
        level = int(sm.group("level"))
        # NVSWITCH_ERROR_SEVERITY_NONFATAL = 0, NVSWITCH_ERROR_SEVERITY_FATAL = 1
        # (ctrl_dev_nvswitch.h); another number is kept but decides nothing
        fatal = {0: False, 1: True}.get(level)
        return {
            "severity_level": level,
            "fatal": fatal,
            "severity": "" if fatal is None else ("fatal" if fatal else "nonfatal"),
            "engine_instance": int(sm.group("inst")),
            "subengine_instance": None if sm.group("sub") is None else int(sm.group("sub")),
        }
    dm = SXID_DATA.match(message)
    if dm is not None:
        words = [w.strip().lower() for w in dm.group("data").split(",")]
        return {"data": [w for w in words if w]}
    return None


class KernelMatcher:
    """Feed kernel-log lines in order; get the matches. Keeps what multi-line messages
    need: the last few NVRM lines, a pending API mismatch, the memcg of recent OOM kills,
    and the GPU UUIDs the driver printed (``NVRM: GPU at PCI:...: GPU-<uuid>``)."""

    def __init__(self) -> None:
        self.uuid_by_bus: OrderedDict[str, str] = OrderedDict()
        self._recent: deque[str] = deque(maxlen=4)
        self._oom_memcg: OrderedDict[int, str] = OrderedDict()
        self._api_lines: list[str] = []  # an API mismatch message read so far
        self._sxid_open: OrderedDict[tuple[str, str, int], None] = OrderedDict()
        self._open_unsupported = False  # the open module's notice, for the next RmInitAdapter
        self._init_cause: tuple[str, str] | None = None  # (line, why) for the next RmInitAdapter
        self._init_cause_age = 0  # NVRM lines since: a cause is kept for INIT_CAUSE_LINES only
        self._nvlink_core_bare = False  # the NVLink core registered, no NVRM line since

    def feed(self, text: str) -> list[Match]:
        """All matches of one record (which may hold several lines)."""
        out: list[Match] = []
        for line in text.split("\n"):
            if line:
                out.extend(self.feed_line(line))
        return out

    def flush(self) -> list[Match]:
        """Whatever is still pending (end of a log): an API mismatch without its last line."""
        return self._api_mismatch(final=True)

    def feed_line(self, line: str) -> list[Match]:
        out: list[Match] = []
        if self._api_lines:
            if "NVRM" in line and "version" in line and len(self._api_lines) < API_MAX_LINES:
                self._api_lines.append(line)  # a further line of the message
                return self._api_mismatch(final=False)
            out.extend(self._api_mismatch(final=True))
        if "NVRM" in line:
            self._nvlink_core_bare = False
            out.extend(self._nvrm(line))
        elif "Nvlink Core" in line:
            out.extend(self._nvlink_core(line))
        elif "SXid" in line:
            out.extend(self._sxid(line))
        else:
            out.extend(self._other(line))
        return out

    def _nvlink_core(self, line: str) -> list[Match]:
        if NVLINK_CORE_INIT in line:
            self._nvlink_core_bare = True
            return []
        if NVLINK_CORE_GONE.search(line) is None or not self._nvlink_core_bare:
            return []  # an unload after a good load (rmmod, shutdown) is no failure
        self._nvlink_core_bare = False
        fields = {
            "module": "nvidia",
            "reason": "initialised and unloaded at once with no NVRM error "
            "(NVLink core registered, then unregistered)",
        }
        return [Match("kernel.module_load_failure", fields, line)]

    def _sxid(self, line: str) -> list[Match]:
        m = SXID.search(line)
        if m is None:
            return []
        sev = (m.group("sev") or "").lower().replace("-", "")
        message = (m.group("msg") or "").strip()
        fields: dict[str, Any] = {
            "code": int(m.group("code")),
            "pci_bus_id": pci_key(m.group("bus")),
            "device": m.group("dev"),
            "fatal": None if not sev else sev == "fatal",
            "severity": sev,
            "message": message,
            "link": None,
        }
        key = (fields["device"], fields["pci_bus_id"], fields["code"])
        detail = None if sev else _sxid_detail(message)
        if detail is None:
            lm = _SXID_LINK.match(message)
            if lm is not None:
                fields["link"] = int(lm.group("link"))
        else:
            fields.update(detail)
            if key in self._sxid_open:
                # a follow-up of the SXid just reported: its details, not another SXid
                self._sxid_open.move_to_end(key)
                fields.pop("link")
                return [Match("kernel.sxid_detail", fields, line)]
            # the header was not seen (lost, or read from the middle of a report): the
            # follow-up stands for the SXid, counted once, and says so
            fields["headerless"] = True
        self._sxid_open[key] = None
        self._sxid_open.move_to_end(key)
        while len(self._sxid_open) > MAX_SXID_OPEN:
            self._sxid_open.popitem(last=False)
        return [Match("kernel.sxid", fields, line)]

    def _nvrm(self, line: str) -> list[Match]:
        self._recent.append(line)
        self._init_cause_age += 1
        if self._init_cause_age > INIT_CAUSE_LINES:
            self._init_cause = None  # its RmInitAdapter line never came: not a later one's
        fields = parse_xid(line)
        if fields is not None:
            return [Match("kernel.xid", fields, line)]
        m = GPU_UUID.search(line)
        if m is not None:
            bus = pci_key(m.group("bus"))
            self.uuid_by_bus[bus] = m.group("uuid")
            self.uuid_by_bus.move_to_end(bus)
            while len(self.uuid_by_bus) > MAX_UUIDS:
                self.uuid_by_bus.popitem(last=False)
            return []
        m = FALLEN_SINGLE.search(line)
        if m is not None:
            bus = pci_key(m.group("bus"))
            return [Match("kernel.gpu_fallen_off_bus", {"pci_bus_id": bus, "pci_id": ""}, line)]
        if FALLEN_TAIL.search(line):
            window = "\n".join(self._recent)
            head = FALLEN_HEAD.search(window)
            if head is not None:
                self._recent.clear()
                pid_m = FALLEN_PCI_ID.search(window)
                fields = {
                    "pci_bus_id": pci_key(head.group("bus")),
                    "pci_id": "" if pid_m is None else pid_m.group("id").lower(),
                }
                return [Match("kernel.gpu_fallen_off_bus", fields, window[head.start() :])]
            return []
        if RELEASE_UNSUPPORTED.search(line):
            window = "\n".join(self._recent)
            head = FALLEN_HEAD.search(window)
            if head is None:
                return []
            self._recent.clear()
            fields = {
                "module": "nvidia",
                "reason": "not supported by this driver release",
                "pci_bus_id": pci_key(head.group("bus")),
                "open_module_unsupported": False,
                "release_unsupported": True,
            }
            return [Match("kernel.module_load_failure", fields, window[head.start() :])]
        if OPEN_MODULE_NO_GSP.search(line):
            window = "\n".join(self._recent)
            head = FALLEN_HEAD.search(window)
            if head is not None and "not supported by open" in window:
                self._recent.clear()
                fields = {
                    "module": "nvidia",
                    "reason": "not supported by the open kernel module (no GSP)",
                    "pci_bus_id": pci_key(head.group("bus")),
                    "open_module_unsupported": True,
                }
                return [Match("kernel.module_load_failure", fields, window[head.start() :])]
            return []
        m = NVLINK_RX_DETECT.search(line)
        if m is not None:
            update = m.group("update")
            fields = {
                "function": update or m.group("discover"),
                "failure": "update_link_mask" if update else "peer_link_mask",
                "peer": None if m.group("peer") is None else int(m.group("peer")),
            }
            return [Match("kernel.nvlink_rx_detect_failure", fields, line)]
        if API_HEAD.search(line):
            self._api_lines = [line]
            return self._api_mismatch(final=False)
        for rx, why in INIT_CAUSES:
            if rx.search(line):
                self._open_unsupported |= rx is OPEN_MODULE_UNSUPPORTED
                self._init_cause, self._init_cause_age = (line, why), 0
                return []
        if any(k in line for k in _GSP_HINTS):
            m = GSP_NO_XID.search(line)
            if m is not None:
                what = m.group("what")
                kind = _GSP_KINDS.get(what.split(" ", 1)[0], "heartbeat")
                if "GSP Timeout" in what:
                    kind = "rpc_timeout"
                inst = m.group("inst")
                fields = {"kind": kind, "rm_gpu": None if inst is None else int(inst)}
                return [Match("kernel.gsp_error", fields, line)]
        return self._module_failure(line)

    def _api_mismatch(self, final: bool) -> list[Match]:
        """The API mismatch read so far, once both versions are in (or ``final``)."""
        if not self._api_lines:
            return []
        joined = " ".join(part.split("NVRM:", 1)[-1].strip() for part in self._api_lines)
        m = API_MISMATCH.search(" ".join(joined.split()))
        if m is None or (m.group("kernel") is None and not final):
            return []
        text, self._api_lines = "\n".join(self._api_lines), []
        fields = {
            "client_version": m.group("client") or "",
            "kernel_version": m.group("kernel") or "",
            "client": m.group("client_name") or "",
            "pid": None if m.group("pid") is None else int(m.group("pid")),
        }
        return [Match("kernel.api_mismatch", fields, text)]

    def _module_failure(self, line: str) -> list[Match]:
        for rx, reason in MODULE_FAILURES:
            m = rx.search(line)
            if m is not None:
                groups = {k: (v or "") for k, v in m.groupdict().items()}
                fields: dict[str, Any] = {
                    "module": module_name(groups.get("module") or "nvidia"),
                    "reason": reason.format(**groups).strip(),
                }
                if groups.get("bus"):
                    fields["pci_bus_id"] = pci_key(groups["bus"])
                if "RmInitAdapter" in reason:
                    # why this GPU was not initialised: the open module does not drive it,
                    # or GSP-RM did not start; the line that said so is part of the evidence
                    fields["open_module_unsupported"] = self._open_unsupported
                    self._open_unsupported = False
                    if self._init_cause is not None:
                        cause, why = self._init_cause
                        self._init_cause = None
                        fields["reason"] = f"{why}: {fields['reason']}"
                        return [Match("kernel.module_load_failure", fields, f"{cause}\n{line}")]
                return [Match("kernel.module_load_failure", fields, line)]
        return []

    def _other(self, line: str) -> list[Match]:
        if "oom-kill:" in line:
            m = OOM_KILL_INFO.search(line)
            if m is not None:
                pid = int(m.group("pid"))
                self._oom_memcg[pid] = m.group("memcg")
                while len(self._oom_memcg) > MAX_OOM_MEMCG:
                    self._oom_memcg.popitem(last=False)
            return []
        if "Killed process" in line:
            m = OOM_KILLED.search(line)
            if m is None:
                return []
            pid = int(m.group("pid"))
            memcg = self._oom_memcg.pop(pid, "")
            cg = parse_cgroup(memcg) if memcg else None
            fields: dict[str, Any] = {
                "pid": pid,
                "process": m.group("name"),
                "scope": "cgroup" if m.group("scope").startswith("Memory cgroup") else "system",
                "container": cg.container_id if cg else "",
                "pod_uid": cg.pod_uid if cg else "",
                "unit": cg.unit if cg else "",
                "memcg": memcg,
                "rss_bytes": None if m.group("rss") is None else int(m.group("rss")) * 1024,
            }
            return [Match("kernel.oom_kill", fields, line)]
        if "PCIe Bus Error" in line:
            m = AER.search(line)
            if m is None:
                return []
            fields = {
                "pci_bus_id": pci_key(m.group("bus")),
                "severity": _aer_severity(m.group("sev")),
                "type": (m.group("type") or "").strip(),
                "driver": m.group("driver") or "",
            }
            return [Match("kernel.pcie_aer", fields, line)]
        if "error received" in line or "error message received" in line:
            m = AER_SOURCE.search(line)
            if m is None:
                return []
            fields = {
                "pci_bus_id": pci_key(m.group("bus")),
                "severity": _aer_severity(m.group("sev")),
                "type": "",
                "driver": m.group("driver"),
                "source": pci_key(m.group("src") or m.group("src2") or ""),
            }
            return [Match("kernel.pcie_aer", fields, line)]
        if "recover" in line or "AER-aware" in line:
            m = AER_RECOVERY.search(line)
            if m is not None:
                failed = m.group("what").lower().startswith("device recovery")
                fields = {
                    "pci_bus_id": pci_key(m.group("bus")),
                    "driver": m.group("driver"),
                    "outcome": "failed" if failed else "no_handler",
                }
                return [Match("kernel.pcie_recovery", fields, line)]
        if "segfault at" in line and ("libnccl" in line or "libcu" in line or "libnvidia-" in line):
            m = NCCL_SEGFAULT.search(line)
            if m is not None:
                fields = {
                    "pid": int(m.group("pid")),
                    "process": m.group("process"),
                    "library": m.group("lib"),
                }
                return [Match("kernel.nccl_segfault", fields, line)]
            return []
        if "ERROR" in line:
            m = PEERMEM.search(line)
            if m is not None:
                msg = m.group("msg") if m.group("msg") is not None else m.group("ctx")
                return [Match("kernel.peermem_error", {"message": (msg or "").strip()}, line)]
        if "blocked for more" in line or "LOCKUP" in line or "lockup" in line or "panic" in line:
            for kind, rx in HOST_FAULTS:
                m = rx.search(line)
                if m is not None:
                    groups = m.groupdict()
                    fields = {
                        "kind": kind,
                        "process": (groups.get("process") or "").strip(),
                        "pid": int(groups["pid"]) if groups.get("pid") else None,
                        "line": line[m.start() :][:240],
                    }
                    return [Match("kernel.host_fault", fields, line)]
        for i, rx in enumerate(SECURE_BOOT):
            m = rx.search(line)
            if m is not None:
                groups = m.groupdict()
                fields = {
                    "module": groups.get("module") or "",
                    "process": (groups.get("process") or "").strip(),
                    "reason": ("lockdown", "signature")[i],
                }
                return [Match("kernel.secure_boot_refused", fields, line)]
        return self._module_failure(line)
