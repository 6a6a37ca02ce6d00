"""The signal store: bounded series per (signal, subject, labels), event streams, and the
latest snapshot each source produced.

It is written by one party at a time (the event loop), read by the exporter, the rule
engine and the API. It does no I/O and takes its time from an injectable clock.

The daemon's rule evaluation reads it from a worker thread while the loop goes on serving
(moptd.findings.service). For that while the store is *held* (`hold()`): every write
(`ingest`, `record`, `add_events`, `drop_source`, `evict`) is queued, with the time it was
made, and applied in order when the hold ends; the thread sees the store exactly as it was
when the evaluation began. Event listeners are told at once, in order, as without a hold:
they read nothing of the store, and the findings database's listener must have queued an
event's row before the kernel-log collector queues the position after it (a position
committed ahead of its events would skip them after a SIGKILL). No read writes anything a reader on
another thread could see half done: the caches they fill (subjects, a signal's subjects)
are whole values set in one assignment, and asking for a stream that does not exist makes
no stream (`events`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import islice

from moptd.clock import Clock, SystemClock
from moptd.observations import Batch, Event, Labels, Sample, Value, subject_kind
from moptd.store.series import Series

SeriesKey = tuple[str, str, Labels]  # (signal, subject, labels)

_NO_SERIES: Mapping[Labels, Series] = {}
CHANGE_LOG = 4096  # changes SignalStore.changed_since can name (a rule pass sees tens)
EVICTED = "#evicted"  # in the change log: an eviction pass (no signal or stream is so named)

__all__ = ["CHANGE_LOG", "EVICTED", "EventLog", "Series", "SeriesKey", "SignalStore", "Snapshot"]


class EventLog:
    """One bounded, time-ordered stream of events (kernel.xid, gpu.xid_event, ...).

    It counts the events ever appended (so a reader can ask for those after the ones it
    has seen) and how many retained events each subject has (so finding the subjects of a
    stream does not walk a flooded log every tick)."""

    __slots__ = ("_events", "_subjects", "appended", "dropped", "subject_changes")

    def __init__(self, max_events: int) -> None:
        self._events: deque[Event] = deque(maxlen=max_events)
        self._subjects: dict[str, int] = {}
        self.appended = 0  # sequence number of the newest event (the first is 1)
        self.dropped = 0
        self.subject_changes = 0  # a subject came or went (SignalStore.layout_key)

    def append(self, event: Event) -> None:
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
            self._forget(self._events[0])
        self._events.append(event)
        self.appended += 1
        held = self._subjects.get(event.subject, 0)
        if not held:
            self.subject_changes += 1
        self._subjects[event.subject] = held + 1

    def evict_before(self, t: float) -> None:
        while self._events and self._events[0].t < t:
            self._forget(self._events.popleft())

    def _forget(self, event: Event) -> None:
        left = self._subjects[event.subject] - 1
        if left:
            self._subjects[event.subject] = left
        else:
            del self._subjects[event.subject]
            self.subject_changes += 1

    def subjects(self) -> list[str]:
        """Subjects with at least one retained event."""
        return list(self._subjects)

    def after(self, seq: int) -> tuple[list[Event], int]:
        """The retained events appended after sequence number `seq`, oldest first, and the
        sequence number of the first of them."""
        new = min(self.appended - seq, len(self._events))
        if new <= 0:
            return [], self.appended + 1
        events = list(islice(reversed(self._events), new))
        events.reverse()
        return events, self.appended - new + 1

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def since(self, t: float, subject: str | None = None) -> list[Event]:
        out = []
        for ev in reversed(self._events):
            if ev.t < t:
                break
            if subject is None or ev.subject == subject:
                out.append(ev)
        out.reverse()
        return out


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the sources reported in their latest successful pass: the exporter's view."""

    samples: tuple[Sample, ...]
    attrs: dict[str, dict[str, str]]
    taken_at: float


class SignalStore:
    def __init__(
        self,
        clock: Clock | None = None,
        retention: float = 3600.0,
        max_points: int = 4096,
        max_events: int = 10000,
        max_series: int = 20000,
    ) -> None:
        self.clock = clock or SystemClock()
        self.retention = retention
        self.max_points = max_points
        self.max_events = max_events
        # Series (numeric and text) one source may hold: an engine page with a label value
        # that changes every scrape would otherwise add series until memory runs out.
        self.max_series = max_series
        self._owner: dict[SeriesKey, str] = {}  # the source that brought each series
        self._held: dict[str, int] = {}  # source -> series it holds
        self.series_dropped: dict[str, int] = {}  # source -> new series refused since start
        self._series: dict[SeriesKey, Series] = {}
        # (signal, subject) -> {labels: series}: rules look series up by these hundreds
        # of times a tick
        self._index: dict[tuple[str, str], dict[Labels, Series]] = {}
        self._signal_subjects: dict[str, list[str]] = {}  # cleared when _index changes
        self._text: dict[SeriesKey, tuple[float, str | None]] = {}
        self._events: dict[str, EventLog] = {}
        self._current: dict[str, Batch] = {}  # source -> its latest batch
        self._attrs: dict[str, dict[str, str]] = {}
        # Every subject with a series, a text value or attributes; None when a key came or
        # went (rules ask for it on every tick, and subjects rarely change).
        self._known: list[str] | None = None
        # Bumped with every reset of _known, a new stream and a changed attribute: with the
        # streams' subject changes, what the rule engine's subjects follow from (layout_key)
        self.layout = 0
        self._last_evict = -math.inf
        # Passes of evict() so far: a window read as of an earlier time than the clock's
        # (replay's Env.evidence_at) can change when one drops points (moptd.diagnose.expr.Stamp)
        self.evictions = 0
        # What changed lately, for a reader that asks what changed since it last looked
        # (changed_since): the signals bumped, the streams appended to and EVICTED, in
        # order, the last CHANGE_LOG of them; `changes` counts every one ever logged.
        self.changes = 0
        self._change_log: deque[str] = deque(maxlen=CHANGE_LOG)
        self.version = 0  # bumped whenever the snapshot changes; lets readers cache
        # signal -> bumped whenever what a point read of it returns may change: a new
        # value, a new or departed series, a text value (moptd.diagnose.expr.Stamp)
        # Read it directly on a hot path (never write it): generation() is the same.
        self.generations: dict[str, int] = {}
        # Called with each group of events as it is added (the findings database keeps
        # every kernel/NVML event); a callback must be quick and must not raise.
        self.event_listeners: list[Callable[[list[Event]], None]] = []
        # While held (a rule evaluation reads the store from another thread): the writes
        # made meanwhile, in order, each a call with its time fixed when it was made.
        self._queued: list[Callable[[], object]] | None = None
        self._no_events = EventLog(max_events)  # what events() gives for an unknown stream

    # --- holding writes while another thread reads ---

    @property
    def held(self) -> bool:
        return self._queued is not None

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Queue every write until the block ends, then apply them in order (event
        listeners are still told at once). Not reentrant: one evaluation holds it."""
        if self._queued is not None:
            raise RuntimeError("the store is already held")
        self._queued = []
        try:
            yield
        finally:
            queued, self._queued = self._queued, None
            failed: Exception | None = None
            for write in queued:
                try:
                    write()
                except Exception as exc:  # noqa: BLE001 - the writes after it still apply
                    failed = failed or exc
            if failed is not None:
                raise failed

    def queued(self) -> int:
        """Writes waiting for the hold to end (0 when not held)."""
        return 0 if self._queued is None else len(self._queued)

    # --- writing ---

    def ingest(self, source: str, batch: Batch, t: float | None = None) -> None:
        """Record a source's pass. Its snapshot is replaced whole, so subjects that left
        (a GPU that fell off, a process that exited) leave the exporter's view too."""
        now = self.clock.now() if t is None else t
        if self._queued is not None:
            self._notify(batch.events)
            self._queued.append(lambda: self._ingest(source, batch, now, notify=False))
            return
        self._ingest(source, batch, now)

    def _ingest(self, source: str, batch: Batch, now: float, notify: bool = True) -> None:
        kept = [s for s in batch.samples if self._record(s, now, source)]
        if len(kept) != len(batch.samples):
            # the exporter shows what the store holds: a refused series is not exported
            # either, so /metrics stays as bounded as the store
            batch = replace(batch, samples=kept)
        self._add_events(list(batch.events), notify)
        for subject, attrs in batch.attrs.items():
            known = self._attrs.get(subject)
            if known is None:
                known = self._attrs[subject] = {}
                self._relayout()
            elif any(known.get(k) != v for k, v in attrs.items()):
                self.layout += 1
            known.update(attrs)
        self._current[source] = batch
        self.version += 1
        if now - self._last_evict > 60:
            self.evict(now)

    def record(self, sample: Sample, t: float | None = None, source: str = "") -> bool:
        """Record one sample; False when it would be a new series past the source's
        ``max_series`` (it is dropped and counted in ``series_dropped``). While the store
        is held it is queued and True: whether it is admitted is decided when it applies."""
        now = self.clock.now() if t is None else t
        if self._queued is not None:
            self._queued.append(lambda: self._record(sample, now, source))
            return True
        return self._record(sample, now, source)

    def _admit(self, key: SeriesKey, source: str) -> bool:
        held = self._held.get(source, 0)
        if held >= self.max_series:
            self.series_dropped[source] = self.series_dropped.get(source, 0) + 1
            return False
        self._held[source] = held + 1
        self._owner[key] = source
        return True

    def _release(self, key: SeriesKey) -> None:
        source = self._owner.pop(key, None)
        if source is not None:
            self._held[source] -= 1

    def _record(self, s: Sample, t: float, source: str = "") -> bool:
        key = (s.signal, s.subject, s.labels)
        v: Value = s.value
        if isinstance(v, str) or v is None:
            old = self._text.get(key)
            if old is None:
                if not self._admit(key, source):
                    return False
                self._relayout()
            if old is None or old[1] != v:
                self._bump(s.signal)
            self._text[key] = (t, v)
            return True
        series = self._series.get(key)
        if series is None:
            if not self._admit(key, source):
                return False
            series = self._series[key] = Series(self.max_points)
            self._index.setdefault((s.signal, s.subject), {})[s.labels] = series
            self._signal_subjects.clear()
            self._relayout()
            self._bump(s.signal)
        if series.append(t, float(v)):
            self._bump(s.signal)
        return True

    def _relayout(self) -> None:
        self._known = None
        self.layout += 1

    def layout_key(self) -> tuple[int, int]:
        """Changes whenever the subjects, their attributes, the streams or the subjects of
        a stream's retained events may have changed (the rule engine keeps the subjects
        it found while it does not)."""
        return self.layout, sum(log.subject_changes for log in self._events.values())

    def _bump(self, signal: str) -> None:
        self.generations[signal] = self.generations.get(signal, 0) + 1
        self._change_log.append(signal)
        self.changes += 1

    def changed_since(self, mark: int) -> set[str] | None:
        """The signals bumped, streams appended to and EVICTED (an eviction pass) since
        `changes` was `mark`; None when the log no longer reaches back that far."""
        n = self.changes - mark
        if n == 0:
            return set()
        if n < 0 or n > len(self._change_log):
            return None
        return set(islice(reversed(self._change_log), n))

    def add_events(self, events: Iterable[Event]) -> None:
        added = list(events)
        if self._queued is not None:
            if added:
                self._notify(added)
                self._queued.append(lambda: self._add_events(added, notify=False))
            return
        self._add_events(added)

    def _notify(self, events: list[Event]) -> None:
        if events:
            for listener in self.event_listeners:
                listener(events)

    def _add_events(self, added: list[Event], notify: bool = True) -> None:
        for ev in added:
            log = self._events.get(ev.stream)
            if log is None:
                log = self._events[ev.stream] = EventLog(self.max_events)
                self.layout += 1
            log.append(ev)
            self._change_log.append(ev.stream)
            self.changes += 1
        if notify:
            self._notify(added)

    def drop_source(self, source: str) -> None:
        """A failed source's values leave the snapshot: stale numbers mislead more than
        absent ones. Its history stays for the rules."""
        if self._queued is not None:
            self._queued.append(lambda: self.drop_source(source))
            return
        if self._current.pop(source, None) is not None:
            self.version += 1

    def evict(self, now: float) -> None:
        if self._queued is not None:
            self._queued.append(lambda: self.evict(now))
            return
        horizon = now - self.retention
        for key in [k for k, s in self._series.items() if s.last_seen < horizon]:
            del self._series[key]
            self._bump(key[0])
            self._release(key)
            per_subject = self._index.get((key[0], key[1]))
            if per_subject is not None:
                per_subject.pop(key[2], None)
                if not per_subject:
                    del self._index[(key[0], key[1])]
                    self._signal_subjects.clear()
        for s in self._series.values():
            s.evict_before(horizon)
        for key in [k for k, (t, _) in self._text.items() if t < horizon]:
            del self._text[key]
            self._bump(key[0])
            self._release(key)
        for log in self._events.values():
            log.evict_before(horizon)
        live = {k[1] for k in self._series} | {k[1] for k in self._text}
        for batch in self._current.values():
            live.update(batch.attrs)
        for subject in [s for s in self._attrs if s not in live]:
            del self._attrs[subject]
        self._relayout()
        self._last_evict = now
        self.evictions += 1
        self._change_log.append(EVICTED)
        self.changes += 1

    # --- reading ---

    def snapshot(self) -> Snapshot:
        samples: list[Sample] = []
        for batch in self._current.values():
            samples.extend(batch.samples)
        return Snapshot(
            tuple(samples), {k: dict(v) for k, v in self._attrs.items()}, self.clock.now()
        )

    def series(self, signal: str, subject: str, labels: Labels = ()) -> Series | None:
        return self._series.get((signal, subject, labels))

    def series_for(self, signal: str, subject: str) -> list[tuple[Labels, Series]]:
        """Every label set of a signal on one subject (e.g. clock_event_active by reason)."""
        return list(self.labelled(signal, subject).items())

    def labelled(self, signal: str, subject: str) -> Mapping[Labels, Series]:
        """series_for without the copy, for the rule engine's hot path; do not modify."""
        return self._index.get((signal, subject), _NO_SERIES)

    def text(self, signal: str, subject: str, labels: Labels = ()) -> str | None:
        entry = self._text.get((signal, subject, labels))
        return None if entry is None else entry[1]

    def latest(self, signal: str, subject: str, labels: Labels = ()) -> Value:
        series = self._series.get((signal, subject, labels))
        if series is not None:
            return series.last()
        return self.text(signal, subject, labels)

    def attrs(self, subject: str) -> dict[str, str]:
        return dict(self._attrs.get(subject, {}))

    def attr(self, subject: str, name: str) -> str | None:
        """One attribute, without attrs()'s copy (the rule engine asks every tick)."""
        known = self._attrs.get(subject)
        return None if known is None else known.get(name)

    def subjects(self, kind: str | None = None) -> list[str]:
        known = self._known
        if known is None:
            seen = {k[1] for k in self._series} | {k[1] for k in self._text} | set(self._attrs)
            known = self._known = sorted(seen)
        if kind is None:
            return list(known)
        return [s for s in known if subject_kind(s) == kind]

    def signal_subjects(self, signal: str) -> list[str]:
        """Subjects that have at least one series of the signal."""
        cached = self._signal_subjects.get(signal)
        if cached is None:
            cached = sorted({subject for (sig, subject) in self._index if sig == signal})
            self._signal_subjects[signal] = cached
        return list(cached)

    def generation(self, signal: str) -> int:
        """Changes whenever a point read of the signal may return something else."""
        return self.generations.get(signal, 0)

    def stream_appended(self, stream: str) -> int:
        """Events ever appended to a stream (0 for one never written)."""
        log = self._events.get(stream)
        return 0 if log is None else log.appended

    def streams(self) -> list[str]:
        return list(self._events)

    def events(self, stream: str) -> EventLog:
        """The stream's log; for a stream never written, one empty log shared by all of
        them (read it, never append to it): a read makes no stream (another thread may be
        walking `streams()` meanwhile), and rules ask for absent streams every tick."""
        log = self._events.get(stream)
        return self._no_events if log is None else log

    def count_events(
        self,
        stream: str,
        window: float,
        subject: str | None = None,
        where: Callable[[Event], bool] | None = None,
        now: float | None = None,
    ) -> int:
        t0 = (self.clock.now() if now is None else now) - window
        return sum(1 for ev in self.events(stream).since(t0, subject) if where is None or where(ev))

    def stats(self) -> dict[str, int]:
        return {
            "series": len(self._series),
            "points": sum(len(s) for s in self._series.values()),
            "text_series": len(self._text),
            "events": sum(len(e) for e in self._events.values()),
            "events_dropped": sum(e.dropped for e in self._events.values()),
            "series_dropped": sum(self.series_dropped.values()),
        }
