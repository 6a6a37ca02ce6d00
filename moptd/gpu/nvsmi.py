"""Readers of ``nvidia-smi -q -x`` (XML) and ``nvidia-smi -q`` (text) dumps, and the entry
point (``parse_dump``, ``read_dump``) that also takes the default table
(moptd.gpu.nvsmi_table) and nvidia-smi's own failure messages (moptd.gpu.nvsmi_failure).

A dump becomes the same typed readings the NVML backend makes (moptd.gpu.readings) and,
through ``dump_to_batch``, the same gpu.* samples the NVML collector emits, so rules run
unchanged over a bundle. Names differ across driver branches ("Clocks Throttle Reasons"
before R535, "Clocks Event Reasons" after; "Power Draw" vs "Average Power Draw"; "GPU
Reset Status" before the recovery-action field): each value lists the spellings it
accepts.

Tolerance: a value that does not parse is skipped and noted in ``NvsmiDump.problems``
with its line; ``NvsmiError`` (with ``.path`` and ``.line``) is raised only when the file
as a whole is not a readable nvidia-smi dump.

Fields a dump does not carry (energy, NVLink state in ``-q``) stay None, like NVML's
NotSupported. ``recovery_action`` on drivers before R570 is derived from "GPU Reset
Status": Reset Required -> 1 (GPU reset), Drain and Reset Recommended -> 4, both "No" -> 0.
"""

from __future__ import annotations

import calendar
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from moptd.gpu.batch import gpu_batch
from moptd.gpu.nvsmi_failure import NvsmiFailure, failure_batch, parse_failures
from moptd.gpu.readings import (
    FastReading,
    ProcessReading,
    SlowReading,
    StaticReading,
)
from moptd.located import LocatedError
from moptd.observations import NODE, Batch
from moptd.proc.pci import pci_key

MIB = 1024 * 1024


class NvsmiError(LocatedError):
    """The file is not a readable nvidia-smi dump."""


@dataclass(frozen=True, slots=True)
class NvsmiProblem:
    line: int
    key: str
    message: str


@dataclass(slots=True)
class NvsmiGpu:
    static: StaticReading
    fast: FastReading
    slow: SlowReading


@dataclass(slots=True)
class NvsmiDump:
    path: Path
    timestamp: float | None = None  # Unix seconds; the dump's clock read as UTC
    driver_version: str = ""
    cuda_version: str = ""
    gpus: list[NvsmiGpu] = field(default_factory=list)  # index order, as nvidia-smi shows
    problems: list[NvsmiProblem] = field(default_factory=list)
    kind: str = ""  # what the file held: nvidia-smi-q, nvidia-smi-q-xml, nvidia-smi-table,
    # nvidia-smi-failure
    failures: list[NvsmiFailure] = field(default_factory=list)  # nvidia-smi's error lines


# --- value parsers: text -> base units, None for N/A ------------------------------------

# `nvidia-smi -q -x` of 8 GPUs with processes is about 200 KiB; bundles are untrusted
MAX_DUMP_BYTES = 32 << 20
_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?")
_NA = frozenset({"n/a", "[n/a]", "not supported", "[not supported]", "unknown", ""})


class _Bad(ValueError):
    pass


def _number(s: str) -> float | None:
    t = s.strip()
    if t.lower() in _NA or t.lower().startswith("requested functionality"):
        return None
    m = _NUM.search(t)
    if m is None:
        raise _Bad(f"not a number: {t!r}")
    return float(m.group())


def _scaled(factor: float) -> Callable[[str], float | None]:
    def conv(s: str) -> float | None:
        v = _number(s)
        return None if v is None else v * factor

    return conv


def _memory(s: str) -> float | None:
    v = _number(s)
    if v is None:
        return None
    unit = s.strip().split()[-1].lower() if len(s.split()) > 1 else "mib"
    scale = {"kib": 1024, "mib": MIB, "gib": 1024 * MIB, "b": 1}.get(unit, MIB)
    return v * scale


def _flag(s: str) -> float | None:
    t = s.strip().lower()
    if t in _NA:
        return None
    if t in ("enabled", "yes", "active", "on", "true"):
        return 1.0
    if t in ("disabled", "no", "not active", "off", "false", "none"):
        return 0.0
    raise _Bad(f"not a yes/no value: {s.strip()!r}")


def _pstate(s: str) -> float | None:
    t = s.strip().upper()
    if t.lower() in _NA:
        return None
    if re.fullmatch(r"P\d{1,2}", t):
        return float(t[1:])
    raise _Bad(f"not a performance state: {s.strip()!r}")


_COMPUTE_MODES = {"default": 0.0, "exclusive_thread": 1.0, "prohibited": 2.0}
_COMPUTE_MODES["exclusive_process"] = 3.0


def _compute_mode(s: str) -> float | None:
    t = s.strip().lower().replace(" ", "_")
    if t in _NA:
        return None
    if t in _COMPUTE_MODES:
        return _COMPUTE_MODES[t]
    raise _Bad(f"unknown compute mode {s.strip()!r}")


_RECOVERY = {
    "none": 0.0,
    "gpu reset": 1.0,
    "reset": 1.0,
    "node reboot": 2.0,
    "reboot": 2.0,
    "drain p2p": 3.0,
    "drain and reset": 4.0,
}


def _recovery(s: str) -> float | None:
    t = " ".join(s.strip().lower().replace("_", " ").split())
    if t in _NA:
        return None
    if t in _RECOVERY:
        return _RECOVERY[t]
    return _number(s)  # a newer driver's numeric code


# The clock-event bits, by the key suffix each dump format uses.
_REASON_BITS_TEXT = {
    "idle": 0x1,
    "gpu idle": 0x1,
    "applications clocks setting": 0x2,
    "sw power cap": 0x4,
    "hw slowdown": 0x8,
    "sync boost": 0x10,
    "sw thermal slowdown": 0x20,
    "hw thermal slowdown": 0x40,
    "hw power brake slowdown": 0x80,
    "display clock setting": 0x100,
}
_REASON_BITS_XML = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
    "display_clock_setting": 0x100,
}
_COUNTERS_TEXT = {
    "sw power capping": "sw_power_cap",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power braking": "hw_power_brake_slowdown",
}
_COUNTERS_XML = {
    "sw_power_cap": "sw_power_cap",
    "sync_boost": "sync_boost",
    "sw_therm_slowdown": "sw_thermal_slowdown",
    "hw_therm_slowdown": "hw_thermal_slowdown",
    "hw_power_brake": "hw_power_brake_slowdown",
}


# --- a format-neutral view of one GPU's section -----------------------------------------


@dataclass(slots=True)
class _Node:
    key: str  # normalised: lower case, single spaces (text) or the XML tag
    value: str
    line: int
    children: list[_Node] = field(default_factory=list)

    def child(self, key: str) -> _Node | None:
        for c in self.children:
            if c.key == key:
                return c
        return None

    def find(self, path: str) -> _Node | None:
        node: _Node | None = self
        for part in path.split("/"):
            if node is None:
                return None
            node = node.child(part)
        return node

    def walk(self) -> Iterator[_Node]:
        for c in self.children:
            yield c
            yield from c.walk()


class _Reader:
    """Pulls typed values out of one GPU's tree, noting what did not parse."""

    def __init__(self, root: _Node, problems: list[NvsmiProblem]) -> None:
        self.root = root
        self.problems = problems

    def raw(self, *paths: str) -> _Node | None:
        for p in paths:
            n = self.root.find(p)
            if n is not None and n.value.strip().lower() not in _NA:
                return n
        return None

    def get(self, conv: Callable[[str], float | None], *paths: str) -> float | None:
        n = self.raw(*paths)
        if n is None:
            return None
        try:
            return conv(n.value)
        except _Bad as exc:
            self.problems.append(NvsmiProblem(n.line, n.key, str(exc)))
            return None

    def text(self, *paths: str) -> str:
        n = self.raw(*paths)
        return n.value.strip() if n is not None else ""


# --- text format ----------------------------------------------------------------------

_GPU_HEADER = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KV = re.compile(r"^(\s*)([^:]*?)\s*:\s?(.*)$")


def _norm(key: str) -> str:
    return " ".join(key.lower().split())


def parse_text(text: str, path: Path | str = "<text>") -> NvsmiDump:
    """``nvidia-smi -q`` output -> NvsmiDump (never raises on partial garbage)."""
    dump = NvsmiDump(Path(path))
    lines = text.splitlines()
    header = _Node("", "", 0)
    gpus: list[_Node] = []
    stack: list[tuple[int, _Node]] = [(-1, header)]
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("="):
            continue
        m = _GPU_HEADER.match(line)
        if m:
            gpu = _Node("gpu", m.group(1), lineno)
            gpus.append(gpu)
            stack = [(0, gpu)]
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        kv = _KV.match(line)
        if kv:
            key, value = _norm(kv.group(2)), kv.group(3).strip()
        else:
            key, value = _norm(line), ""
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        node = _Node(key, value, lineno)
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    if not gpus and not any(c.key in ("driver version", "attached gpus") for c in header.children):
        raise NvsmiError(
            path,
            1,
            "not nvidia-smi output (no -q GPU section or driver version, no table, no "
            "nvidia-smi error message)",
        )
    dump.driver_version = _first(header, "driver version")
    dump.cuda_version = _first(header, "cuda version")
    dump.timestamp = parse_timestamp(_first(header, "timestamp"))
    for index, gpu in enumerate(gpus):
        dump.gpus.append(_gpu(index, gpu, dump, _TEXT))
    return dump


def _first(node: _Node, key: str) -> str:
    n = node.child(key)
    return n.value.strip() if n is not None else ""


def _safe(r: _Reader, n: _Node, conv: Callable[[str], float | None]) -> float | None:
    try:
        return conv(n.value)
    except _Bad as exc:
        r.problems.append(NvsmiProblem(n.line, n.key, str(exc)))
        return None


def _reasons(section: _Node | None, bits: dict[str, int]) -> int | None:
    """The bitmask from the Active/Not Active lines; None when no line could be read."""
    if section is None:
        return None
    mask = 0
    seen = False
    for n in section.walk():
        key = n.key
        for prefix in ("clocks_event_reason_", "clocks_throttle_reason_"):
            key = key.removeprefix(prefix)
        bit = bits.get(key)
        state = n.value.strip().lower()
        if bit is None or state not in ("active", "not active"):
            continue
        seen = True
        if state == "active":
            mask |= bit
    return mask if seen else None


def _ecc_sums(section: _Node | None) -> tuple[float | None, float | None]:
    """(corrected, uncorrected) totals of one ECC section, in every format seen:
    R535+ SRAM/DRAM lines, and the older Single Bit/Double Bit ... Total lines."""
    if section is None:
        return None, None
    corrected: float | None = None
    uncorrected: float | None = None
    for n in section.walk():
        key = n.key.replace("_", " ")
        try:
            v = _number(n.value)
        except _Bad:
            continue
        if v is None or "threshold" in key:
            continue
        if key in ("single bit", "double bit") or key.startswith("aggregate"):
            continue
        if key in ("total",) or "total" in key:
            parent_key = _parent_key(section, n)
            if parent_key in ("single bit", "single_bit"):
                corrected = (corrected or 0.0) + v
            elif parent_key in ("double bit", "double_bit"):
                uncorrected = (uncorrected or 0.0) + v
            continue
        if "uncorrectable" in key:
            uncorrected = (uncorrected or 0.0) + v
        elif "correctable" in key:
            corrected = (corrected or 0.0) + v
    return corrected, uncorrected


def _parent_key(root: _Node, target: _Node) -> str:
    for n in [root, *root.walk()]:
        if target in n.children:
            return n.key
    return ""


def _recovery_of(
    r: _Reader, action: tuple[str, ...], reset: tuple[str, ...], drain: tuple[str, ...]
) -> float | None:
    v = r.get(_recovery, *action)
    if v is not None:
        return v
    need_reset = r.get(_flag, *reset)
    need_drain = r.get(_flag, *drain)
    if need_drain == 1.0:
        return 4.0
    if need_reset == 1.0:
        return 1.0
    if need_reset == 0.0:
        return 0.0
    return None


def _text_processes(section: _Node | None, r: _Reader) -> tuple[ProcessReading, ...]:
    """The "Process ID" blocks, whether their details are nested under it or follow it."""
    if section is None:
        return ()
    out: list[ProcessReading] = []
    pid: int | None = None
    mem: float | None = None
    kind = "C"
    name = ""

    def flush() -> None:
        if pid is not None:
            out.append(ProcessReading(pid, mem, kind, name))

    for n in section.walk():
        if n.key == "process id":
            flush()
            pid, mem, kind, name = None, None, "C", ""
            pv = _safe(r, n, _number)
            pid = int(pv) if pv is not None and pv >= 0 else None
        elif n.key == "type":
            kind = n.value.strip() or "C"
        elif n.key == "name":
            name = n.value.strip()
        elif n.key == "used gpu memory":
            mem = _safe(r, n, _memory)
    flush()
    return tuple(out)


_TIME_FORMATS = ("%a %b %d %H:%M:%S %Y", "%a %b %d %H:%M:%S %Z %Y")


def parse_timestamp(s: str) -> float | None:
    """nvidia-smi's local-looking time (e.g. "Sun Nov 29 16:22:13 2026"), read as UTC."""
    t = " ".join(s.split())
    if not t:
        return None
    for fmt in _TIME_FORMATS:
        try:
            return float(calendar.timegm(time.strptime(t, fmt)))
        except ValueError:
            continue
    return None


# --- XML format -------------------------------------------------------------------------


def _tree(el: ET.Element) -> _Node:
    if not len(el):  # a leaf, most elements: no comprehension to run (a call of its own)
        return _Node(el.tag, (el.text or "").strip(), 0, [])
    return _Node(el.tag, (el.text or "").strip(), 0, [_tree(child) for child in el])




def _header(root: ET.Element) -> _Node:
    """The root without its <gpu> sections, which _tree reads once each (they are most of a
    dump; the header needs only the root's direct children)."""
    kids = [_Node(el.tag, (el.text or "").strip(), 0) for el in root if el.tag != "gpu"]
    return _Node(root.tag, (root.text or "").strip(), 0, kids)


_CLOCKS_OPEN, _CLOCKS_CLOSE = "<supported_clocks>", "</supported_clocks>"


def _without_supported_clocks(body: str) -> str:
    """The text without its <supported_clocks> sections (each cut from its opening to its
    closing tag, its newlines kept so that a later error names its line): about half an
    H200 dump's bytes, which nothing reads and the XML parser need not build (issue 32).
    A section without its closing tag stays, and the parser says what is wrong with it."""
    if _CLOCKS_OPEN not in body:
        return body
    parts: list[str] = []
    pos = 0
    while (start := body.find(_CLOCKS_OPEN, pos)) >= 0:
        end = body.find(_CLOCKS_CLOSE, start)
        if end < 0:
            break
        parts.append(body[pos:start])
        parts.append("\n" * body.count("\n", start, end))
        pos = end + len(_CLOCKS_CLOSE)
    parts.append(body[pos:])
    return "".join(parts)


def parse_xml(text: str, path: Path | str = "<xml>") -> NvsmiDump:
    """``nvidia-smi -q -x`` output -> NvsmiDump. Malformed XML is unreadable as a whole
    (but for what lies inside <supported_clocks>, which is not read)."""
    # The DOCTYPE names a DTD file that is never fetched; drop it so no parser tries.
    body = _without_supported_clocks(re.sub(r"<!DOCTYPE[^>]*>", "", text, count=1))
    try:
        root = ET.fromstring(body)  # noqa: S314 - local nvidia-smi output
    except ET.ParseError as exc:
        line = exc.position[0]
        raise NvsmiError(path, line, f"malformed XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise NvsmiError(path, 1, f"not an nvidia-smi -q -x dump (root element <{root.tag}>)")
    dump = NvsmiDump(Path(path))
    top = _header(root)
    dump.driver_version = _first(top, "driver_version")
    dump.cuda_version = _first(top, "cuda_version")
    dump.timestamp = parse_timestamp(_first(top, "timestamp"))
    index = 0
    for el in root.findall("gpu"):
        kids = [_tree(child) for child in el if child.tag in _XML_READ]
        node = _Node(el.tag, el.get("id", ""), 0, kids)
        dump.gpus.append(_gpu(index, node, dump, _XML))
        index += 1
    return dump


def _xml_processes(section: _Node | None, r: _Reader) -> tuple[ProcessReading, ...]:
    out: list[ProcessReading] = []
    for p in section.children if section else []:
        if p.key != "process_info":
            continue
        pid_node = p.child("pid")
        pid = _safe(r, pid_node, _number) if pid_node else None
        if pid is None:
            continue
        mem_node = p.child("used_memory")
        out.append(
            ProcessReading(
                int(pid),
                _safe(r, mem_node, _memory) if mem_node else None,
                _first(p, "type") or "C",
                _first(p, "process_name"),
            )
        )
    return tuple(out)


# --- one GPU's readings, in either format ---------------------------------------------

_MHZ = _scaled(1e6)
_PCT = _scaled(0.01)
_Paths = tuple[str, ...]
# Reading field -> (converter, paths in the text dump, paths in the XML dump); the first
# path found wins. Names differ across driver branches, hence the alternatives.
_VALUES: dict[str, tuple[Callable[[str], float | None], _Paths, _Paths]] = {
    "sm_clock_max": (_MHZ, ("max clocks/sm",), ("max_clocks/sm_clock",)),
    "mem_clock_max": (_MHZ, ("max clocks/memory",), ("max_clocks/mem_clock",)),
    "power_limit": (
        _number,
        (
            "gpu power readings/current power limit",
            "power readings/enforced power limit",
            "power readings/current power limit",
        ),
        (
            "gpu_power_readings/current_power_limit",
            "power_readings/enforced_power_limit",
            "power_readings/current_power_limit",
        ),
    ),
    "power_limit_default": (
        _number,
        ("gpu power readings/default power limit", "power readings/default power limit"),
        ("gpu_power_readings/default_power_limit", "power_readings/default_power_limit"),
    ),
    "pcie_link_gen_max": (
        _number,
        ("pci/gpu link info/pcie generation/max",),
        ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",),
    ),
    "pcie_link_width_max": (
        _number,
        ("pci/gpu link info/link width/max",),
        ("pci/pci_gpu_link_info/link_widths/max_link_width",),
    ),
    "ecc_enabled": (_flag, ("ecc mode/current",), ("ecc_mode/current_ecc",)),
    "ecc_pending": (_flag, ("ecc mode/pending",), ("ecc_mode/pending_ecc",)),
    "persistence_mode": (_flag, ("persistence mode",), ("persistence_mode",)),
    "compute_mode": (_compute_mode, ("compute mode",), ("compute_mode",)),
    "mig_mode": (_flag, ("mig mode/current",), ("mig_mode/current_mig",)),
    "util": (_PCT, ("utilization/gpu",), ("utilization/gpu_util",)),
    "mem_util": (_PCT, ("utilization/memory",), ("utilization/memory_util",)),
    "memory_total": (_memory, ("fb memory usage/total",), ("fb_memory_usage/total",)),
    "memory_used": (_memory, ("fb memory usage/used",), ("fb_memory_usage/used",)),
    "memory_free": (_memory, ("fb memory usage/free",), ("fb_memory_usage/free",)),
    "memory_reserved": (_memory, ("fb memory usage/reserved",), ("fb_memory_usage/reserved",)),
    "temperature": (_number, ("temperature/gpu current temp",), ("temperature/gpu_temp",)),
    "power": (
        _number,
        (
            "gpu power readings/average power draw",
            "gpu power readings/power draw",
            "power readings/power draw",
            "gpu power readings/instantaneous power draw",
        ),
        (
            "gpu_power_readings/average_power_draw",
            "gpu_power_readings/power_draw",
            "power_readings/power_draw",
            "gpu_power_readings/instant_power_draw",
        ),
    ),
    "sm_clock": (_MHZ, ("clocks/sm",), ("clocks/sm_clock",)),
    "mem_clock": (_MHZ, ("clocks/memory",), ("clocks/mem_clock",)),
    "pstate": (_pstate, ("performance state",), ("performance_state",)),
    "memory_temperature": (
        _number,
        ("temperature/memory current temp",),
        ("temperature/memory_temp",),
    ),
    "bar1_total": (_memory, ("bar1 memory usage/total",), ("bar1_memory_usage/total",)),
    "bar1_used": (_memory, ("bar1 memory usage/used",), ("bar1_memory_usage/used",)),
    "pcie_link_gen": (
        _number,
        ("pci/gpu link info/pcie generation/current",),
        ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",),
    ),
    "pcie_link_width": (
        _number,
        ("pci/gpu link info/link width/current",),
        ("pci/pci_gpu_link_info/link_widths/current_link_width",),
    ),
    "pcie_replays": (_number, ("pci/replays since reset",), ("pci/replay_counter",)),
    "retired_pages_sbe": (
        _number,
        ("retired pages/single bit ecc", "retired pages/single bit ecc/retired count"),
        ("retired_pages/multiple_single_bit_retirement/retired_count",),
    ),
    "retired_pages_dbe": (
        _number,
        ("retired pages/double bit ecc", "retired pages/double bit ecc/retired count"),
        ("retired_pages/double_bit_retirement/retired_count",),
    ),
    "retired_pages_pending": (
        _flag,
        ("retired pages/pending page blacklist", "retired pages/pending page retirement"),
        ("retired_pages/pending_blacklist", "retired_pages/pending_retirement"),
    ),
    "remapped_rows_correctable": (
        _number,
        ("remapped rows/correctable error",),
        ("remapped_rows/remapped_row_corr",),
    ),
    "remapped_rows_uncorrectable": (
        _number,
        ("remapped rows/uncorrectable error",),
        ("remapped_rows/remapped_row_unc",),
    ),
    "remap_pending": (_flag, ("remapped rows/pending",), ("remapped_rows/remapped_row_pending",)),
    "remap_failure": (
        _flag,
        ("remapped rows/remapping failure occurred",),
        ("remapped_rows/remapped_row_failure",),
    ),
}
# Text values and sections: (paths in the text dump, paths in the XML dump).
_PLACES: dict[str, tuple[_Paths, _Paths]] = {
    "uuid": (("gpu uuid",), ("uuid",)),
    "pci_bus_id": (("pci/bus id",), ("pci/pci_bus_id",)),
    "name": (("product name",), ("product_name",)),
    "serial": (("serial number",), ("serial",)),
    "vbios": (("vbios version",), ("vbios_version",)),
    "reasons": (
        ("clocks event reasons", "clocks throttle reasons"),
        ("clocks_event_reasons", "clocks_throttle_reasons"),
    ),
    "counters": (
        ("clocks event reasons counters", "clocks throttle reasons counters"),
        ("clocks_event_reasons_counters", "clocks_throttle_reasons_counters"),
    ),
    "ecc_volatile": (("ecc errors/volatile",), ("ecc_errors/volatile",)),
    "ecc_aggregate": (("ecc errors/aggregate",), ("ecc_errors/aggregate",)),
    "recovery_action": (("gpu recovery action",), ("gpu_recovery_action",)),
    "reset_required": (("gpu reset status/reset required",), ("gpu_reset_status/reset_required",)),
    "drain": (
        ("gpu reset status/drain and reset recommended",),
        ("gpu_reset_status/drain_and_reset_recommended",),
    ),
    "processes": (("processes",), ("processes",)),
}
_COUNTER_PREFIXES = ("clocks_event_reasons_counters_", "clocks_throttle_reasons_counters_")
# The sections of an XML <gpu> that a path above starts in: every read goes through one,
# so the others (voltage, fabric, capabilities, application clocks, ...: two thirds of an
# H200's elements) are not made into nodes (issue 32: a replay reads hundreds of dumps).
_XML_READ = frozenset(
    path.split("/", 1)[0]
    for paths in (*(v[2] for v in _VALUES.values()), *(p[1] for p in _PLACES.values()))
    for path in paths
)


@dataclass(frozen=True, slots=True)
class _Format:
    column: int  # 0: the text dump's paths, 1: the XML dump's
    reason_bits: dict[str, int]
    counter_names: dict[str, str]
    processes: Callable[[_Node | None, _Reader], tuple[ProcessReading, ...]]


def _gpu(index: int, root: _Node, dump: NvsmiDump, fmt: _Format) -> NvsmiGpu:
    r = _Reader(root, dump.problems)
    col = fmt.column

    def value(name: str) -> float | None:
        convert, text_paths, xml_paths = _VALUES[name]
        return r.get(convert, *(text_paths, xml_paths)[col])

    def place(name: str) -> _Paths:
        return _PLACES[name][col]

    def section(name: str) -> _Node | None:
        return next((n for n in map(root.find, place(name)) if n is not None), None)

    static = StaticReading(
        index=index,
        uuid=r.text(*place("uuid")),
        pci_bus_id=pci_key(r.text(*place("pci_bus_id")) or root.value),
        name=r.text(*place("name")),
        serial=r.text(*place("serial")),
        vbios=r.text(*place("vbios")),
        driver_version=dump.driver_version,
        sm_clock_max=value("sm_clock_max"),
        mem_clock_max=value("mem_clock_max"),
        power_limit=value("power_limit"),
        power_limit_default=value("power_limit_default"),
        pcie_link_gen_max=value("pcie_link_gen_max"),
        pcie_link_width_max=value("pcie_link_width_max"),
        ecc_enabled=value("ecc_enabled"),
        ecc_pending=value("ecc_pending"),
        persistence_mode=value("persistence_mode"),
        compute_mode=value("compute_mode"),
        mig_mode=value("mig_mode"),
    )
    fast = FastReading(
        util=value("util"),
        mem_util=value("mem_util"),
        memory_total=value("memory_total"),
        memory_used=value("memory_used"),
        memory_free=value("memory_free"),
        memory_reserved=value("memory_reserved"),
        temperature=value("temperature"),
        power=value("power"),
        sm_clock=value("sm_clock"),
        mem_clock=value("mem_clock"),
        pstate=value("pstate"),
        clock_event_reasons=_reasons(section("reasons"), fmt.reason_bits),
    )
    counters = section("counters")
    cet: dict[str, float] = {}
    for c in counters.children if counters else []:
        key = c.key
        for prefix in _COUNTER_PREFIXES:
            key = key.removeprefix(prefix)
        name = fmt.counter_names.get(key)
        v = _safe(r, c, _scaled(1e-6))
        if name and v is not None:
            cet[name] = v
    vol = _ecc_sums(section("ecc_volatile"))
    agg = _ecc_sums(section("ecc_aggregate"))
    slow = SlowReading(
        memory_temperature=value("memory_temperature"),
        bar1_total=value("bar1_total"),
        bar1_used=value("bar1_used"),
        clock_event_time=cet,
        pcie_link_gen=value("pcie_link_gen"),
        pcie_link_width=value("pcie_link_width"),
        pcie_replays=value("pcie_replays"),
        ecc_volatile_corrected=vol[0],
        ecc_volatile_uncorrected=vol[1],
        ecc_aggregate_corrected=agg[0],
        ecc_aggregate_uncorrected=agg[1],
        retired_pages_sbe=value("retired_pages_sbe"),
        retired_pages_dbe=value("retired_pages_dbe"),
        retired_pages_pending=value("retired_pages_pending"),
        remapped_rows_correctable=value("remapped_rows_correctable"),
        remapped_rows_uncorrectable=value("remapped_rows_uncorrectable"),
        remap_pending=value("remap_pending"),
        remap_failure=value("remap_failure"),
        recovery_action=_recovery_of(
            r, place("recovery_action"), place("reset_required"), place("drain")
        ),
        processes=fmt.processes(section("processes"), r),
    )
    return NvsmiGpu(static, fast, slow)


_TEXT = _Format(0, _REASON_BITS_TEXT, _COUNTERS_TEXT, _text_processes)
_XML = _Format(1, _REASON_BITS_XML, _COUNTERS_XML, _xml_processes)


# --- entry points -----------------------------------------------------------------------


def parse_dump(text: str, path: Path | str = "<dump>") -> NvsmiDump:
    """Auto-detects XML, ``-q`` text, the default table or nvidia-smi's failure messages
    (which can also follow a table or a dump: a GPU whose handle failed)."""
    head = text.lstrip()[:200]
    if head.startswith("<?xml") or head.startswith("<nvidia_smi_log") or "<!DOCTYPE" in head:
        dump = parse_xml(text, path)
        dump.kind = "nvidia-smi-q-xml"
        return dump
    from moptd.gpu.nvsmi_table import looks_like_table, parse_table

    failures = parse_failures(text)
    # -q first: a file holding both a -q dump and a table is read for the richer dump
    if _GPU_SECTION.search(text):
        dump = parse_text(text, path)
        dump.kind = "nvidia-smi-q"
    elif looks_like_table(text):
        dump = parse_table(text, path)
        dump.kind = "nvidia-smi-table"
    elif failures:
        dump = NvsmiDump(Path(path), kind="nvidia-smi-failure")
    else:
        dump = parse_text(text, path)  # raises: not nvidia-smi output
        dump.kind = "nvidia-smi-q"
    dump.failures = failures
    return dump


_GPU_SECTION = re.compile(r"^GPU\s+[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:", re.MULTILINE)


def read_dump(path: Path) -> NvsmiDump:
    """Read one ``nvidia-smi -q`` or ``-q -x`` file; raises NvsmiError when unreadable."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_DUMP_BYTES + 1)
    except OSError as exc:
        raise NvsmiError(path, 0, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_DUMP_BYTES:
        raise NvsmiError(path, 0, f"larger than {MAX_DUMP_BYTES} bytes; not an nvidia-smi dump")
    return parse_dump(data.decode("utf-8", errors="replace"), path)


def dump_to_batch(dump: NvsmiDump, index_by_bus: dict[str, int] | None = None) -> Batch:
    """The gpu.* (and process.gpu_memory) samples the NVML collector would have made;
    for failure messages, the samples of that NVML outcome (moptd.gpu.nvsmi_failure)."""
    batch = Batch()
    for g in dump.gpus:
        batch.extend(gpu_batch(g.static, g.fast, g.slow))
    if dump.failures:
        known = {g.static.pci_bus_id: g.static.index for g in dump.gpus}
        batch.extend(failure_batch(dump.failures, {**(index_by_bus or {}), **known}))
    elif dump.gpus:
        batch.add("gpu.nvml_init_error", NODE, 0.0)  # nvidia-smi read GPUs: NVML started
    return batch


_KIND_NAMES = {
    "nvidia-smi-q": "nvidia-smi -q",
    "nvidia-smi-q-xml": "nvidia-smi -q -x",
    "nvidia-smi-table": "nvidia-smi",
    "nvidia-smi-failure": "nvidia-smi failure",
}


def summary(dump: NvsmiDump) -> str:
    """One line on what a dump held, for the list of what was read: "nvidia-smi -q: 8 ×
    NVIDIA H100 80GB HBM3, driver 550.54.15", "nvidia-smi failure: ..." (the message)."""
    head = _KIND_NAMES.get(dump.kind, "nvidia-smi")
    parts: list[str] = []
    names: dict[str, int] = {}
    for g in dump.gpus:
        names[g.static.name or "GPU"] = names.get(g.static.name or "GPU", 0) + 1
    parts.extend(f"{n} × {name}" for name, n in names.items())
    if dump.driver_version:
        parts.append(f"driver {dump.driver_version}")
    parts.extend(f.message for f in dump.failures)
    return f"{head}: {', '.join(parts) or 'no GPU'}"


def sniff(text: str) -> str | None:
    """The kind of nvidia-smi output ``text`` is (a kind of NvsmiDump.kind), or None: for
    sorting a paste by content (its place is gpu/nvidia-smi/). Reads no more than a table
    or a failure check does; never raises."""
    head = text.lstrip()[:200]
    if head.startswith("<?xml") or head.startswith("<nvidia_smi_log"):
        return "nvidia-smi-q-xml" if "<nvidia_smi_log" in text[:4096] else None
    from moptd.gpu.nvsmi_table import looks_like_table

    if _GPU_SECTION.search(text) or re.search(r"^==============NVSMI LOG", text, re.M):
        return "nvidia-smi-q"
    if looks_like_table(text):
        return "nvidia-smi-table"
    if parse_failures(text):
        return "nvidia-smi-failure"
    return None
