"""Read a ``moptd-bundle/v1`` (docs/bundle.md) into a Timeline for replay.

Every file is optional: a missing one is listed in ``missing`` and makes its evidence
unknown. A file that is present but malformed is a BundleError naming the file and line.
Nothing here names a signal: the evidence becomes samples through the code that makes them
live, once:

- gpu/nvidia-smi/*: ``moptd.gpu.nvsmi.dump_to_batch`` (the live ``gpu_batch``), for
  ``-q``/``-q -x`` dumps, the default table and nvidia-smi's failure messages alike;
- gpu/samples.jsonl: ``moptd.gpu.recorded.read_samples``, the one reader of the rows
  ``moptd record`` writes;
- host/, kernel/ (but dmesg), container/: the host, driver and container collectors
  themselves, over the bundle's files (moptd.bundle.sources);
- kernel/dmesg.txt (and kernel/dmesg*.txt beside it): ``parse_kernel_log`` and
  ``records_to_events``, as the kernel-log collector;
- serving/<name>/: ``moptd.serving.bundle.read_serving_dir``, the serving collector's
  parsers.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from moptd.batchpack import PACK_FROM, PackedBatch, pack, unpack
from moptd.bundle.archive import open_bundle
from moptd.bundle.errors import BundleError
from moptd.bundle.meta import captured_at, read_meta, read_text
from moptd.bundle.sources import collect_stack, daemon_log_events
from moptd.collector import GpuIdentities
from moptd.diagnose.timeline import Observation, Timeline
from moptd.gpu.nvsmi import NvsmiError, dump_to_batch, read_dump
from moptd.gpu.recorded import RecordingError, SampleRows, open_rows, read_samples
from moptd.kernel.attribution import records_to_events
from moptd.kernel.logparse import KernelRecord, parse_kernel_log
from moptd.located import LocatedError
from moptd.observations import Batch
from moptd.proc.pci import normalize_pci
from moptd.serving.bundle import ServingBundleError, read_serving_dir


def read_bundle(path: Path) -> Timeline:
    """The files at the bundle's own names only; ``moptd.bundle.read_bundle`` (intake)
    also classifies the files at other names, and is the one the commands use."""
    root, tmp = open_bundle(path)
    try:
        tl = _read(root, path)
        stream_packed(tl)
        return tl
    finally:
        if tmp is not None:
            tmp.cleanup()


def read_tree(root: Path, shown: Path) -> Timeline:
    """The bundle directory at ``root`` (already opened), named ``shown`` in the report.
    Call ``stream_packed`` once what reads the observations' attributes is done."""
    return _read(root, shown)


def stream_packed(tl: Timeline) -> None:
    """A long bundle's packed Batches (moptd.batchpack) unpacked only as the walk takes
    them: the observations become the timeline's lazy stream, in exactly the order
    Timeline.iter_observations gave (at one time: the sources the stream follows, the
    stream, the rest)."""
    if not any(isinstance(b, PackedBatch) for _, _, b in tl.observations):
        return
    follows, lazy = tl.lazy_follows, tl.lazy
    before = [o for o in tl.observations if o[1] in follows]
    after = [o for o in tl.observations if o[1] not in follows]
    times = [t for t, _, _ in (tl.observations[:1] + tl.observations[-1:])]
    times += [t for t in (tl.lazy_first, tl.lazy_last) if t is not None]

    def merged() -> Iterator[Observation]:
        if lazy is None:
            return _unpacked(before + after)
        return heapq.merge(_unpacked(before), lazy(), _unpacked(after), key=lambda o: o[0])

    tl.observations = []
    tl.lazy, tl.lazy_follows = merged, frozenset()
    tl.lazy_first, tl.lazy_last = min(times), max(times)


def _unpacked(obs: Iterable[Observation]) -> Iterator[Observation]:
    for t, source, b in obs:
        yield t, source, unpack(b)


def _read(root: Path, shown: Path) -> Timeline:
    tl = Timeline(shown)
    tl.meta = read_meta(root / "bundle.yaml")
    start = captured_at(tl.meta, root / "bundle.yaml")
    identities = _read_nvsmi(root, tl, start)
    _read_samples(root / "gpu" / "samples.jsonl", tl)
    _read_serving(root, tl, start)
    # an untimed dump is NaN until placed (min() would return a leading NaN)
    first = min((t for t, _, _ in tl.observations if not math.isnan(t)), default=start)
    if tl.lazy_first is not None:
        first = tl.lazy_first if first is None else min(first, tl.lazy_first)
    stack = collect_stack(root, tl.missing, identities)
    _read_kernel(root, tl, identities, first, start)
    _read_daemon_logs(root, tl, identities, start if start is not None else first)
    at = first if first is not None else 0.0
    tl.observations.extend((at, name, batch) for name, batch in stack)
    _read_versions(root / "versions.json", tl, at)
    if first is None:
        first = min((e.t for e in tl.events), default=0.0)
    tl.observations = [(first if math.isnan(t) else t, s, b) for t, s, b in tl.observations]
    _place_untimed(tl, start)
    tl.observations.sort(key=lambda o: o[0])
    tl.events.sort(key=lambda e: e.t)
    return tl


def _read_daemon_logs(
    root: Path, tl: Timeline, identities: GpuIdentities, at: float | None
) -> None:
    """host/journal/*.txt, host/fabricmanager.log, container/cli_errors.txt: the
    daemon_logs collector over them; its events keep their own times."""
    events, _ = daemon_log_events(root, identities, at)
    tl.events.extend(events)


def _read_versions(path: Path, tl: Timeline, at: float) -> None:
    """versions.json: the versions collector over it (its source in replay, where live it
    reads NVML and the serving environments), its samples at the first step; the record
    in ``meta["versions"]`` (replay's "versions:" line and --diff)."""
    if not path.is_file():
        tl.missing_namespaces.add("versions")
        return
    # imported here: the serving specs it reads cost a replay without versions.json
    # about a hundredth of its time (issue 32)
    from moptd.collectors.versions import VersionsCollector, replay_context

    collector = VersionsCollector(replay_context(path))
    try:
        batch = collector.read()
    except LocatedError as e:
        raise BundleError(e.file, e.line, e.message) from None
    tl.meta["versions"] = collector.last_record
    tl.observations.append((at, "versions", batch))


def _untimed(t: float) -> bool:
    """A time no evidence gave: a log line with no time of its own is stamped 0 (or NaN)."""
    return not t > 0 or math.isinf(t)


def _place_untimed(tl: Timeline, start: float | None) -> None:
    """With no wall-clock time anywhere (not even captured_at) the timeline is untimed:
    its times are relative (seconds since the kernel's boot) or none at all (0: only the
    order counts, which the stable sorts after this keep), never dates. Where other
    evidence is timed, a line without a time of its own stays at 0, before all of it;
    replay marks the findings it decides."""
    if tl.relative_to:
        tl.untimed = True
    elif (
        start is None
        and tl.lazy_first is None
        and not any(not _untimed(t) for t, _, _ in tl.observations)
        and not any(not _untimed(e.t) for e in tl.events)
    ):
        tl.untimed = True
        tl.observations = [(0.0, s, b) for _, s, b in tl.observations]
        tl.events = [e if e.t == 0.0 else replace(e, t=0.0) for e in tl.events]


def _since_boot(records: list[KernelRecord]) -> bool:
    """With no wall-clock time anywhere, kernel lines keep their seconds since boot as the
    (relative) time, so their order and spacing stay; True when that applied."""
    if any(r.t is not None for r in records) or not any(r.uptime is not None for r in records):
        return False
    for r in records:
        r.t = r.uptime
    return True


def _read_nvsmi(root: Path, tl: Timeline, start: float | None) -> GpuIdentities:
    """Reads the dumps; returns the GPUs they name and the user-space driver version."""
    folder = root / "gpu" / "nvidia-smi"
    files = (
        sorted(p for p in folder.glob("*") if p.suffix in (".xml", ".txt"))
        if folder.is_dir()
        else []
    )
    index_by_bus: dict[str, int] = {}
    uuid_by_bus: dict[str, str] = {}
    version = ""
    if not files:
        tl.missing.append("gpu/nvidia-smi")
    packing = len(files) >= PACK_FROM  # a long bundle: held packed until replayed
    for i, f in enumerate(files):
        try:
            dump = read_dump(f)
        except NvsmiError as e:
            raise BundleError(str(e.path), e.line, e.message) from None
        if not dump.gpus and not dump.failures:
            raise BundleError(str(f), 1, "no GPU found in this nvidia-smi output")
        t = dump.timestamp if dump.timestamp is not None else start
        if t is None:
            t = float("nan") if i == 0 else tl.observations[-1][0] + 1
        for g in dump.gpus:
            bus = normalize_pci(g.static.pci_bus_id or "")
            if bus:
                index_by_bus[bus] = g.static.index
                uuid_by_bus[bus] = g.static.uuid
        batch = dump_to_batch(dump, index_by_bus)
        tl.observations.append((t, "nvml", pack(batch) if packing else batch))
        version = dump.driver_version or version
    return GpuIdentities(index_by_bus, uuid_by_bus, version, "nvidia-smi")


def _read_samples(path: Path, tl: Timeline) -> None:
    """Plain rows in time order (what ``moptd record`` writes) are read as the replay goes
    (Timeline.lazy): a day of them held whole took most of a replay's memory. Anything
    else is read whole, sorted, and checked line by line here."""
    if not path.exists():
        return  # optional even among optional files: not listed as missing evidence
    try:
        rows = open_rows(path)
    except OSError as exc:
        raise BundleError(str(path), 0, f"cannot read: {exc}") from None
    if rows is not None:
        tl.lazy = lambda: _streamed(rows)
        tl.lazy_first, tl.lazy_last = rows.first, rows.last
        tl.lazy_follows = frozenset({"nvml"})  # read before the samples, as below
        return
    try:
        timeline = read_samples(path)
    except RecordingError as e:
        raise BundleError(str(e.path), e.line, e.message) from None
    tl.observations.extend((t, "samples", b) for t, b in timeline)


def _streamed(rows: SampleRows) -> Iterator[tuple[float, str, Batch]]:
    try:
        for t, b in rows:
            yield t, "samples", b
    except RecordingError as e:
        raise BundleError(str(e.path), e.line, e.message) from None


def _read_serving(root: Path, tl: Timeline, start: float | None) -> None:
    """serving/<name>/: metrics scrapes, the log, command line, model files, probes."""
    base = root / "serving"
    dirs = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if not dirs:
        tl.missing.append("serving/")
        tl.missing_namespaces.add("serving")
        return
    for d in dirs:
        try:
            replay = read_serving_dir(d, captured_at=start)
        except ServingBundleError as e:
            raise BundleError(e.file, e.line, e.message) from None
        tl.observations.extend((t, f"serving:{d.name}", b) for t, b in replay.observations)
        tl.events.extend(replay.events)
        tl.missing.extend(f"serving/{d.name}/{m}" for m in replay.missing)
        if replay.assumed_year is not None:
            tl.notes.append(_year_note(f"serving:{d.name}'s log lines", replay.assumed_year))


# kernel-log formats whose stamps carry no year (syslog / journalctl short, dmesg -H)
_YEARLESS = frozenset({"syslog", "dmesg-H"})


def _year_note(what: str, year: int) -> str:
    """Said above the findings: a date moptd completed with this year is a guess (a ticket
    pasted from last year would otherwise read as this year's, with nothing to say so)."""
    return f"No year in {what}: their dates are read as {year}, this year."


def _read_kernel(
    root: Path,
    tl: Timeline,
    identities: GpuIdentities,
    first: float | None,
    start: float | None,
) -> None:
    # kernel/dmesg.txt, and kernel/dmesg*.txt beside it (several pasted kernel logs)
    folder = root / "kernel"
    paths = sorted(folder.glob("dmesg*.txt")) if folder.is_dir() else []
    if not paths:
        tl.missing.append("kernel/dmesg.txt")
        tl.missing_namespaces.add("kernel")
        return
    boot = tl.meta.get("boot_time")
    year = None
    if start is not None:
        year = datetime.fromtimestamp(start).year  # noqa: DTZ006 - only the year is used
    boot_time = boot if isinstance(boot, int | float) else None
    records = []
    for path in paths:
        got = parse_kernel_log(read_text(path), boot_time, year)
        times = [r.t for r in got if r.t is not None]
        rel = path.relative_to(root).as_posix()
        held = {"records": len(got), "first": min(times, default=None)}
        held["last"] = max(times, default=None)
        tl.read.append({"input": rel, "kind": "kernel-log", "used": True, "as": rel, "held": held})
        if year is None and any(r.t is not None and r.fmt in _YEARLESS for r in got):
            # parse_kernel_log's default year; said once for several kernel logs
            note = _year_note("the kernel log's lines", datetime.now(UTC).year)
            if note not in tl.notes:
                tl.notes.append(note)
        records.extend(got)
    dated = any(not _untimed(e.t) for e in tl.events)
    if boot_time is None and first is None and start is None and not dated:
        if _since_boot(records):
            tl.relative_to = "kernel boot"
    default = first
    if default is None:
        default = min((r.t for r in records if r.t is not None), default=start or 0.0)
    # Bus ids as the kernel prints them (0000:3b:00) as well as normalised.
    index_by_bus: dict[str, int] = {}
    for norm, idx in identities.index_by_bus.items():
        index_by_bus[norm] = idx
        index_by_bus[norm[:-2]] = idx
    events = records_to_events(
        records, index_by_bus, uuid_by_bus=dict(identities.uuid_by_bus), default_time=default
    )
    tl.events.extend(events)
