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
_NVLINK5 = re.compile(
    r"(?P<unit>[A-Z][A-Z0-9_]+) (?P<sev>Fatal|Nonfatal|Non-fatal|NonFatal|Link Fatal)\b"
    r"(?: XC(?P<xc>\d+))?(?: i(?P<inst>\d+))?(?: Link (?P<link>\d+))?"
    r"(?: \((?P<intr>0x[0-9a-fA-F]+))?"
)
_RECOVERY = re.compile(
    r"recovery action changed from \S+ \((?P<old>[^)]*)\) to \S+ \((?P<new>[^)]*)\)"
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
API_MISMATCH = re.compile(
    r"NVRM: API mismatch: the client(?: '(?P<client_name>[^']*)')?(?: \(pid (?P<pid>\d+)\))?"
    r" has the version (?P<client>\d+(?:\.\d+)+),? but"
    r"(?:\s+(?:NVRM:\s+)?this kernel module has the version (?P<kernel>\d+(?:\.\d+)+))?"
)
API_KERNEL = re.compile(r"NVRM: this kernel module has the version (?P<kernel>\d+(?:\.\d+)+)")
_MODULE = r"(?P<module>nvidia[\w-]*|nv_peer_mem|gdrdrv)"
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
    (
        re.compile(r"NVRM: (?:GPU (?P<bus>" + _BUS + r"): )?RmInitAdapter failed!\s*(?P<rc>\S*)"),
        "RmInitAdapter failed {rc}",
    ),
)
SECURE_BOOT = (
    re.compile(r"Lockdown: (?P<process>[^:]{1,64}): unsigned module loading is restricted"),
    re.compile(
        r"Loading of (?:unsigned module|module with unavailable key) is (?:rejected|restricted)"
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
    r"(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): (?:AER: )?PCIe Bus Error: "
    r"severity=(?P<sev>[^,]+)(?:, type=(?P<type>[^,]+))?"
)
NCCL_SEGFAULT = re.compile(
    r"(?P<process>[^\s\[\]]{1,64})\[(?P<pid>\d+)\]: segfault at (?P<addr>[0-9a-fA-F]+)"
    r".*? in (?P<lib>libnccl[^\s\[]*)"
)
PEERMEM = re.compile(
    r"(?:(?:nvidia[-_]peermem|nv_peer_mem)\b[^\n]*?\bERROR\b\s*(?P<msg>.*)"
    r"|(?P<ctx>ERROR detected invalid context, skipping further processing))"
)

MAX_UUIDS = 256
MAX_OOM_MEMCG = 64


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
        if nm.group("link") is not None:
            fields["link"] = int(nm.group("link"))
        if nm.group("intr") is not None:
            fields["intrinfo"] = nm.group("intr").lower()
    rm = _RECOVERY.search(message)
    if rm is not None:
        fields["recovery_action"] = rm.group("new")
    return fields




class KernelMatcher:
    """Feed kernel-log lines in order; get the matches. Keeps what multi-line messages
    need: the last few NVRM lines, a pending API mismatch, the memcg of recent OOM kills,
    and the GPU UUIDs the driver printed (``NVRM: GPU at PCI:...: GPU-<uuid>``)."""

    def __init__(self) -> None:
        self.uuid_by_bus: OrderedDict[str, str] = OrderedDict()
        self._recent: deque[str] = deque(maxlen=4)
        self._oom_memcg: OrderedDict[int, str] = OrderedDict()
        self._api_pending: Match | None = None

    def feed(self, text: str) -> list[Match]:
        """All matches of one record (which may hold several lines)."""
        out: list[Match] = []
        for line in text.split("\n"):
            if line:
                out.extend(self.feed_line(line))
        return out

    def flush(self) -> list[Match]:
        """Whatever is still pending (end of a log): an API mismatch without its second line."""
        pending, self._api_pending = self._api_pending, None
        return [] if pending is None else [pending]

    def feed_line(self, line: str) -> list[Match]:
        out: list[Match] = []
        if self._api_pending is not None:
            km = API_KERNEL.search(line)
            pending, self._api_pending = self._api_pending, None
            if km is not None:
                pending.fields["kernel_version"] = km.group("kernel")
                return [Match(pending.stream, pending.fields, pending.text + "\n" + line)]
            out.append(pending)
        if "NVRM" in line:
            out.extend(self._nvrm(line))
        elif "SXid" in line:
            m = SXID.search(line)
            if m is not None:
                sev = (m.group("sev") or "").lower().replace("-", "")
                fields = {
                    "code": int(m.group("code")),
                    "pci_bus_id": pci_key(m.group("bus")),
                    "device": m.group("dev"),
                    "fatal": None if not sev else sev == "fatal",
                    "message": (m.group("msg") or "").strip(),
                }
                out.append(Match("kernel.sxid", fields, line))
        else:
            out.extend(self._other(line))
        return out

    def _nvrm(self, line: str) -> list[Match]:
        self._recent.append(line)
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
        m = API_MISMATCH.search(line)
        if m is not None:
            fields = {
                "client_version": m.group("client"),
                "kernel_version": m.group("kernel") or "",
                "client": m.group("client_name") or "",
                "pid": None if m.group("pid") is None else int(m.group("pid")),
            }
            match = Match("kernel.api_mismatch", fields, line)
            if m.group("kernel") is None:
                self._api_pending = match
                return []
            return [match]
        return self._module_failure(line)

    def _module_failure(self, line: str) -> list[Match]:
        for rx, reason in MODULE_FAILURES:
            m = rx.search(line)
            if m is not None:
                groups = {k: (v or "") for k, v in m.groupdict().items()}
                fields: dict[str, Any] = {
                    "module": groups.get("module") or "nvidia",
                    "reason": reason.format(**groups).strip(),
                }
                if groups.get("bus"):
                    fields["pci_bus_id"] = pci_key(groups["bus"])
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
            }
            return [Match("kernel.pcie_aer", fields, line)]
        if "segfault at" in line and "libnccl" in line:
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
