"""Read a ``moptd-bundle/v1`` into a timeline of observations for replay.

Every file is optional: a missing one is listed in ``missing`` and makes its evidence
unknown. A file that is present but malformed is a :class:`BundleError` naming the file and
line. The readers are the collectors' own parsers, so a bundle and a live host produce the
same samples.
"""

from __future__ import annotations

import json
import math
import re
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from moptd.observations import NODE, Batch, Event, labels_of
from moptd.proc import procfs

FORMAT = "moptd-bundle/v1"

class BundleError(Exception):
    def __init__(self, file: str, line: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}")
        self.file = file
        self.line = line
        self.message = message


@dataclass
class Timeline:
    path: Path
    meta: dict[str, object] = field(default_factory=dict)
    observations: list[tuple[float, str, Batch]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    missing_namespaces: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def steps(self) -> list[float]:
        times = {t for t, _, _ in self.observations} | {e.t for e in self.events}
        return sorted(times)


def open_bundle(path: Path) -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    """A directory as is; a .tar.gz unpacked into a temporary directory."""
    if path.is_dir():
        return path, None
    if path.is_file() and tarfile.is_tarfile(path):
        tmp = tempfile.TemporaryDirectory(prefix="moptd-bundle-")
        try:
            with tarfile.open(path) as tar:
                tar.extractall(tmp.name, filter="data")
        except (tarfile.TarError, OSError) as exc:
            # the CLI's bundle guard refuses hostile archives first; this is the backstop
            tmp.cleanup()
            raise BundleError(str(path), 0, f"cannot unpack: {exc}") from None
        root = Path(tmp.name)
        found = sorted(root.rglob("bundle.yaml"))
        return (found[0].parent if found else root), tmp
    raise BundleError(str(path), 0, "not a bundle directory or .tar.gz")


def read_bundle(path: Path) -> Timeline:
    root, tmp = open_bundle(path)
    try:
        return _read(root, path)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _read(root: Path, shown: Path) -> Timeline:
    tl = Timeline(shown)
    tl.meta = _read_meta(root / "bundle.yaml")
    start = _captured_at(tl.meta, root / "bundle.yaml")
    by_bus: dict[str, int] = {}
    uuid_by_bus: dict[str, str] = {}
    driver_version = _read_nvsmi(root, tl, by_bus, uuid_by_bus)
    _read_samples(root / "gpu" / "samples.jsonl", tl)
    _read_serving(root, tl)
    first = min((t for t, _, _ in tl.observations), default=start)
    host = _read_host(root, tl)
    if host.samples:
        tl.observations.append((first if first is not None else 0.0, "host", host))
    _read_kernel(root, tl, by_bus, uuid_by_bus, first)
    stack = _read_stack(root, tl, driver_version)
    if stack.samples:
        tl.observations.append((first if first is not None else 0.0, "driver", stack))
    if first is None:
        first = min((e.t for e in tl.events), default=0.0)
        tl.observations = [(first if math.isnan(t) else t, s, b) for t, s, b in tl.observations]
    tl.observations.sort(key=lambda o: o[0])
    tl.events.sort(key=lambda e: e.t)
    return tl


def _read_serving(root: Path, tl: Timeline) -> None:
    """serving/<name>/: metrics scrapes, the log, command line, model files, probes."""
    base = root / "serving"
    dirs = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if not dirs:
        tl.missing.append("serving/")
        tl.missing_namespaces.add("serving")
        return
    from moptd.serving.bundle import ServingBundleError, read_serving_dir

    for d in dirs:
        try:
            replay = read_serving_dir(d)
        except ServingBundleError as e:
            raise BundleError(e.file, e.line, e.message) from None
        tl.observations.extend((t, f"serving:{d.name}", b) for t, b in replay.observations)
        tl.events.extend(replay.events)
        tl.missing.extend(f"serving/{d.name}/{m}" for m in replay.missing)


def _read_meta(path: Path) -> dict[str, object]:
    if not path.exists():
        return {}
    text = _text(path)
    try:
        meta = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        raise BundleError(str(path), mark.line + 1 if mark else 1, f"YAML: {e.problem}") from None
    except yaml.YAMLError as e:
        raise BundleError(str(path), 1, f"YAML: {e}") from None
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise BundleError(str(path), 1, "bundle.yaml must be a mapping")
    fmt = meta.get("format")
    if fmt is not None and fmt != FORMAT:
        raise BundleError(str(path), _line_of(text, "format"), f"format {fmt!r} is not {FORMAT}")
    bt = meta.get("boot_time")
    if bt is not None and (isinstance(bt, bool) or not isinstance(bt, int | float)):
        raise BundleError(str(path), _line_of(text, "boot_time"), "boot_time must be Unix seconds")
    return meta


def _line_of(text: str, key: str) -> int:
    for n, line in enumerate(text.splitlines(), start=1):
        if line.startswith(f"{key}:"):
            return n
    return 1


def _captured_at(meta: dict[str, object], path: Path) -> float | None:
    v = meta.get("captured_at")
    if v is None:
        return None
    if isinstance(v, datetime):
        return v.timestamp()
    try:
        return datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise BundleError(
            str(path), _line_of(_text(path), "captured_at"), f"captured_at {v!r} is not RFC 3339"
        ) from None


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError as e:
        raise BundleError(str(path), 0, f"cannot read: {e.strerror or e}") from None


def _read_nvsmi(root: Path, tl: Timeline, by_bus: dict[str, int], uuids: dict[str, str]) -> str:
    """Reads the dumps; returns the user-space driver version they show ("" if none)."""
    from moptd.gpu.nvsmi import NvsmiError, dump_to_batch, read_dump

    folder = root / "gpu" / "nvidia-smi"
    files = (
        sorted(p for p in folder.glob("*") if p.suffix in (".xml", ".txt"))
        if folder.is_dir()
        else []
    )
    version = ""
    if not files:
        tl.missing.append("gpu/nvidia-smi")
        return version
    start = _captured_at(tl.meta, root / "bundle.yaml")
    for i, f in enumerate(files):
        try:
            dump = read_dump(f)
        except NvsmiError as e:
            raise BundleError(str(e.path), e.line, e.message) from None
        if not dump.gpus:
            raise BundleError(str(f), 1, "no GPU found in this nvidia-smi dump")
        t = dump.timestamp if dump.timestamp is not None else start
        if t is None:
            t = float("nan") if i == 0 else tl.observations[-1][0] + 1
        batch = dump_to_batch(dump)
        for subject, attrs in batch.attrs.items():
            pci = attrs.get("pci_bus_id")
            if pci and subject.startswith("gpu:"):
                from moptd.proc.pci import normalize_pci

                norm = normalize_pci(pci)
                if norm:
                    by_bus[norm] = int(subject[4:])
                    uuids[norm] = attrs.get("uuid", "")
        tl.observations.append((t, "nvml", batch))
        version = dump.driver_version or version
    return version


# gpu/samples.jsonl: one JSON object per line, one GPU per object (moptd's own format, the
# one `moptd record` writes and tests/fixtures/h200/nvml_samples.jsonl shows):
#   {"t": unix_s, "gpu": 0, "util": %, "mem_used": bytes, "power_mw": mW, "temp": C,
#    "sm_clock": MHz, "mem_clock": MHz, "clock_event_reasons": mask, "pstate": n,
#    "pcie_gen": n, "procs": [[pid, bytes], ...]}
# Every key but t is optional; "gpu" defaults to 0.
_SAMPLE_FIELDS: dict[str, tuple[str, float]] = {
    "util": ("gpu.util", 0.01),
    "mem_used": ("gpu.memory_used", 1.0),
    "power_mw": ("gpu.power", 0.001),
    "temp": ("gpu.temperature", 1.0),
    "sm_clock": ("gpu.sm_clock", 1e6),
    "mem_clock": ("gpu.mem_clock", 1e6),
    "clock_event_reasons": ("gpu.clock_event_reasons", 1.0),
    "pstate": ("gpu.pstate", 1.0),
    "pcie_gen": ("gpu.pcie_link_gen", 1.0),
}


def _read_samples(path: Path, tl: Timeline) -> None:
    if not path.exists():
        return  # optional even among optional files: not listed as missing evidence
    from moptd.catalog.gpu import CLOCK_EVENT_REASONS

    for n, line in enumerate(_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BundleError(str(path), n, f"not JSON: {e.msg}") from None
        if not isinstance(row, dict):
            raise BundleError(str(path), n, "each line is a JSON object")
        t = row.get("t")
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise BundleError(str(path), n, "t: Unix seconds expected")
        gpu = row.get("gpu", 0)
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise BundleError(str(path), n, "gpu: a GPU index expected")
        subject = f"gpu:{gpu}"
        b = Batch()
        for key, (signal, scale) in _SAMPLE_FIELDS.items():
            v = row.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise BundleError(str(path), n, f"{key}: a number expected")
            b.add(signal, subject, float(v) * scale)
        mask = row.get("clock_event_reasons")
        if isinstance(mask, int) and not isinstance(mask, bool):
            for bit, reason in CLOCK_EVENT_REASONS:
                active = 1.0 if mask & bit else 0.0
                b.add("gpu.clock_event_active", subject, active, labels_of(reason=reason))
        tl.observations.append((float(t), "samples", b))


def _read_kernel(
    root: Path,
    tl: Timeline,
    by_bus: dict[str, int],
    uuids: dict[str, str],
    first: float | None,
) -> None:
    path = root / "kernel" / "dmesg.txt"
    if not path.exists():
        tl.missing.append("kernel/dmesg.txt")
        tl.missing_namespaces.add("kernel")
        return
    from moptd.kernel.attribution import records_to_events
    from moptd.kernel.logparse import parse_kernel_log

    boot = tl.meta.get("boot_time")
    year = None
    start = _captured_at(tl.meta, root / "bundle.yaml")
    if start is not None:
        year = datetime.fromtimestamp(start).year  # noqa: DTZ006 - only the year is used
    records = parse_kernel_log(_text(path), boot if isinstance(boot, int | float) else None, year)
    default = first
    if default is None:
        default = min((r.t for r in records if r.t is not None), default=start or 0.0)
    # Bus ids as the kernel prints them (0000:3b:00) as well as normalised.
    index_by_bus: dict[str, int] = {}
    for norm, idx in by_bus.items():
        index_by_bus[norm] = idx
        index_by_bus[norm[:-2]] = idx
    events = records_to_events(records, index_by_bus, uuid_by_bus=uuids, default_time=default)
    tl.events.extend(events)


def _read_stack(root: Path, tl: Timeline, user_version: str) -> Batch:
    """Driver and container files, through the driver and container collectors' parsers."""
    from moptd.collectors import container, driver

    b = Batch()
    modules = _optional_text(root / "kernel" / "proc_modules", tl)
    if modules is not None:
        loaded = driver.parse_proc_modules(modules)
        if modules.strip() and not any(len(line.split()) >= 3 for line in modules.splitlines()):
            raise BundleError(
                str(root / "kernel" / "proc_modules"), 1, "not a copy of /proc/modules"
            )
        for module in driver.MODULES:
            b.add("driver.module_loaded", NODE, float(module in loaded), labels_of(module=module))
    running = ""
    version_text = _optional_text(root / "kernel" / "driver_version", tl)
    if version_text is not None:
        parsed = driver.parse_module_version(version_text)
        if parsed is None:
            raise BundleError(str(root / "kernel" / "driver_version"), 1, "no 'NVRM version' line")
        running = parsed[0]
        b.add(
            "driver.kernel_module_version",
            NODE,
            1.0,
            labels_of(version=parsed[0], flavor=parsed[1]),
        )
        if user_version:
            b.add("driver.nvml_version_match", NODE, float(user_version == running))
    uname = _optional_text(root / "kernel" / "uname_r", tl)
    dkms = _optional_text(root / "kernel" / "dkms_status.txt", tl)
    if uname is not None and dkms is not None:
        verdict = driver.dkms_kernel_match(driver.parse_dkms_status(dkms), uname.strip())
        if verdict is not None:
            b.add("driver.dkms_kernel_match", NODE, float(verdict))
    tainted = _optional_text(root / "kernel" / "tainted", tl)
    if tainted is not None and tainted.strip().isdigit():
        b.add("driver.tainted", NODE, float(int(tainted.strip())))
    nodes = _optional_text(root / "host" / "dev_nodes.txt", tl)
    if nodes is not None:
        present = {m.group(1) for m in _DEV_NODE.finditer(nodes)}
        for name in sorted({"nvidiactl", "nvidia-uvm"} | present):
            b.add("driver.dev_node_present", NODE, float(name in present), labels_of(node=name))
    daemon = _optional_text(root / "container" / "daemon.json", tl)
    if daemon is not None:
        path = root / "container" / "daemon.json"
        try:
            configured = container.parse_daemon_json(daemon, str(path))
        except container.ConfigError as e:
            raise _config_error(e) from None
        b.add("container.engine_present", NODE, 1.0, labels_of(engine="docker"))
        b.add(
            "container.nvidia_runtime_configured",
            NODE,
            float(configured),
            labels_of(engine="docker"),
        )
    cdi = root / "container" / "cdi"
    for spec_path in sorted(cdi.glob("*")) if cdi.is_dir() else []:
        if spec_path.suffix not in (".yaml", ".yml", ".json"):
            continue
        try:
            spec = container.parse_cdi_spec(_text(spec_path), str(spec_path))
        except container.ConfigError as e:
            raise _config_error(e) from None
        file = f"container/cdi/{spec_path.name}"
        b.add(
            "container.cdi_spec",
            NODE,
            1.0,
            labels_of(file=file, kind=spec.kind, driver_version=spec.driver_version),
        )
        if spec.driver_version and running:
            b.add(
                "container.cdi_spec_driver_match",
                NODE,
                float(spec.driver_version == running),
                labels_of(file=file),
            )
    return b


_DEV_NODE = re.compile(r"/dev/(nvidia(?:\d+|ctl|-uvm(?:-tools)?|-modeset))\s*$", re.MULTILINE)


def _optional_text(path: Path, tl: Timeline) -> str | None:
    if not path.exists():
        tl.missing.append(str(path.relative_to(path.parents[1])))
        return None
    return _text(path)


def _config_error(e: Exception) -> BundleError:
    # The container parsers say "FILE:LINE: message" (or "FILE: message").
    m = re.match(r"(.*?):(\d+): (.*)", str(e))
    if m:
        return BundleError(m.group(1), int(m.group(2)), m.group(3))
    file, _, msg = str(e).partition(": ")
    return BundleError(file, 0, msg)


def _read_host(root: Path, tl: Timeline) -> Batch:
    b = Batch()
    readers: list[tuple[str, Callable[[str, Batch, str], None]]] = [
        ("host/meminfo", _meminfo),
        ("host/df.txt", _df),
        ("host/swappiness", _swappiness),
    ]
    for rel, fn in readers:
        p = root / rel
        if not p.exists():
            tl.missing.append(rel)
            continue
        fn(_text(p), b, str(p))
    return b


def _meminfo(text: str, b: Batch, file: str) -> None:
    mem = procfs.parse_meminfo(text)
    if "MemTotal" not in mem:
        raise BundleError(file, 1, "no MemTotal line: not a copy of /proc/meminfo")
    total = mem["MemTotal"]
    b.add("node.memory_total", NODE, float(total))
    if "MemAvailable" in mem:
        b.add("node.memory_available", NODE, float(mem["MemAvailable"]))
        if total:
            b.add("node.memory_available_ratio", NODE, mem["MemAvailable"] / total)
    if "SwapTotal" in mem:
        b.add("node.swap_total", NODE, float(mem["SwapTotal"]))
        b.add("node.swap_used", NODE, float(mem["SwapTotal"] - mem.get("SwapFree", 0)))


def _df(text: str, b: Batch, file: str) -> None:
    rows = procfs.parse_df(text)
    if text.strip() and not rows:
        raise BundleError(file, 1, "no filesystem line: not the output of df -P")
    for row in rows:
        size, used, avail = (int(str(row[k])) for k in ("size", "used", "available"))
        lab = labels_of(path=str(row["mount"]))
        b.add("node.disk_total", NODE, float(size), lab)
        b.add("node.disk_available", NODE, float(avail), lab)
        if used + avail:
            b.add("node.disk_used_ratio", NODE, used / (used + avail), lab)


def _swappiness(text: str, b: Batch, file: str) -> None:
    try:
        v = procfs.parse_int(text)
    except ValueError:  # "²".isdigit() is true, int("²") is not
        v = None
    if v is None:
        raise BundleError(file, 1, f"not a number: {text.strip()[:40]!r}")
    b.add("node.swappiness", NODE, float(v))
