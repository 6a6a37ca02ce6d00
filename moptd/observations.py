"""What collectors hand to the signal store: samples, events and subject attributes.

A subject is a plain string: ``node``, ``gpu:<index>``, ``process:<pid>``,
``serving:<name>`` or ``collector:<name>`` (the forms `moptd replay --json` prints).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]
Value = float | str | None  # None: the source cannot give this value (NotSupported)

NODE = "node"


def gpu_subject(index: int | str) -> str:
    return f"gpu:{index}"


def subject_kind(subject: str) -> str:
    return subject.split(":", 1)[0]


def subject_id(subject: str) -> str:
    return subject.split(":", 1)[1] if ":" in subject else subject


def labels_of(mapping: Mapping[str, str] | None = None, **kw: str) -> Labels:
    """Labels in a canonical (sorted) order so equal label sets give equal series keys."""
    items = dict(mapping or {})
    items.update(kw)
    return tuple(sorted(items.items()))


@dataclass(frozen=True, slots=True)
class Sample:
    signal: str
    subject: str
    value: Value
    labels: Labels = ()


@dataclass(frozen=True, slots=True)
class Event:
    """A one-off occurrence (a kernel Xid line, an NVML Xid event, a process exit)."""

    stream: str
    subject: str
    t: float
    fields: Mapping[str, object] = field(default_factory=dict)
    text: str = ""


@dataclass(slots=True)
class Batch:
    """Everything one collection pass of one collector observed."""

    samples: list[Sample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    attrs: dict[str, dict[str, str]] = field(default_factory=dict)

    def add(self, signal: str, subject: str, value: Value, labels: Labels = ()) -> None:
        self.samples.append(Sample(signal, subject, value, labels))

    def describe(self, subject: str, **attrs: str) -> None:
        self.attrs.setdefault(subject, {}).update(attrs)

    def extend(self, other: Batch) -> None:
        self.samples.extend(other.samples)
        self.events.extend(other.events)
        for subject, attrs in other.attrs.items():
            self.attrs.setdefault(subject, {}).update(attrs)
