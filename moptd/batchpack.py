"""Batches of a long replay held packed until the walk reaches them (issue 32).

A day of nvidia-smi dumps every 10 s and /metrics pages every 15 s, each read into a Batch
before the walk starts, held about 10 MB an hour (302 MiB peak for 24 h). Each file is
still read once; its Batch is then kept as one ``marshal`` byte string and made a Batch
again when the replay's walk takes it (moptd.bundle.reader). A ``PackedBatch`` is a Batch
with its subject attributes kept (what the bundle's summary reads: GPU names) and no
samples or events until ``unpack``.
"""

from __future__ import annotations

import marshal

from moptd.observations import Batch, Event, Sample

# Files of one kind (dumps, or one endpoint's pages) from which a bundle's Batches are
# packed: an hour of dumps every 10 s is 360, a day 8,640. Below, the Batches are held as
# read (every fixture, every pasted incident): packing pays only where they are most of
# the memory, and costs a marshal round trip per file.
PACK_FROM = 1000
_SCALARS = (str, int, float, bool, type(None))


class PackedBatch(Batch):
    __slots__ = ("data",)

    def __init__(self, attrs: dict[str, dict[str, str]], data: bytes) -> None:
        super().__init__([], [], attrs)
        self.data = data


def pack(b: Batch) -> Batch:
    """``b`` packed; ``b`` itself when an event field is of a type marshal does not keep
    exactly (only str, numbers, None are packed)."""
    for e in b.events:
        if not all(isinstance(v, _SCALARS) for v in e.fields.values()):
            return b
    samples = [(s.signal, s.subject, s.value, s.labels) for s in b.samples]
    events = [(e.stream, e.subject, e.t, dict(e.fields), e.text) for e in b.events]
    return PackedBatch(b.attrs, marshal.dumps((samples, events)))


def unpack(b: Batch) -> Batch:
    """The Batch ``pack`` was given (equal to it); any other Batch as it is."""
    if not isinstance(b, PackedBatch):
        return b
    samples, events = marshal.loads(b.data)  # noqa: S302 - bytes this process made
    return Batch([Sample(*s) for s in samples], [Event(*e) for e in events], b.attrs)
