"""The one catalog of signals: name, type, unit, help, subject kind, metric name.

The exporter's metric names and HELP text, the rule linter's known signals, the units
`moptd explain` prints and docs/metrics.md all derive from this table. Each domain
declares its signals in its own module; ``CATALOG`` gathers them.
"""

from __future__ import annotations

from moptd.catalog import cuda, daemon, daemon_logs, gpu, host, kernel, serving
from moptd.catalog.spec import (
    BUCKET_LABEL,
    HISTOGRAM_SUM,
    UNITS,
    Catalog,
    Kind,
    SignalSpec,
    SubjectKind,
)

__all__ = [
    "BUCKET_LABEL",
    "CATALOG",
    "HISTOGRAM_SUM",
    "UNITS",
    "Catalog",
    "Kind",
    "SignalSpec",
    "SubjectKind",
]

# One module per domain; a new domain is a module with SIGNALS and one entry here.
CATALOG = Catalog(
    [
        *daemon.SIGNALS,
        *daemon_logs.SIGNALS,
        *gpu.SIGNALS,
        *host.SIGNALS,
        *kernel.SIGNALS,
        *serving.SIGNALS,
        *cuda.SIGNALS,
    ]
)
