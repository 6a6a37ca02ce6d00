"""Reader of the default ``nvidia-smi`` table (what a bare ``nvidia-smi`` prints).

The table becomes the same NvsmiDump the ``-q`` readers make (moptd.gpu.nvsmi), so
``dump_to_batch`` gives the samples a ``-q`` dump gives for the fields the table holds:
name (as printed, "..." where nvidia-smi cut it), bus id, persistence mode, display
active, volatile uncorrectable ECC count (a number, "Off" for ECC disabled), fan,
temperature, performance state, power draw and cap, memory used and total, utilisation,
compute mode, MIG mode, the processes, and the driver and CUDA versions of the banner.
What the table does not show (UUID, clocks, PCIe link, throttle reasons, ...) stays
unknown: never zero.

Layouts differ by driver branch and are told apart by their cells, not by column
positions: R325-R440 (two rows a GPU, "MB" before R400), R450-R530 (a third row for MIG
mode, GI/CI columns in the processes), R535+ (wider cells), R610 ("KMD Version", "CUDA
UMD Version"). "N/A" is unknown; "ERR!" (NVML failed that query) is unknown and noted in
``problems`` with its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from moptd.gpu.nvsmi import MIB, NvsmiDump, NvsmiGpu, NvsmiProblem, parse_timestamp
from moptd.gpu.readings import FastReading, ProcessReading, SlowReading, StaticReading
from moptd.proc.pci import pci_key

_BANNER = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+(?:Driver|KMD) Version:\s*(?P<driver>\S+)"
    r"(?:\s+CUDA (?:UMD )?Version:\s*(?P<cuda>\S+))?"
)
_RULE = re.compile(r"^\s*[+|][-=+|]+\s*$")  # +----+----+ and |====+====|
_GPU_ROW = re.compile(r"^\s*(?P<index>\d+)\s+(?P<name>.*?)\s+(?P<persist>On|Off|N/A|TCC|WDDM)\s*$")
_BUS_CELL = re.compile(
    r"^\s*(?P<bus>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*(?P<disp>\S+)?\s*$"
)
_STATE_ROW = re.compile(
    r"^\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+(?P<power>\S+)\s*/\s*(?P<cap>\S+)\s*$"
)
_MEMORY_CELL = re.compile(r"^\s*(?P<used>\S+)\s*/\s*(?P<total>\S+)\s*$")
_UTIL_CELL = re.compile(
    r"^\s*(?P<util>\S+)\s+(?P<mode>Default|E\. Process|E\. Thread|Prohibited|N/A)\s*$"
)
_COMPUTE = {"Default": 0.0, "E. Thread": 1.0, "Prohibited": 2.0, "E. Process": 3.0}
_MEMORY_UNIT = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>MiB|MB|GiB|GB|KiB|B)$")
_SCALE = {"B": 1, "KiB": 1024, "MiB": MIB, "MB": MIB, "GiB": 1024 * MIB, "GB": 1024 * MIB}
_NEXT_BOX = re.compile(r"^\s*(?:MIG devices|Processes|Compute processes):")
_PROCESS_TYPES = frozenset({"C", "G", "C+G", "M", "M+C", "M+G", "M+C+G"})
# One table is a few KiB for 8 GPUs; a paste of several hundred lines is still a table.
MAX_TABLE_LINES = 20_000


def looks_like_table(text: str) -> bool:
    """True when the text holds the banner of the default nvidia-smi table."""
    return any("|" in line and _BANNER.search(line) for line in text.splitlines()[:MAX_TABLE_LINES])


@dataclass
class _Block:
    """One GPU's rows: the cells of each row between the outer bars."""

    line: int
    rows: list[list[str]] = field(default_factory=list)


@dataclass
class _Gpu:
    index: int
    name: str = ""
    bus: str = ""
    persistence: float | None = None
    ecc_uncorrected: float | None = None
    ecc_enabled: float | None = None
    temperature: float | None = None
    pstate: float | None = None
    power: float | None = None
    power_limit: float | None = None
    memory_used: float | None = None
    memory_total: float | None = None
    util: float | None = None
    compute_mode: float | None = None
    mig_mode: float | None = None
    processes: list[ProcessReading] = field(default_factory=list)


class _Values:
    """Cell text -> base units; "N/A" is unknown, "ERR!" is unknown and noted."""

    def __init__(self, problems: list[NvsmiProblem]) -> None:
        self.problems = problems

    def _known(self, text: str, line: int, key: str) -> str | None:
        t = text.strip()
        if t.upper() in ("N/A", "[N/A]", ""):
            return None
        if t.upper().startswith("ERR"):
            self.problems.append(NvsmiProblem(line, key, "nvidia-smi printed ERR! (NVML failed)"))
            return None
        return t

    def number(self, text: str, line: int, key: str, suffix: str) -> float | None:
        t = self._known(text, line, key)
        if t is None:
            return None
        m = re.fullmatch(r"(-?\d+(?:\.\d+)?)" + re.escape(suffix), t)
        if m is None:
            self.problems.append(NvsmiProblem(line, key, f"not a number: {t!r}"))
            return None
        return float(m.group(1))

    def memory(self, text: str, line: int, key: str) -> float | None:
        t = self._known(text, line, key)
        if t is None:
            return None
        m = _MEMORY_UNIT.fullmatch(t)
        if m is None:
            self.problems.append(NvsmiProblem(line, key, f"not a memory size: {t!r}"))
            return None
        return float(m.group("n")) * _SCALE[m.group("unit")]

    def pstate(self, text: str, line: int) -> float | None:
        t = self._known(text, line, "perf")
        if t is None:
            return None
        if re.fullmatch(r"P\d{1,2}", t):
            return float(t[1:])
        self.problems.append(NvsmiProblem(line, "perf", f"not a performance state: {t!r}"))
        return None


def _cells(line: str) -> list[str] | None:
    """The cells of one table row, or None when the line is not a row."""
    s = line.strip()
    if len(s) < 2 or not s.startswith("|") or not s.endswith("|"):
        return None
    return s[1:-1].split("|")


def parse_table(text: str, path: Path | str = "<table>") -> NvsmiDump:
    """The default ``nvidia-smi`` output -> NvsmiDump (no GPU when none could be read)."""
    dump = NvsmiDump(Path(path))
    lines = text.splitlines()[:MAX_TABLE_LINES]
    banner_at = next(
        (i for i, line in enumerate(lines) if "|" in line and _BANNER.search(line)), None
    )
    if banner_at is None:
        return dump
    banner = _BANNER.search(lines[banner_at])
    assert banner is not None
    dump.driver_version = banner.group("driver")
    cuda = banner.group("cuda") or ""
    dump.cuda_version = "" if cuda.upper() == "N/A" else cuda
    # The clock line nvidia-smi prints above the box; a prompt or banner may come before it.
    for line in reversed(lines[max(0, banner_at - 3) : banner_at]):
        t = parse_timestamp(line)
        if t is not None:
            dump.timestamp = t
            break
    values = _Values(dump.problems)
    gpus, end = _gpu_section(lines, banner_at + 1, values, dump)
    by_index = {g.index: g for g in gpus}
    _processes(lines, end, by_index, values)
    for g in gpus:
        dump.gpus.append(_reading(g, dump.driver_version))
    return dump


def _gpu_section(
    lines: list[str], start: int, values: _Values, dump: NvsmiDump
) -> tuple[list[_Gpu], int]:
    """The GPU blocks after the column header's ==== rule; returns them and where the
    section ended."""
    i = start
    while i < len(lines) and "===" not in lines[i]:
        if "Processes" in lines[i]:
            return [], i
        i += 1
    blocks: list[_Block] = []
    block: _Block | None = None
    i += 1
    while i < len(lines):
        line = lines[i]
        cells = _cells(line)
        if cells is None:
            if _RULE.match(line):
                block = None
                i += 1
                continue
            break  # the blank line before the next section
        if _NEXT_BOX.match(cells[0]):
            break  # a box that follows without a blank line
        if block is None:
            block = _Block(i + 1)
            blocks.append(block)
        block.rows.append(cells)
        i += 1
    gpus = []
    for b in blocks:
        g = _gpu(b, values)
        if g is not None:
            gpus.append(g)
        else:
            dump.problems.append(NvsmiProblem(b.line, "gpu", "not a GPU row of the table"))
    return gpus, i


def _gpu(block: _Block, values: _Values) -> _Gpu | None:
    if len(block.rows) < 2 or len(block.rows[0]) != 3 or len(block.rows[1]) != 3:
        return None
    first = _GPU_ROW.match(block.rows[0][0])
    if first is None:
        return None
    g = _Gpu(int(first.group("index")), name=first.group("name").strip())
    line = block.line
    persist = first.group("persist")
    g.persistence = {"On": 1.0, "Off": 0.0}.get(persist)
    bus = _BUS_CELL.match(block.rows[0][1])
    if bus is not None:
        g.bus = pci_key(bus.group("bus"))
    ecc = block.rows[0][2].strip()
    if ecc == "Off":
        g.ecc_enabled = 0.0
    elif ecc.isdigit():
        g.ecc_enabled = 1.0
        g.ecc_uncorrected = float(ecc)
    else:
        values.number(ecc, line, "volatile uncorr. ecc", "")
    line += 1
    state = _STATE_ROW.match(block.rows[1][0])
    if state is not None:
        g.temperature = values.number(state.group("temp"), line, "temp", "C")
        g.pstate = values.pstate(state.group("perf"), line)
        g.power = values.number(state.group("power"), line, "pwr:usage", "W")
        g.power_limit = values.number(state.group("cap"), line, "pwr:cap", "W")
    memory = _MEMORY_CELL.match(block.rows[1][1])
    if memory is not None:
        g.memory_used = values.memory(memory.group("used"), line, "memory-usage used")
        g.memory_total = values.memory(memory.group("total"), line, "memory-usage total")
    util = _UTIL_CELL.match(block.rows[1][2])
    if util is not None:
        g.util = _ratio(values.number(util.group("util"), line, "gpu-util", "%"))
        g.compute_mode = _COMPUTE.get(util.group("mode"))
    if len(block.rows) >= 3 and len(block.rows[2]) == 3:
        mig = block.rows[2][2].strip()
        g.mig_mode = {"Enabled": 1.0, "Disabled": 0.0}.get(mig)
    return g


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100


def _processes(lines: list[str], start: int, gpus: dict[int, _Gpu], values: _Values) -> None:
    """The "Processes:" box: one row a process; GI and CI columns from R450 on."""
    i = start
    while i < len(lines) and not re.search(r"\b(?:Compute p|P)rocesses:", lines[i]):
        i += 1
    header = ""
    while i < len(lines) and "===" not in lines[i]:
        header += lines[i]
        i += 1
    with_instances = bool(re.search(r"\bGI\b", header))
    for lineno in range(i + 1, len(lines)):
        cells = _cells(lines[lineno])
        if cells is None:
            if _RULE.match(lines[lineno]):
                continue
            break
        tokens = " ".join(cells).split()
        p = _process(tokens, with_instances, lineno + 1, values)
        if p is not None and p[0] in gpus:
            gpus[p[0]].processes.append(p[1])


def _process(
    tokens: list[str], with_instances: bool, line: int, values: _Values
) -> tuple[int, ProcessReading] | None:
    skip = 3 if with_instances else 1
    if len(tokens) < skip + 3 or not tokens[0].isdigit():
        return None  # "No running processes found", a wrapped name
    pid, kind = tokens[skip], tokens[skip + 1]
    if not pid.isdigit() or kind not in _PROCESS_TYPES:
        return None
    memory = values.memory(tokens[-1], line, "gpu memory usage")
    name = " ".join(tokens[skip + 2 : -1])
    return int(tokens[0]), ProcessReading(int(pid), memory, kind, name)


def _reading(g: _Gpu, driver: str) -> NvsmiGpu:
    static = StaticReading(
        index=g.index,
        pci_bus_id=g.bus,
        name=g.name,
        driver_version=driver,
        power_limit=g.power_limit,
        ecc_enabled=g.ecc_enabled,
        persistence_mode=g.persistence,
        compute_mode=g.compute_mode,
        mig_mode=g.mig_mode,
    )
    fast = FastReading(
        util=g.util,
        memory_total=g.memory_total,
        memory_used=g.memory_used,
        temperature=g.temperature,
        power=g.power,
        pstate=g.pstate,
    )
    slow = SlowReading(ecc_volatile_uncorrected=g.ecc_uncorrected, processes=tuple(g.processes))
    return NvsmiGpu(static, fast, slow)
