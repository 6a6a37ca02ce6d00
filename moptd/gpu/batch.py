"""Readings -> gpu.* samples: the one place that names signals for GPU readings, so the
live collector, the recorded backend and the nvidia-smi dump readers agree exactly."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Mapping

from moptd.catalog import CATALOG
from moptd.catalog.gpu import CLOCK_EVENT_REASONS
from moptd.gpu.readings import (
    PROCESS_UTIL_FIELDS,
    FastReading,
    ProcessReading,
    ProfileReading,
    SlowReading,
    StaticReading,
)
from moptd.observations import Batch, Labels, Sample, gpu_subject, labels_of

# The identity fields become attributes and gpu.info labels; the rest are derived below.
_IDENTITY = ("index", "uuid", "pci_bus_id", "name", "serial", "vbios", "driver_version")


def _plain_fields(cls: type) -> tuple[str, ...]:
    """A reading's plain (number or None) fields that are each one unlabelled gpu.<field>
    signal of the catalog. A GPU field is declared by its reading field and its SignalSpec,
    and nothing else lists it. Mappings (clock-event time, NVLink counters), retired pages
    by cause, the reason bitmask and processes are shaped differently: added below."""
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is None and f.name not in _IDENTITY and f"gpu.{f.name}" in CATALOG
    )


_STATIC_FIELDS = _plain_fields(StaticReading)
_FAST_FIELDS = tuple(f for f in _plain_fields(FastReading) if f != "clock_event_reasons")
_SLOW_FIELDS = _plain_fields(SlowReading)
_PROFILE_FIELDS = _plain_fields(ProfileReading)

# At most this many processes per GPU get the per-process utilisation series (the busiest
# by SM, then memory): a host running hundreds of tiny CUDA processes must not make
# hundreds of series a scrape. Only processes NVML lists as running now are exported.
PROCESS_UTIL_CAP = 32


def add_static(batch: Batch, r: StaticReading) -> None:
    subject = gpu_subject(r.index)
    batch.describe(
        subject,
        uuid=r.uuid,
        name=r.name,
        pci_bus_id=r.pci_bus_id,
        serial=r.serial,
        vbios=r.vbios,
        driver_version=r.driver_version,
    )
    batch.add(
        "gpu.info",
        subject,
        1.0,
        labels_of(
            name=r.name,
            pci_bus_id=r.pci_bus_id,
            serial=r.serial,
            vbios=r.vbios,
            driver_version=r.driver_version,
        ),
    )
    for f in _STATIC_FIELDS:
        v = getattr(r, f)
        if v is not None:
            batch.add(f"gpu.{f}", subject, float(v))


# Label tuples built once: the fast tier runs every tick on every GPU.
_REASON_LABELS = tuple(
    (bit, f"reason:{reason}", labels_of(reason=reason)) for bit, reason in CLOCK_EVENT_REASONS
)
_FAST_SIGNALS = tuple((f, f"gpu.{f}") for f in _FAST_FIELDS)
_TIER_LABELS = {
    t: labels_of(tier=t) for t in ("static", "fast", "slow", "costly", "energy", "profile")
}


def add_fast(
    batch: Batch, index: int, r: FastReading, reuse: dict[str, Sample] | None = None
) -> None:
    """The fast tier's samples. With ``reuse`` (kept per GPU by the caller), a sample whose
    value did not change since the last tick is the same object: most fast values hold
    still from tick to tick, and building a sample costs more than comparing one."""
    subject = gpu_subject(index)
    out = batch.samples
    cache: dict[str, Sample] = {} if reuse is None else reuse
    for f, signal in _FAST_SIGNALS:
        v = getattr(r, f)
        if v is not None:
            out.append(_sample(cache, signal, signal, subject, float(v), ()))
    if r.clock_event_reasons is not None:
        mask = r.clock_event_reasons
        out.append(_sample(cache, "reasons", "gpu.clock_event_reasons", subject, float(mask), ()))
        for bit, key, labels in _REASON_LABELS:
            value = 1.0 if mask & bit else 0.0
            out.append(_sample(cache, key, "gpu.clock_event_active", subject, value, labels))


_FAST_VALUES = operator.attrgetter(*_FAST_FIELDS)  # one C call for all plain fast values

_new = object.__new__
# the slots' own setters: what a frozen dataclass's object.__setattr__ ends up calling
_set_signal = vars(Sample)["signal"].__set__
_set_subject = vars(Sample)["subject"].__set__
_set_value = vars(Sample)["value"].__set__
_set_labels = vars(Sample)["labels"].__set__


def new_sample(signal: str, subject: str, value: float, labels: Labels = ()) -> Sample:
    """Sample(signal, subject, value, labels), made in less than half the time: a frozen
    dataclass's __init__ sets each field through object.__setattr__, and the NVML
    collector makes about ten new samples a GPU every tick (issue 32). Sample has no
    __post_init__, so the result is the same object in every way."""
    s = _new(Sample)
    _set_signal(s, signal)
    _set_subject(s, subject)
    _set_value(s, value)
    _set_labels(s, labels)
    return s


class FastSamples:
    """One GPU's fast-tier samples for the NVML collector's every tick, exactly as add_fast
    makes them, built only where a value changed. The live collector's fast tick is held to
    1.5x the bare NVML reads (issue 32), and on the GPU host a sample built after an idle
    gap costs more CPU than the NVML call that read its value: the plain values are taken
    in one call and compared as a tuple, and the ten clock-event samples are built once per
    distinct bitmask instead of bit by bit every tick."""

    __slots__ = ("_by_field", "_mask", "_reasons", "_samples", "_values", "subject")

    def __init__(self, index: int) -> None:
        self.subject = gpu_subject(index)
        self._values: tuple[float | None, ...] = ()
        self._by_field: list[Sample | None] = [None] * len(_FAST_SIGNALS)
        self._samples: list[Sample] = []
        self._mask: int | None = None
        self._reasons: list[Sample] = []

    def add(self, out: list[Sample], r: FastReading) -> None:
        values = _FAST_VALUES(r)
        if values != self._values:
            self._rebuild(values)
        out += self._samples
        mask = r.clock_event_reasons
        if mask is not None:
            if mask != self._mask:
                self._reasons = _reason_samples(self.subject, mask)
                self._mask = mask
            out += self._reasons

    def _rebuild(self, values: tuple[float | None, ...]) -> None:
        by = self._by_field
        for i, v in enumerate(values):
            if v is None:
                by[i] = None
                continue
            value = float(v)
            s = by[i]
            if s is None or s.value != value:
                by[i] = new_sample(_FAST_SIGNALS[i][1], self.subject, value)
        self._samples = [s for s in by if s is not None]
        self._values = values


def _reason_samples(subject: str, mask: int) -> list[Sample]:
    out = [new_sample("gpu.clock_event_reasons", subject, float(mask))]
    for bit, _, labels in _REASON_LABELS:
        out.append(
            new_sample("gpu.clock_event_active", subject, 1.0 if mask & bit else 0.0, labels)
        )
    return out


def _sample(
    cache: dict[str, Sample], key: str, signal: str, subject: str, value: float, labels: Labels
) -> Sample:
    s = cache.get(key)
    if s is None or s.value != value:
        s = cache[key] = Sample(signal, subject, value, labels)
    return s


def add_slow(batch: Batch, index: int, r: SlowReading) -> None:
    subject = gpu_subject(index)
    for f in _SLOW_FIELDS:
        v = getattr(r, f)
        if v is not None:
            batch.add(f"gpu.{f}", subject, float(v))
    for cause, v in (("single_bit", r.retired_pages_sbe), ("double_bit", r.retired_pages_dbe)):
        if v is not None:
            batch.add("gpu.retired_pages", subject, float(v), labels_of(cause=cause))
    _add_labelled(batch, "gpu.clock_event_time", subject, "reason", r.clock_event_time)
    _add_labelled(batch, "gpu.nvlink_errors", subject, "counter", r.nvlink_errors)
    _add_labelled(batch, "gpu.nvlink_link_up", subject, "link", r.nvlink_link_up)
    _add_pairs(batch, "gpu.nvlink_link_errors", subject, ("link", "counter"), r.nvlink_link_errors)
    _add_pairs(batch, "gpu.nvlink_link_bytes", subject, ("link", "direction"), r.nvlink_link_bytes)
    for m in r.mig_devices:
        labels = labels_of(
            gpu_instance=str(m.gpu_instance), compute_instance=str(m.compute_instance)
        )
        if m.memory_used is not None:
            batch.add("gpu.mig_memory_used", subject, m.memory_used, labels)
        if m.memory_total is not None:
            batch.add("gpu.mig_memory_total", subject, m.memory_total, labels)
    add_processes(batch, index, r.processes)


def add_profile(batch: Batch, index: int, r: ProfileReading) -> None:
    subject = gpu_subject(index)
    for f in _PROFILE_FIELDS:
        v = getattr(r, f)
        if v is not None:
            batch.add(f"gpu.{f}", subject, float(v))
    _add_pairs(batch, "gpu.mig_activity", subject, ("gpu_instance", "metric"), r.mig_activity)


def add_processes(batch: Batch, index: int, processes: tuple[ProcessReading, ...]) -> None:
    """One process.gpu_memory per (process, GPU); a process on two GPUs gets two series.
    The utilisation series for the PROCESS_UTIL_CAP busiest processes of the GPU."""
    gpu = labels_of(gpu=str(index))
    for p in processes:
        subject = f"process:{p.pid}"
        if p.used_memory is not None:
            batch.add("process.gpu_memory", subject, p.used_memory, gpu)
        if p.name:
            batch.describe(subject, name=p.name)
    measured = [p for p in processes if p.sm_util is not None or p.mem_util is not None]
    if len(measured) > PROCESS_UTIL_CAP:
        measured.sort(key=lambda p: (-(p.sm_util or 0.0), -(p.mem_util or 0.0), p.pid))
        del measured[PROCESS_UTIL_CAP:]
    for p in measured:
        subject = f"process:{p.pid}"
        for f in PROCESS_UTIL_FIELDS:
            v = getattr(p, f)
            if v is not None:
                batch.add(f"process.gpu_{f}", subject, float(v), gpu)


def _add_labelled(
    batch: Batch, signal: str, subject: str, label: str, values: Mapping[str, float]
) -> None:
    for key in sorted(values):
        batch.add(signal, subject, float(values[key]), labels_of({label: key}))


def _add_pairs(
    batch: Batch,
    signal: str,
    subject: str,
    labels: tuple[str, str],
    values: Mapping[str, float],
) -> None:
    """Keys "<first label's value>:<second label's value>", e.g. "3:replay" for
    (link, counter); numeric first parts in numeric order."""
    for key in sorted(values, key=_pair_order):
        first, _, second = key.partition(":")
        batch.add(
            signal, subject, float(values[key]), labels_of({labels[0]: first, labels[1]: second})
        )


def _pair_order(key: str) -> tuple[int, str]:
    link, _, what = key.partition(":")
    return (int(link) if link.isdigit() else -1, what)


def add_ages(batch: Batch, index: int, ages: Mapping[str, float]) -> None:
    subject = gpu_subject(index)
    for tier in sorted(ages):
        labels = _TIER_LABELS.get(tier) or labels_of(tier=tier)
        batch.samples.append(Sample("gpu.sample_age", subject, max(0.0, ages[tier]), labels))


def age_keys(tiers: Iterable[str]) -> tuple[tuple[str, Labels], ...]:
    """The tiers in add_ages's order, with their labels: computed when a GPU's set of read
    tiers changes, not every tick (add_ages_at)."""
    return tuple((t, _TIER_LABELS.get(t) or labels_of(tier=t)) for t in sorted(tiers))


def add_ages_at(
    out: list[Sample],
    subject: str,
    keys: tuple[tuple[str, Labels], ...],
    read_at: Mapping[str, float],
    now: float,
) -> None:
    """add_ages for the tiers of ``keys`` (age_keys), each read at ``read_at[tier]``."""
    for tier, labels in keys:  # new_sample, inlined: six a GPU every tick
        age = now - read_at[tier]
        s = _new(Sample)
        _set_signal(s, "gpu.sample_age")
        _set_subject(s, subject)
        _set_value(s, age if age > 0.0 else 0.0)
        _set_labels(s, labels)
        out.append(s)


def gpu_batch(
    static: StaticReading,
    fast: FastReading | None,
    slow: SlowReading | None,
    ages: Mapping[str, float] | None = None,
    reuse: dict[str, Sample] | None = None,
    profile: ProfileReading | None = None,
) -> Batch:
    """All samples of one GPU, as the NVML collector makes them (gpu.lost = 0); ``reuse``
    as for add_fast."""
    batch = Batch()
    add_static(batch, static)
    batch.add("gpu.lost", gpu_subject(static.index), 0.0)
    if fast is not None:
        add_fast(batch, static.index, fast, reuse)
    if slow is not None:
        add_slow(batch, static.index, slow)
    if profile is not None:
        add_profile(batch, static.index, profile)
    if ages:
        add_ages(batch, static.index, ages)
    return batch
