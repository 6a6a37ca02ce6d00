"""The recorded NVML backend: replays readings captured from a real GPU host.

Recording format (``moptd-nvml-recording/2``), JSON lines, one object per line:

- line 1, the header: ``{"format": "moptd-nvml-recording/2", "driver_version": "580.159.04",
  "gpus": 1, "source": "free text"}``
- a reading: ``{"t": 1795969286.868, "gpu": 0, "tier": "static"|"fast"|"slow"|"profile",
  "reading": {...}}`` where ``reading`` holds the fields of StaticReading, FastReading,
  SlowReading or ProfileReading (moptd/gpu/readings.py) in base units; absent fields are
  None. Version 2 added the "profile" tier (GPM) and the per-process utilisation fields of
  a slow entry's processes; version 1 recordings (neither) replay as they are.
- a fault, for tests and drills: ``{"t": ..., "gpu": 1, "tier": "fast", "fault": "lost"}``
  (every later read of that GPU raises GpuLost), ``"fault": "hang", "seconds": 3``
  (that read blocks, then the next entry is returned), ``"fault": "error", "code": 10``
  (that read raises NvmlCallError).
- an Xid event: ``{"t": ..., "gpu": 0, "xid": 79}``, delivered once by ``wait_xid``.

Replay is by call, not by clock: each ``read_<tier>(gpu)`` returns that GPU's next entry of
the tier and wraps around at the end. A "slow" entry holds both slow tiers: ``read_slow``
returns it without the costly values, ``read_costly`` (its own cursor over the same
entries) only them. ``replicate=N`` presents every recorded GPU N times
(GPU i replays recorded GPU i % gpus) so an 8-GPU daemon can run from a 1-GPU recording.

``read_samples`` turns a recording, or the plain rows that a bundle's optional
``gpu/samples.jsonl`` holds (``sample_row`` writes them, for ``moptd record``), into timed
batches through ``gpu_batch``: the one reader of that file.

Command line::

    python -m moptd.gpu.recorded record --out FILE --seconds N --interval S
    python -m moptd.gpu.recorded build --dump nvsmi_idle.xml --dump nvsmi_load.xml \\
        --samples nvml_samples.jsonl --out FILE
    python -m moptd.gpu.recorded build-probe --probe gpu_depth_probe.json --out FILE
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from moptd.gpu.batch import add_fast, add_profile, add_slow, gpu_batch
from moptd.gpu.nvsmi import read_dump
from moptd.gpu.readings import (
    NVLINK_MAPPINGS,
    PROCESS_UTIL_FIELDS,
    FastReading,
    GpuLost,
    NvmlCallError,
    ProcessReading,
    ProfileReading,
    SlowReading,
    StaticReading,
    merge_costly,
    reading_from_dict,
    reading_to_dict,
    split_costly,
)
from moptd.located import LocatedError
from moptd.observations import Batch, Sample, gpu_subject
from moptd.proc.pci import pci_key

FORMAT = "moptd-nvml-recording/2"
READABLE_FORMATS = ("moptd-nvml-recording/1", FORMAT)
TIERS = ("static", "fast", "slow", "profile")
log = logging.getLogger(__name__)

Reading = StaticReading | FastReading | SlowReading | ProfileReading
_CLASSES: dict[str, type[Any]] = {
    "static": StaticReading,
    "fast": FastReading,
    "slow": SlowReading,
    "profile": ProfileReading,
}


class RecordingError(LocatedError):
    """A recording line that cannot be used; names the file, line and key."""


@dataclass(frozen=True, slots=True)
class Entry:
    t: float
    gpu: int
    tier: str  # static | fast | slow | profile
    reading: Reading | None = None
    fault: str = ""  # lost | hang | error
    seconds: float = 0.0
    code: int = 0


@dataclass
class Recording:
    driver_version: str = ""
    gpus: int = 0
    source: str = ""
    entries: list[Entry] = field(default_factory=list)
    xids: list[tuple[float, int, int]] = field(default_factory=list)  # (t, gpu, xid)

    def stream(self, gpu: int, tier: str) -> list[Entry]:
        return [e for e in self.entries if e.gpu == gpu and e.tier == tier]


def load_recording(path: Path) -> Recording:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordingError(path, 0, f"cannot read: {exc}") from None
    return parse_recording(lines, path)


def parse_recording(lines: Sequence[str], path: Path | str = "<recording>") -> Recording:
    rec = Recording()
    for lineno, obj in _objects(lines, path, "expected a JSON object"):
        try:
            _take(rec, obj)
        except (KeyError, ValueError, TypeError, OverflowError) as exc:  # inf as an index
            raise RecordingError(path, lineno, _why(exc)) from None
    if rec.gpus <= 0:
        rec.gpus = 1 + max((e.gpu for e in rec.entries), default=-1)
    if rec.gpus <= 0:
        raise RecordingError(path, 1, "no GPU readings in the recording")
    return rec


def _objects(
    lines: Iterable[str], path: Path | str, not_object: str
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank JSON line; RecordingError names the line."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordingError(path, lineno, f"not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise RecordingError(path, lineno, not_object)
        yield lineno, obj


def _why(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"missing key {exc.args[0]!r}"
    return str(exc)


def _take(rec: Recording, obj: dict[str, Any]) -> None:
    if "format" in obj:
        if obj["format"] not in READABLE_FORMATS:
            raise ValueError(f"key 'format': unsupported {obj['format']!r} (want {FORMAT})")
        rec.driver_version = str(obj.get("driver_version", ""))
        rec.gpus = int(obj.get("gpus", 0))
        rec.source = str(obj.get("source", ""))
        return
    t = float(obj.get("t", 0.0))
    gpu = int(obj["gpu"])
    if gpu < 0:
        raise ValueError(f"key 'gpu': negative index {gpu}")
    if "xid" in obj:
        rec.xids.append((t, gpu, int(obj["xid"])))
        return
    tier = obj["tier"]
    if tier not in _CLASSES:
        raise ValueError(f"key 'tier': {tier!r} is not one of {', '.join(TIERS)}")
    if "fault" in obj:
        fault = obj["fault"]
        if fault not in ("lost", "hang", "error"):
            raise ValueError(f"key 'fault': {fault!r} is not lost, hang or error")
        rec.entries.append(
            Entry(t, gpu, tier, None, fault, float(obj.get("seconds", 0)), int(obj.get("code", 0)))
        )
        return
    data = obj["reading"]
    if not isinstance(data, dict):
        raise ValueError("key 'reading': expected an object")
    reading = reading_from_dict(_CLASSES[tier], data)
    if isinstance(reading, StaticReading):
        reading = replace(reading, index=gpu)
    rec.entries.append(Entry(t, gpu, tier, reading))


def dump_recording(rec: Recording, out: TextIO) -> None:
    """Writes version 1 when nothing in the recording needs version 2, so that a moptd
    without the profile tier still replays it."""
    _write_header(rec, FORMAT if _needs_v2(rec) else READABLE_FORMATS[0], out)
    for e in rec.entries:
        out.write(json.dumps(_entry_dict(e)) + "\n")
    for t, gpu, xid in rec.xids:
        out.write(json.dumps({"t": t, "gpu": gpu, "xid": xid}) + "\n")


def _write_header(rec: Recording, fmt: str, out: TextIO) -> None:
    header = {
        "format": fmt,
        "driver_version": rec.driver_version,
        "gpus": rec.gpus,
        "source": rec.source,
    }
    out.write(json.dumps(header) + "\n")


def _needs_v2(rec: Recording) -> bool:
    """Whether an entry holds what version 2 added: the profile tier, per-process
    utilisation, per-link NVLink values, MIG devices."""
    for e in rec.entries:
        if e.tier == "profile":
            return True
        r = e.reading
        if not isinstance(r, SlowReading):
            continue
        if r.mig_devices or any(getattr(r, f) for f in NVLINK_MAPPINGS):
            return True
        if any(getattr(p, f) is not None for p in r.processes for f in PROCESS_UTIL_FIELDS):
            return True
    return False


def _entry_dict(e: Entry) -> dict[str, Any]:
    d: dict[str, Any] = {"t": round(e.t, 3), "gpu": e.gpu, "tier": e.tier}
    if e.fault:
        d.update(fault=e.fault, seconds=e.seconds, code=e.code)
    elif e.reading is not None:
        d["reading"] = reading_to_dict(e.reading)
    return d


class RecordedBackend:
    """A GpuBackend over a Recording (see the module docstring)."""

    def __init__(self, recording: Recording, replicate: int = 1) -> None:
        if replicate < 1:
            raise ValueError(f"replicate must be at least 1, not {replicate}")
        self.recording = recording
        self.replicate = replicate
        self._streams = {
            (g, tier): recording.stream(g, tier) for g in range(recording.gpus) for tier in TIERS
        }
        for g in range(recording.gpus):
            self._streams[(g, "costly")] = self._streams[(g, "slow")]
        self._cursor: dict[tuple[int, str], int] = {}
        self._lost: dict[int, int] = {}
        self._lock = threading.Lock()
        self._xids = list(recording.xids)
        self._closed = threading.Event()
        self._xid_wake = threading.Event()

    @classmethod
    def from_file(cls, path: Path, replicate: int = 1) -> RecordedBackend:
        return cls(load_recording(path), replicate)

    def init(self) -> None:
        self._closed.clear()
        self._xid_wake.clear()

    def shutdown(self) -> None:
        self._closed.set()
        self.stop_waiting()

    def driver_version(self) -> str:
        return self.recording.driver_version

    def device_count(self) -> int:
        return self.recording.gpus * self.replicate

    def _source(self, index: int) -> int:
        if not 0 <= index < self.device_count():
            raise NvmlCallError(index, 2, "no such GPU in the recording")
        return index % self.recording.gpus

    def _next(self, index: int, tier: str) -> Reading | None:
        """The next entry of this GPU's tier; faults take effect here."""
        while True:
            with self._lock:
                if index in self._lost:
                    raise GpuLost(index, self._lost[index], "recorded: GPU is lost")
                stream = self._streams[(self._source(index), tier)]
                if not stream:
                    return None
                i = self._cursor.get((index, tier), 0)
                self._cursor[(index, tier)] = (i + 1) % len(stream)
                entry = stream[i]
            if entry.fault == "lost":
                with self._lock:
                    self._lost[index] = entry.code or 15
                continue
            if entry.fault == "hang":
                # Blocks like a hung NVML call; the shutdown event ends it early.
                self._closed.wait(entry.seconds)
                continue
            if entry.fault == "error":
                raise NvmlCallError(index, entry.code, "recorded NVML error")
            return entry.reading

    def read_static(self, index: int) -> StaticReading:
        r = self._next(index, "static")
        src = self._source(index)
        if not isinstance(r, StaticReading):
            return StaticReading(index=index, driver_version=self.recording.driver_version)
        replica = index // self.recording.gpus
        if replica == 0 and src == index:
            return r
        return replace(r, index=index, uuid=f"{r.uuid}-replica{replica}" if r.uuid else "")

    def read_fast(self, index: int) -> FastReading:
        r = self._next(index, "fast")
        return r if isinstance(r, FastReading) else FastReading()

    def read_slow(self, index: int) -> SlowReading:
        r = self._next(index, "slow")
        return split_costly(r)[0] if isinstance(r, SlowReading) else SlowReading()

    def read_costly(self, index: int, energy: bool = True) -> SlowReading:
        """The costly part of the slow stream (its own cursor: a slower cadence); without
        ``energy``, as the live backend, no energy value."""
        r = self._next(index, "costly")
        costly = split_costly(r)[1] if isinstance(r, SlowReading) else SlowReading()
        return costly if energy else replace(costly, energy=None)

    def read_profile(self, index: int) -> ProfileReading:
        """The next profile entry; a recording without any (version 1) has no GPM values."""
        r = self._next(index, "profile")
        return r if isinstance(r, ProfileReading) else ProfileReading()

    def wait_xid(self, timeout_ms: int) -> list[tuple[int, int]]:
        with self._lock:
            pending, self._xids = self._xids, []
        if pending:
            return [(gpu, xid) for _, gpu, xid in pending]
        self._xid_wake.wait(timeout_ms / 1000.0)
        return []

    def stop_waiting(self) -> None:
        self._xid_wake.set()


# --- building a recording from real captures ---------------------------------------


def from_captures(dumps: Iterable[Path], samples: Path | None) -> Recording:
    """A recording from nvidia-smi -q -x/-q dumps (static and slow tiers) and the
    nvml_samples.jsonl capture (fast tier: util, memory used, power, temperature, clocks,
    clock-event reasons, pstate; slow tier: PCIe generation and processes). Each sample
    takes the static and slow values of the latest dump taken before it. Values the
    captures do not hold stay None."""
    loaded = sorted((read_dump(p) for p in dumps), key=lambda d: d.timestamp or 0.0)
    if not loaded or not loaded[0].gpus:
        raise ValueError("need at least one nvidia-smi dump with a GPU")
    rec = Recording(
        driver_version=loaded[0].driver_version,
        gpus=len(loaded[0].gpus),
        source="built from " + ", ".join(str(d.path.name) for d in loaded),
    )
    for g in loaded[0].gpus:
        rec.entries.append(Entry(loaded[0].timestamp or 0.0, g.static.index, "static", g.static))
    if samples is None:
        for d in loaded:
            for g in d.gpus:
                t = d.timestamp or 0.0
                rec.entries.append(Entry(t, g.static.index, "fast", g.fast))
                rec.entries.append(Entry(t, g.static.index, "slow", g.slow))
        return rec
    rec.source += f", {samples.name}"
    for lineno, line in enumerate(samples.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            s = json.loads(line)
            t = float(s["t"])
        except (ValueError, KeyError, TypeError) as exc:
            raise RecordingError(samples, lineno, _why(exc)) from None
        base = loaded[0]
        for d in loaded:
            if (d.timestamp or 0.0) <= t:
                base = d
        gpu = int(s.get("gpu", 0))
        g = base.gpus[min(gpu, len(base.gpus) - 1)]
        fast = replace(
            _sample_fast(s),
            memory_total=g.fast.memory_total,
            memory_reserved=g.fast.memory_reserved,
        )
        procs = _sample_procs(s)
        slow = replace(
            g.slow,
            pcie_link_gen=_scale(s.get("pcie_gen"), 1),
            processes=procs,
        )
        rec.entries.append(Entry(t, gpu, "fast", fast))
        rec.entries.append(Entry(t, gpu, "slow", slow))
    return rec


def from_probe(path: Path) -> Recording:
    """A recording from a tools/gpu_depth_probe.py capture: per phase (idle, tensor load,
    DRAM load) one fast entry (NVML utilisation), one slow entry (the running compute
    processes joined to NVML's per-process utilisation, as the live backend joins them)
    and one profile entry (the GPM metrics moptd exports, scaled as the live backend
    scales them); the static entry from the probe's GPU identity. Values the probe does
    not hold stay None. Raises RecordingError naming the key of bad input."""
    try:
        probe = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(probe, dict) or probe.get("format") != "moptd-gpu-depth-probe/1":
            raise ValueError("format: not a moptd-gpu-depth-probe/1 capture")
        return _probe_recording(probe, path.name)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordingError(path, 0, f"cannot read: {exc}") from None
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise RecordingError(path, 0, _why(exc)) from None


def _probe_recording(probe: dict[str, Any], name: str) -> Recording:
    driver = str(probe.get("driver_version", ""))
    gpus = probe["gpus"]
    rec = Recording(driver_version=driver, gpus=len(gpus), source=f"built from {name}")
    t0 = float(probe["taken"])
    for g in gpus:
        rec.entries.append(
            Entry(
                t0,
                int(g["index"]),
                "static",
                StaticReading(
                    index=int(g["index"]),
                    uuid=str(g.get("uuid", "")),
                    pci_bus_id=pci_key(str(g.get("pci_bus_id", ""))),
                    name=str(g.get("name", "")),
                    driver_version=driver,
                    mig_mode=_probe_mig(g.get("mig_mode")),
                ),
            )
        )
    for phase in probe["phases"]:
        for gpu, g in enumerate(phase["gpus"]):
            gpm = g.get("gpm") or {}
            t = float(gpm.get("t2", t0))
            util = g.get("utilization") or {}
            fast = FastReading(
                util=_percent(util.get("gpu")),
                mem_util=_percent(util.get("memory")),
            )
            rec.entries.append(Entry(t, gpu, "fast", fast))
            rec.entries.append(Entry(t, gpu, "slow", SlowReading(processes=_probe_procs(g))))
            rec.entries.append(Entry(t, gpu, "profile", _probe_profile(gpm)))
    return rec


def _percent(v: Any) -> float | None:
    """% -> ratio with the live backend's arithmetic (util.gpu / 100.0)."""
    return None if v is None else float(v) / 100.0


def _probe_mig(v: Any) -> float | None:
    if isinstance(v, list) and v and isinstance(v[0], int | float):
        return float(bool(v[0]))
    return None


def _probe_procs(g: dict[str, Any]) -> tuple[ProcessReading, ...]:
    pu = g.get("process_util") or {}
    running = pu.get("ComputeRunningProcesses")
    if not isinstance(running, list):
        return ()
    samples = pu.get("GetProcessUtilization")
    util: dict[int, tuple[float, float, float, float]] | None
    if isinstance(samples, list):
        util = {
            int(x["pid"]): (x["sm"] / 100, x["mem"] / 100, x["enc"] / 100, x["dec"] / 100)
            for x in samples
        }
    elif isinstance(samples, dict) and samples.get("nvml_return") == 6:  # NOT_FOUND
        util = {}
    else:
        util = None
    out = []
    for x in running:
        pid = int(x["pid"])
        used = x.get("used")
        p = ProcessReading(pid, None if used is None else float(used), "C")
        if util is not None:
            sm, mem, enc, dec = util.get(pid, (0.0, 0.0, 0.0, 0.0))
            p = replace(p, sm_util=sm, mem_util=mem, enc_util=enc, dec_util=dec)
        out.append(p)
    return tuple(sorted(out, key=lambda p: p.pid))


def _probe_profile(gpm: dict[str, Any]) -> ProfileReading:
    supported = gpm.get("supported")
    if supported != 1:
        return ProfileReading(gpm_supported=0.0 if supported == 0 else None)
    # the live backend's table (imported here: it imports pynvml, which a replay of
    # dumps or samples.jsonl never needs; BENCHMARKS.md, issue 32 on the merged tree)
    from moptd.gpu.backend import GPM_METRICS

    by_id = {int(m["id"]): m for m in gpm.get("metrics", [])}
    values: dict[str, float | None] = {}
    for field_name, mid, scale in GPM_METRICS:
        m = by_id.get(mid)
        ok = m is not None and m.get("return") == 0 and m.get("value") is not None
        values[field_name] = float(m["value"]) * scale if ok and m is not None else None
    return ProfileReading(gpm_supported=1.0, mig_activity={}, **values)


# --- gpu/samples.jsonl rows ----------------------------------------------------------
# One JSON object per line, one GPU per object (tests/fixtures/h200/nvml_samples.jsonl):
#   {"t": unix_s, "gpu": 0, "util": %, "mem_util": %, "mem_total": bytes,
#    "mem_used": bytes, "mem_free": bytes, "mem_reserved": bytes, "power_mw": mW,
#    "temp": C, "sm_clock": MHz, "mem_clock": MHz, "clock_event_reasons": mask,
#    "pstate": n, "pcie_gen": n, "procs": [[pid, bytes], ...]}
# Every key but t is optional; "gpu" defaults to 0. The one scale table, both directions:
# row key -> (FastReading field, row units per base unit as a multiplier and a divisor).
# Kept as two exact factors so that the conversion is one correctly rounded operation
# each way, the live backend's own arithmetic (mW / 1000, % / 100, MHz * 1e6): a reading
# written by sample_row comes back bit for bit.
ROW_FIELDS: tuple[tuple[str, str, float, float], ...] = (
    ("util", "util", 100.0, 1.0),
    ("mem_util", "mem_util", 100.0, 1.0),
    ("mem_total", "memory_total", 1.0, 1.0),
    ("mem_used", "memory_used", 1.0, 1.0),
    ("mem_free", "memory_free", 1.0, 1.0),
    ("mem_reserved", "memory_reserved", 1.0, 1.0),
    ("power_mw", "power", 1000.0, 1.0),
    ("temp", "temperature", 1.0, 1.0),
    ("sm_clock", "sm_clock", 1.0, 1e6),
    ("mem_clock", "mem_clock", 1.0, 1e6),
    ("pstate", "pstate", 1.0, 1.0),
)
_INT_KEYS = frozenset({"pstate"})


def sample_row(t: float, gpu: int, r: FastReading) -> dict[str, Any]:
    """A fast reading as one gpu/samples.jsonl row (what ``read_samples`` reads back)."""
    row: dict[str, Any] = {"t": round(t, 3), "gpu": gpu}
    for key, attr, up, down in ROW_FIELDS:
        value = getattr(r, attr)
        if value is not None:
            v = value * up / down
            row[key] = int(v) if key in _INT_KEYS else v
    if r.clock_event_reasons is not None:
        row["clock_event_reasons"] = int(r.clock_event_reasons)
    return row


def _number(s: dict[str, Any], key: str) -> float | None:
    v = s.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{key}: a number expected")
    return float(v)


def _sample_fast(s: dict[str, Any]) -> FastReading:
    """One row in base units; ValueError names the key of a bad value."""
    values: dict[str, float | None] = {}
    for key, attr, up, down in ROW_FIELDS:
        v = _number(s, key)
        values[attr] = None if v is None else v * down / up
    raw = s.get("clock_event_reasons")
    mask = _number(s, "clock_event_reasons")
    if mask is not None and (mask < 0 or not mask.is_integer()):
        raise ValueError("clock_event_reasons: a bit mask expected")
    # an int as it is: a 64-bit mask does not survive a float
    reasons = raw if isinstance(raw, int) else None if mask is None else int(mask)
    return FastReading(**values, clock_event_reasons=reasons)


def _sample_procs(s: dict[str, Any]) -> tuple[ProcessReading, ...]:
    procs = s.get("procs") or []
    out = []
    for p in procs if isinstance(procs, list) else [None]:
        if (
            not isinstance(p, list)
            or len(p) != 2
            or any(isinstance(x, bool) or not isinstance(x, int | float) for x in p)
            or not math.isfinite(p[1])
        ):
            raise ValueError("procs: [[pid, bytes], ...] expected")
        out.append(ProcessReading(int(p[0]), float(p[1])))
    return tuple(out)


def _scale(v: Any, factor: float) -> float | None:
    return None if v is None else float(v) * factor


# --- bundle replay -------------------------------------------------------------------


def read_samples(path: Path) -> list[tuple[float, Batch]]:
    """A GPU timeline -> (t, batch) per fast reading, each batch carrying the latest
    static and slow readings of that GPU. A "lost" fault gives a batch with gpu.lost = 1.

    Two layouts are read: this module's recording format (first line the
    ``moptd-nvml-recording/1`` header), and the plain rows of a bundle's
    ``gpu/samples.jsonl`` (see ROW_FIELDS). Rows carry no static reading (a bundle's
    nvidia-smi dumps do), so their batches have none. Raises RecordingError naming the
    line of bad input."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordingError(path, 0, f"cannot read: {exc}") from None
    first = next((ln for ln in lines if ln.strip()), "")
    rec = parse_recording(lines, path) if '"format"' in first else _rows(lines, path)
    static: dict[int, StaticReading] = {}
    slow: dict[int, SlowReading] = {}
    profile: dict[int, ProfileReading] = {}
    # One sample cache per GPU, as the live collector keeps: a fast value that holds still
    # from row to row is the same Sample object, which costs less to build and to store.
    reuse: dict[int, dict[str, Sample]] = {}
    out: list[tuple[float, Batch]] = []
    for e in rec.entries:
        if e.fault == "lost":
            b = Batch()
            b.add("gpu.lost", gpu_subject(e.gpu), 1.0)
            out.append((e.t, b))
        elif isinstance(e.reading, StaticReading):
            static[e.gpu] = e.reading
        elif isinstance(e.reading, SlowReading):
            slow[e.gpu] = e.reading
        elif isinstance(e.reading, ProfileReading):
            profile[e.gpu] = e.reading
        elif isinstance(e.reading, FastReading):
            st = static.get(e.gpu)
            cache = reuse.setdefault(e.gpu, {})
            prof = profile.get(e.gpu)
            if st is not None:
                out.append(
                    (e.t, gpu_batch(st, e.reading, slow.get(e.gpu), reuse=cache, profile=prof))
                )
            else:
                b = _unidentified_batch(e.gpu, e.reading, slow.get(e.gpu), cache)
                if prof is not None:
                    add_profile(b, e.gpu, prof)
                out.append((e.t, b))
    out.sort(key=lambda tb: tb[0])
    return out


def _unidentified_batch(
    index: int, fast: FastReading, slow: SlowReading | None, reuse: dict[str, Sample]
) -> Batch:
    """gpu_batch without the static part: no identity to describe (empty attributes would
    overwrite what a bundle's dumps say of the GPU)."""
    batch = Batch()
    batch.add("gpu.lost", gpu_subject(index), 0.0)
    add_fast(batch, index, fast, reuse)
    if slow is not None:
        add_slow(batch, index, slow)
    return batch


def _rows(lines: Sequence[str], path: Path) -> Recording:
    """gpu/samples.jsonl rows -> a Recording of fast (and PCIe/process slow) entries."""
    rec = Recording(source=str(path))
    for lineno, s in _objects(lines, path, _NOT_A_ROW):
        t, gpu, fast, slow = _row(s, lineno, path)
        rec.entries.append(Entry(t, gpu, "slow", slow))
        rec.entries.append(Entry(t, gpu, "fast", fast))
    return rec


_NOT_A_ROW = "each line is a JSON object"


def _row(s: dict[str, Any], lineno: int, path: Path) -> tuple[float, int, FastReading, SlowReading]:
    """One row: (t, gpu, its fast reading, its PCIe/process slow reading)."""
    t = s.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        raise RecordingError(path, lineno, "t: Unix seconds expected")
    gpu = s.get("gpu", 0)
    if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
        raise RecordingError(path, lineno, "gpu: a GPU index expected")
    try:
        fast = _sample_fast(s)
        procs = _sample_procs(s)
        pcie = _number(s, "pcie_gen")
    except ValueError as exc:
        raise RecordingError(path, lineno, str(exc)) from None
    return float(t), gpu, fast, SlowReading(pcie_link_gen=pcie, processes=procs)


class SampleRows:
    """A bundle's gpu/samples.jsonl of plain rows in time order, read as it is replayed:
    each iteration reads the file again, row by row, into the batches ``read_samples``
    would give (a 24-hour file held whole took most of a replay's memory). The file stays
    open (a bundle unpacked from a tarball is deleted once read) until this is collected.
    A bad row raises RecordingError, naming its line, when the iteration reaches it."""

    def __init__(self, path: Path, fh: BinaryIO, first: float, last: float, rows: int) -> None:
        self.path = path
        self.first = first
        self.last = last
        self.rows = rows
        self._file = fh
        weakref.finalize(self, fh.close)

    def __iter__(self) -> Iterator[tuple[float, Batch]]:
        self._file.seek(0)
        reuse: dict[int, dict[str, Sample]] = {}  # as read_samples: one cache per GPU
        for lineno, s in _objects(_decoded(self._file, self.path), self.path, _NOT_A_ROW):
            t, gpu, fast, slow = _row(s, lineno, self.path)
            yield t, _unidentified_batch(gpu, fast, slow, reuse.setdefault(gpu, {}))


def _decoded(fh: BinaryIO, path: Path) -> Iterator[str]:
    for lineno, raw in enumerate(fh, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordingError(path, lineno, f"cannot read: {exc}") from None


# The time as sample_row writes it, first: {"t": 1795969286.868, ...
_T_FIRST = re.compile(
    r'[ \t]*\{[ \t]*"t"[ \t]*:[ \t]*(-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)[ \t]*[,}]'
)


def _leading_t(text: str) -> float | None:
    """A row's time without parsing the row, where the line opens with it and names "t"
    nowhere else (json would take the last of two); None: parse the line."""
    m = _T_FIRST.match(text)
    if m is None or text.count('"t"') != 1:
        return None
    return float(m.group(1))


def open_rows(path: Path) -> SampleRows | None:
    """The file as SampleRows when it holds plain rows whose times never go back; None
    for anything else (a recording, rows out of order, a line that is no row): those are
    for ``read_samples``, which reads the whole file, sorts it and names a bad line. This
    pass reads only each row's time."""
    fh = path.open("rb")
    first = last = math.nan
    rows = 0
    try:
        for raw in fh:
            text = raw.decode("utf-8")
            if not text.strip():
                continue
            if len(text.splitlines()) != 1:  # a separator str.splitlines takes, not \n
                break
            t = _leading_t(text)
            if t is None:  # not what moptd record writes: the whole line, as json reads it
                obj = json.loads(text)
                if not isinstance(obj, dict) or "format" in obj:
                    break
                t = obj.get("t")
                if isinstance(t, bool) or not isinstance(t, int | float):
                    break
            if not t > 0 or not math.isfinite(t) or (rows and t < last):
                break
            first = t if not rows else first
            last = float(t)
            rows += 1
        else:
            if rows:
                return SampleRows(path, fh, float(first), last, rows)
    except (UnicodeDecodeError, ValueError, RecursionError):
        pass  # read_samples names the line
    fh.close()
    return None


# --- recording the live backend ----------------------------------------------------


def record_live(
    out: TextIO,
    seconds: float,
    interval: float,
    slow_interval: float,
    profile_interval: float = 5.0,
) -> int:
    """Record the live NVML backend's readings (every tier, the profile tier's GPM
    metrics and the slow tier's per-process utilisation included); returns the number of
    entries written."""
    from moptd.gpu.backend import NvmlBackend

    backend = NvmlBackend()
    backend.init()
    rec = Recording(
        driver_version=backend.driver_version(),
        gpus=backend.device_count(),
        source=f"moptd nvml_recorded record, interval {interval:g}s",
    )
    _write_header(rec, FORMAT, out)  # the entries to come carry the profile tier
    written = 0
    end = time.monotonic() + seconds
    next_slow = 0.0
    next_profile = 0.0
    first = True
    try:
        while time.monotonic() < end:
            tick = time.monotonic()
            tiers = ["fast"]
            if first:
                tiers.insert(0, "static")
            if tick >= next_slow:
                tiers.append("slow")
                next_slow = tick + slow_interval
            if tick >= next_profile:
                tiers.append("profile")
                next_profile = tick + profile_interval
            for gpu in range(rec.gpus):
                for tier in tiers:
                    out.write(json.dumps(_entry_dict(_read_entry(backend, gpu, tier))) + "\n")
                    written += 1
            out.flush()
            first = False
            time.sleep(max(0.0, interval - (time.monotonic() - tick)))
    finally:
        backend.shutdown()
    return written


def _read_entry(backend: Any, gpu: int, tier: str) -> Entry:
    t = time.time()
    try:
        if tier == "slow":  # a recording's slow entry holds both slow tiers
            reading = merge_costly(backend.read_slow(gpu), backend.read_costly(gpu))
        else:
            reading = getattr(backend, f"read_{tier}")(gpu)
    except GpuLost as exc:
        return Entry(t, gpu, tier, None, "lost", 0.0, exc.code)
    except NvmlCallError as exc:
        return Entry(t, gpu, tier, None, "error", 0.0, exc.code)
    return Entry(t, gpu, tier, reading)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moptd.gpu.recorded")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the live NVML backend to a file")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--seconds", type=float, default=60.0)
    rec.add_argument("--interval", type=float, default=1.0)
    rec.add_argument("--slow-interval", type=float, default=5.0)
    rec.add_argument("--profile-interval", type=float, default=5.0)
    probe = sub.add_parser("build-probe", help="build a recording from a gpu_depth_probe capture")
    probe.add_argument("--probe", type=Path, required=True)
    probe.add_argument("--out", type=Path, required=True)
    build = sub.add_parser("build", help="build a recording from nvidia-smi dumps + samples")
    build.add_argument("--dump", type=Path, action="append", required=True)
    build.add_argument("--samples", type=Path)
    build.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        if args.command == "record":
            with args.out.open("w", encoding="utf-8") as fh:
                n = record_live(
                    fh, args.seconds, args.interval, args.slow_interval, args.profile_interval
                )
        else:
            if args.command == "build-probe":
                recording = from_probe(args.probe)
            else:
                recording = from_captures(args.dump, args.samples)
            with args.out.open("w", encoding="utf-8") as fh:
                dump_recording(recording, fh)
            n = len(recording.entries)
    except Exception as exc:  # noqa: BLE001 - a command line reports, never tracebacks
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {n} entries to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
