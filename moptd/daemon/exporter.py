"""Prometheus exposition of the latest snapshot.

A scrape builds metric families from the store's snapshot and nothing else: it never
calls NVML or reads a file, so it costs the same on a healthy host and on one whose GPU
hangs. Series of departed subjects vanish because the snapshot is rebuilt per pass.
"""

from __future__ import annotations

import gzip
import math
import platform
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from moptd import __version__
from moptd.catalog import BUCKET_LABEL, CATALOG, HISTOGRAM_SUM, Catalog, SignalSpec
from moptd.daemon.software import software_samples
from moptd.observations import Labels, subject_id, subject_kind
from moptd.serving.signals import go_float  # prometheus_client's formatting, equal to it
from moptd.store import SignalStore, Snapshot

# Labels each subject kind contributes, in order; values come from the subject id and
# the attributes collectors attached to it.
SUBJECT_LABELS: dict[str, tuple[str, ...]] = {
    "node": (),
    "gpu": ("gpu", "uuid"),
    # pod and namespace name a Kubernetes pod (moptd/proc/pods.py); one value per process
    "process": ("pid", "process", "container", "pod", "namespace"),
    "collector": ("collector",),
    "serving": ("serving",),
}


def subject_labels(subject: str, attrs: dict[str, dict[str, str]]) -> dict[str, str]:
    kind = subject_kind(subject)
    ident = subject_id(subject)
    a = attrs.get(subject, {})
    if kind == "gpu":
        return {"gpu": ident, "uuid": a.get("uuid", "")}
    if kind == "process":
        return {
            "pid": ident,
            "process": a.get("name", ""),
            "container": a.get("container", ""),
            "pod": a.get("pod", ""),
            "namespace": a.get("namespace", ""),
        }
    if kind in ("collector", "serving"):
        return {kind: ident}
    return {}


class SnapshotCollector:
    """A prometheus_client collector over the store's latest snapshot."""

    def __init__(self, store: SignalStore, catalog: Catalog = CATALOG) -> None:
        self.store = store
        self.catalog = catalog

    def collect(self) -> Iterator[Metric]:
        return iter(render_families(self.store.snapshot(), self.catalog))


def render_families(snapshot: Snapshot, catalog: Catalog = CATALOG) -> list[Metric]:
    families: dict[str, Metric] = {}
    label_names: dict[str, list[str]] = {}
    histograms: dict[str, dict[tuple[str, ...], _HistogramSeries]] = {}
    # A series is written once (the exposition format allows no repeat, and Prometheus
    # drops the repeats of a scrape with a warning): where two samples name the same series
    # (a managed engine's KV capacity from its page and from its log), the later one counts,
    # as it does in the store's series; it keeps the place of the first.
    values_of: dict[str, dict[tuple[str, ...], float]] = {}
    for sample in (*snapshot.samples, *software_samples(snapshot.samples)):
        spec = catalog.get(sample.signal)
        if spec is None or spec.metric is None or sample.value is None:
            continue
        if isinstance(sample.value, str):
            continue
        labels = subject_labels(sample.subject, snapshot.attrs)
        labels.update(sample.labels)
        fam = families.get(spec.metric)
        if fam is None:
            names = [*SUBJECT_LABELS.get(spec.subject, ()), *spec.labels]
            fam = families[spec.metric] = _family(spec, names)
            label_names[spec.metric] = names
        values = [labels.get(n, "") for n in label_names[spec.metric]]
        if isinstance(fam, HistogramMetricFamily):
            series = histograms.setdefault(spec.metric, {}).setdefault(
                tuple(values), _HistogramSeries()
            )
            series.add(sample.labels, sample.value)
        else:
            values_of.setdefault(spec.metric, {})[tuple(values)] = sample.value
    for metric, series_values in values_of.items():
        fam = families[metric]
        assert isinstance(fam, GaugeMetricFamily | CounterMetricFamily)
        for values_key, value in series_values.items():
            fam.add_metric(list(values_key), value)
    for metric, by_series in histograms.items():
        hist = families[metric]
        assert isinstance(hist, HistogramMetricFamily)
        for values_key, series in by_series.items():
            if series.buckets:
                hist.add_metric(list(values_key), series.sorted_buckets(), series.sum)
    build = catalog.get("node.build")
    if build is not None and build.metric is not None:
        info = _family(build, ["version", "python"])
        assert isinstance(info, GaugeMetricFamily)
        info.add_metric([__version__, platform.python_version()], 1.0)
        families[build.metric] = info
    return [families[k] for k in sorted(families)]


class _HistogramSeries:
    """One series of a histogram signal, gathered from its samples: the buckets (le as
    written) and the sum, None until its sample comes."""

    __slots__ = ("buckets", "sum")

    def __init__(self) -> None:
        self.buckets: dict[str, float] = {}  # le -> value; a repeated bucket: the later
        self.sum: float | None = None

    def add(self, labels: Labels, value: float) -> None:
        if labels == HISTOGRAM_SUM:
            self.sum = value
            return
        le = next((v for k, v in labels if k == BUCKET_LABEL), None)
        if le is not None:
            self.buckets[le] = value

    def sorted_buckets(self) -> list[tuple[str, float]]:
        # +Inf last and every bound in order: what the exposition format requires
        return sorted(self.buckets.items(), key=lambda b: _bound(b[0]))


def _bound(le: str) -> float:
    try:
        return float(le)
    except ValueError:  # not written by moptd's collectors; sorts last rather than fail
        return math.inf


def _family(
    spec: SignalSpec, labels: list[str]
) -> GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily:
    assert spec.metric is not None
    if spec.kind == "counter":
        return CounterMetricFamily(spec.metric, spec.help, labels=labels)
    if spec.kind == "histogram":
        return HistogramMetricFamily(spec.metric, spec.help, labels=labels)
    return GaugeMetricFamily(spec.metric, spec.help, labels=labels)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


class TextRenderer:
    """The text exposition format (0.0.4) of a snapshot, byte for byte what
    prometheus_client's generate_latest gives for render_families (a test holds them
    equal), several times faster: the label part of each series is built once and kept
    while the series and its subject's labels stay the same."""

    MAX_CACHED = 20000

    def __init__(self, catalog: Catalog = CATALOG) -> None:
        self.catalog = catalog
        self._prefix: dict[
            tuple[str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]], str
        ] = {}
        self._build = (
            f'moptd_build_info{{python="{platform.python_version()}",'
            f'version="{_escape_label(__version__)}"}} 1.0\n'
        )

    def render(self, snapshot: Snapshot) -> bytes:
        if len(self._prefix) > self.MAX_CACHED:
            self._prefix.clear()
        families: dict[str, list[str]] = {}
        subject_parts: dict[str, tuple[tuple[str, str], ...]] = {}
        histograms: dict[str, dict[tuple[Labels, Labels], _HistogramSeries]] = {}
        # where each series' line is: a repeated series replaces its line (render_families)
        line_at: dict[tuple[str, Labels, Labels], int] = {}
        # the versions series is composed from stored samples (moptd/daemon/software.py)
        for sample in (*snapshot.samples, *software_samples(snapshot.samples)):
            value = sample.value
            if value is None or isinstance(value, str):
                continue
            spec = self.catalog.get(sample.signal)
            if spec is None or spec.metric is None:
                continue
            subj = subject_parts.get(sample.subject)
            if subj is None:
                subj = tuple(subject_labels(sample.subject, snapshot.attrs).items())
                subject_parts[sample.subject] = subj
            lines = families.get(spec.metric)
            if lines is None:
                lines = families[spec.metric] = []
            if spec.kind == "histogram":
                rest = tuple(
                    kv for kv in sample.labels if kv[0] != BUCKET_LABEL and kv not in HISTOGRAM_SUM
                )
                by_series = histograms.setdefault(spec.metric, {})
                series = by_series.get((subj, rest))
                if series is None:
                    series = by_series[(subj, rest)] = _HistogramSeries()
                series.add(sample.labels, value)
                continue
            key = (spec.metric, subj, sample.labels)
            prefix = self._prefix.get(key)
            if prefix is None:
                prefix = self._prefix[key] = self._series_prefix(
                    spec.metric, self._label_names(spec), dict(subj), sample.labels
                )
            at = line_at.get(key)
            if at is None:
                line_at[key] = len(lines)
                lines.append(prefix + go_float(value) + "\n")
            else:
                lines[at] = prefix + go_float(value) + "\n"
        for metric, by_series in histograms.items():
            spec = self.catalog.by_metric_name(metric)
            for (subj, rest), series in by_series.items():
                self._histogram_lines(families[metric], spec, subj, rest, series)
        build = self.catalog.get("node.build")
        if build is not None and build.metric is not None:
            families[build.metric] = [self._build]
        out: list[str] = []
        for metric in sorted(families):
            spec = self.catalog.by_metric_name(metric)
            kind = spec.kind if spec.kind in ("counter", "histogram") else "gauge"
            out.append(f"# HELP {metric} {_escape_help(spec.help)}\n# TYPE {metric} {kind}\n")
            out.extend(families[metric])
        return "".join(out).encode()

    def _histogram_lines(
        self,
        lines: list[str],
        spec: SignalSpec,
        subj: Labels,
        rest: Labels,
        series: _HistogramSeries,
    ) -> None:
        """What HistogramMetricFamily.add_metric writes: the buckets in order, then _count
        (the last bucket's value) and _sum, both left out without a sum or when the first
        bound is negative."""
        buckets = series.sorted_buckets()
        if not buckets:
            return
        assert spec.metric is not None
        names = self._label_names(spec)
        for le, value in buckets:
            labels = (*rest, (BUCKET_LABEL, le))
            key = (spec.metric + "_bucket", subj, labels)
            prefix = self._prefix.get(key)
            if prefix is None:
                prefix = self._prefix[key] = self._series_prefix(
                    key[0], [*names, BUCKET_LABEL], dict(subj), labels
                )
            lines.append(prefix + go_float(value) + "\n")
        if series.sum is None or _bound(buckets[0][0]) < 0:
            return
        for suffix, value in (("_count", buckets[-1][1]), ("_sum", series.sum)):
            key = (spec.metric + suffix, subj, rest)
            prefix = self._prefix.get(key)
            if prefix is None:
                prefix = self._prefix[key] = self._series_prefix(key[0], names, dict(subj), rest)
            lines.append(prefix + go_float(value) + "\n")

    @staticmethod
    def _label_names(spec: SignalSpec) -> list[str]:
        return [*SUBJECT_LABELS.get(spec.subject, ()), *spec.labels]

    @staticmethod
    def _series_prefix(
        name: str, label_names: list[str], subject: dict[str, str], extra: Labels
    ) -> str:
        values = dict(subject)
        values.update(extra)
        # prometheus_client writes label names sorted; so do we, to stay byte-identical
        names = sorted(label_names)
        if not names:
            return f"{name} "
        inner = ",".join(f'{n}="{_escape_label(values.get(n, ""))}"' for n in names)
        return f"{name}{{{inner}}} "


class MetricsEndpoint:
    """GET /metrics: the text exposition of the latest snapshot, rendered once per
    snapshot change and served from memory to every scrape in between."""

    def __init__(self, store: SignalStore) -> None:
        self.store = store
        self.renderer = TextRenderer()
        self._version = -1
        self._body = b""
        self._gzipped: bytes | None = None

    def render(self) -> bytes:
        if self._version != self.store.version:
            self._body = self.renderer.render(self.store.snapshot())
            self._gzipped = None
            self._version = self.store.version
        return self._body

    def render_gzip(self) -> bytes:
        """The same body gzip-compressed, once per snapshot change like the body itself:
        Prometheus asks for gzip on every scrape, and a 28 KB page compresses to about 6."""
        body = self.render()
        if self._gzipped is None:
            # level 6 as Go's and node_exporter's default; mtime 0 keeps it reproducible
            self._gzipped = gzip.compress(body, compresslevel=6, mtime=0)
        return self._gzipped

    async def handle(self, request: web.Request) -> web.Response:
        headers = {"Content-Type": CONTENT_TYPE_LATEST, "Vary": "Accept-Encoding"}
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            headers["Content-Encoding"] = "gzip"
            return web.Response(body=self.render_gzip(), headers=headers)
        return web.Response(body=self.render(), headers=headers)


def accepts_gzip(header: str) -> bool:
    """RFC 9110 content negotiation for one coding: gzip listed with q > 0, or, where gzip
    is not listed, ``*`` with q > 0."""
    q_by_coding: dict[str, float] = {}
    for part in header.split(","):
        coding, *params = part.split(";")
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
        name = coding.strip().lower()
        q_by_coding[{"x-gzip": "gzip"}.get(name, name)] = q
    return q_by_coding.get("gzip", q_by_coding.get("*", 0.0)) > 0
