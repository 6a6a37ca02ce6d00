"""Prometheus exposition of the latest snapshot.

A scrape builds metric families from the store's snapshot and nothing else: it never
calls NVML or reads a file, so it costs the same on a healthy host and on one whose GPU
hangs. Series of departed subjects vanish because the snapshot is rebuilt per pass.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from moptd import __version__
from moptd.catalog import CATALOG, Catalog, SignalSpec
from moptd.observations import subject_id, subject_kind
from moptd.store import SignalStore, Snapshot

# Labels each subject kind contributes, in order; values come from the subject id and
# the attributes collectors attached to it.
SUBJECT_LABELS: dict[str, tuple[str, ...]] = {
    "node": (),
    "gpu": ("gpu", "uuid"),
    "process": ("pid", "process", "container"),
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
        return {"pid": ident, "process": a.get("name", ""), "container": a.get("container", "")}
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
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    label_names: dict[str, list[str]] = {}
    for sample in snapshot.samples:
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
        fam.add_metric([labels.get(n, "") for n in label_names[spec.metric]], sample.value)
    build = catalog.get("node.build")
    if build is not None and build.metric is not None:
        fam = _family(build, ["version", "python"])
        fam.add_metric([__version__, platform.python_version()], 1.0)
        families[build.metric] = fam
    return [families[k] for k in sorted(families)]


def _family(spec: SignalSpec, labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    assert spec.metric is not None
    if spec.kind == "counter":
        return CounterMetricFamily(spec.metric, spec.help, labels=labels)
    return GaugeMetricFamily(spec.metric, spec.help, labels=labels)


def make_registry(store: SignalStore) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(store))
    return registry


class MetricsEndpoint:
    """GET /metrics: the text exposition of the latest snapshot, rendered once per
    snapshot change and served from memory to every scrape in between."""

    def __init__(self, store: SignalStore) -> None:
        self.store = store
        self.registry = make_registry(store)
        self._version = -1
        self._body = b""

    def render(self) -> bytes:
        if self._version != self.store.version:
            self._body = generate_latest(self.registry)
            self._version = self.store.version
        return self._body

    async def handle(self, request: web.Request) -> web.Response:
        return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})
