"""The signal spec and the catalog type; the domain modules beside this one declare the
signals themselves."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter", "info", "event", "histogram"]
SubjectKind = Literal["node", "gpu", "process", "collector", "serving"]

# Units are Prometheus base units; "" for plain numbers and enumerations.
UNITS = frozenset(
    {
        "",
        "ratio",
        "bytes",
        "bytes_per_second",
        "celsius",
        "watts",
        "joules",
        "hertz",
        "seconds",
        "bool",
        "count",
    }
)


# A histogram signal's samples, as a collector adds them: one per bucket, labelled ``le`` with
# its upper bound as prometheus_client writes it ("0.005", "+Inf"), the cumulative count of
# observations up to it; and one labelled HISTOGRAM_SUM, the sum of the observations. The
# exposition's _count is the +Inf bucket, as the text format defines it. Labels beginning
# with "__" are Prometheus's own, so no declared label can collide with this one.
BUCKET_LABEL = "le"
HISTOGRAM_SUM: tuple[tuple[str, str], ...] = (("__part__", "sum"),)
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


@dataclass(frozen=True, slots=True)
class SignalSpec:
    name: str  # what rules and `explain` call it: "<namespace>.<field>", e.g. gpu.util
    kind: Kind
    unit: str
    help: str
    subject: SubjectKind
    metric: str | None = None  # Prometheus name; None: kept for rules, not exported
    labels: tuple[str, ...] = ()  # dimensions beyond the subject's own labels
    dcgm: str = ""  # dcgm-exporter counterpart, for docs/metrics.md
    fields: tuple[str, ...] = ()  # for events: the fields a rule may test (code, pid, ...)

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"{self.name}: unknown unit {self.unit!r}")
        if self.name.count(".") != 1:
            raise ValueError(f"{self.name}: a signal name is <namespace>.<field>")
        if self.kind == "event" and self.metric is not None:
            raise ValueError(f"{self.name}: events are exported through counters, not directly")
        if self.kind == "histogram" and (BUCKET_LABEL in self.labels or self.metric is None):
            raise ValueError(f"{self.name}: a histogram is exported and declares no le label")
        if self.metric is not None:
            _check_metric_name(self)

    def series_names(self) -> tuple[str, ...]:
        """The names this signal's series carry on /metrics."""
        if self.metric is None:
            return ()
        if self.kind == "histogram":
            return tuple(self.metric + suffix for suffix in HISTOGRAM_SUFFIXES)
        return (self.metric,)


def _check_metric_name(spec: SignalSpec) -> None:
    m = spec.metric or ""
    if not m.startswith("moptd_") or ":" in m:
        raise ValueError(f"{spec.name}: metric {m!r} must start with moptd_ and have no colon")
    if spec.kind == "counter" and not m.endswith("_total"):
        raise ValueError(f"{spec.name}: counter metric {m!r} must end in _total")
    if spec.kind != "counter" and m.endswith("_total"):
        raise ValueError(f"{spec.name}: only counters end in _total ({m!r})")
    if spec.kind == "histogram" and m.endswith(HISTOGRAM_SUFFIXES):
        raise ValueError(f"{spec.name}: histogram {m!r} is named without _bucket/_count/_sum")
    if spec.kind == "info" and not m.endswith("_info"):
        raise ValueError(f"{spec.name}: info metric {m!r} must end in _info")
    suffix = {
        "ratio": "_ratio",
        "bytes": "_bytes",
        "bytes_per_second": "_bytes_per_second",
        "celsius": "_celsius",
        "watts": "_watts",
        "hertz": "_hertz",
        "seconds": "_seconds",
        "joules": "_joules",
    }.get(spec.unit)
    base = m.removesuffix("_total")
    if suffix and not (base.endswith(suffix) or base.endswith(suffix.rstrip("s"))):
        raise ValueError(f"{spec.name}: metric {m!r} must carry its unit suffix {suffix}")


class Catalog(Mapping[str, SignalSpec]):
    def __init__(self, specs: list[SignalSpec]) -> None:
        self._by_name: dict[str, SignalSpec] = {}
        self._metric_index: dict[str, SignalSpec] | None = None
        metrics: set[str] = set()
        for spec in specs:
            if spec.name in self._by_name:
                raise ValueError(f"signal {spec.name} declared twice")
            # a histogram's series names too: moptd_x_seconds_count next to a histogram
            # moptd_x_seconds would be two families writing one series
            names = {spec.metric, *spec.series_names()} if spec.metric is not None else set()
            for name in sorted(names):
                if name in metrics:
                    raise ValueError(f"metric {name} declared twice")
                metrics.add(name)
            self._by_name[spec.name] = spec

    def __getitem__(self, name: str) -> SignalSpec:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def exported(self) -> list[SignalSpec]:
        return [s for s in self._by_name.values() if s.metric is not None]

    def by_metric_name(self, metric: str) -> SignalSpec:
        if self._metric_index is None:
            self._metric_index = self.by_metric()
        return self._metric_index[metric]

    def by_metric(self) -> dict[str, SignalSpec]:
        return {s.metric: s for s in self._by_name.values() if s.metric is not None}
