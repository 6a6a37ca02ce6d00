"""An engine view (one scrape) as serving.* samples, with windowed latency quantiles.

Shared by the live collector and bundle replay, so a saved page and a live scrape give the
same samples.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque

from moptd.catalog import BUCKET_LABEL, HISTOGRAM_SUM
from moptd.observations import Batch, labels_of
from moptd.serving.engines import HISTOGRAMS, EngineView
from moptd.serving.histogram import Histogram
from moptd.serving.logparse import LogState

QUANTILES = (0.5, 0.9, 0.99)
HIST_SIGNALS = {
    "ttft": "serving.ttft",
    "itl": "serving.itl",
    "e2e": "serving.e2e_latency",
    "queue_time": "serving.queue_time",
}
# The same histograms exported whole, cumulative as the page has them.
HIST_EXPORTED = {
    "ttft": "serving.time_to_first_token",
    "itl": "serving.inter_token_latency",
    "e2e": "serving.e2e_request_latency",
    "queue_time": "serving.request_queue_time",
}
SCALAR_SIGNALS = (
    ("running", "serving.requests_running"),
    ("waiting", "serving.requests_waiting"),
    ("kv_usage", "serving.kv_cache_usage"),
    ("preemptions", "serving.preemptions"),
    ("generation_tokens", "serving.generation_tokens"),
    ("prompt_tokens", "serving.prompt_tokens"),
    ("steps", "serving.engine_steps"),
    ("process_cpu_seconds", "serving.api_cpu_seconds"),
)


# Pages a window keeps, about, however often the endpoint is scraped: every page of a 5-minute
# window scraped each 500 ms was 600 whole histogram sets, 7 MiB of a daemon's RSS (issue 30,
# item 8; BENCHMARKS.md). Pages at least window / 60 apart find the window's start to within
# 5 s of a 5-minute window; at the default 5 s interval every page is kept, as before.
PAGES_PER_WINDOW = 60


class HistogramWindow:
    """Recent cumulative histograms of one endpoint, to difference over a window."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.history: deque[tuple[float, dict[str, Histogram]]] = deque()

    def add(self, now: float, hists: dict[str, Histogram]) -> dict[str, Histogram]:
        """The observations of the last ``window`` seconds and at most window / 60 more
        (everything, at first)."""
        kept = self.history
        if len(kept) >= 2 and now - kept[-2][0] < self.window / PAGES_PER_WINDOW:
            kept[-1] = (now, hists)  # too close to the page before the newest: replace it
        else:
            kept.append((now, hists))
        while len(kept) > 1 and kept[1][0] <= now - self.window:
            kept.popleft()
        oldest = self.history[0][1] if len(self.history) > 1 else {}
        return {name: (h.minus(oldest[name]) if name in oldest else h) for name, h in hists.items()}


def fill_view(
    b: Batch, subject: str, view: EngineView, window: HistogramWindow, now: float
) -> None:
    b.add("serving.engine_metrics_present", subject, 1.0 if view.engine_series else 0.0)
    for key, signal in SCALAR_SIGNALS:
        v = view.scalars.get(key)
        if v is not None:
            b.add(signal, subject, v)
    for reason, v in view.by_label.get("waiting_by_reason", {}).items():
        b.add("serving.requests_waiting_by_reason", subject, v, labels_of(reason=reason))
    for reason, v in view.by_label.get("finished", {}).items():
        b.add("serving.requests_finished", subject, v, labels_of(finished_reason=reason))
    cc = view.cache_config
    for key, signal in (
        ("kv_cache_size_tokens", "serving.kv_cache_capacity_tokens"),
        ("kv_cache_max_concurrency", "serving.kv_cache_max_concurrency"),
        ("gpu_memory_utilization", "serving.gpu_memory_utilization"),
    ):
        with contextlib.suppress(KeyError, ValueError):
            b.add(signal, subject, float(cc[key]))
    recent = window.add(now, view.histograms)
    for name in HISTOGRAMS:
        h = recent.get(name)
        if h is None:
            continue
        for q in QUANTILES:
            value = h.quantile(q)
            if value is not None:
                b.add(HIST_SIGNALS[name], subject, value, labels_of(quantile=f"{q:g}"))
    for name in HISTOGRAMS:
        cumulative = view.histograms.get(name)
        if cumulative is not None and cumulative.buckets:
            add_histogram(b, HIST_EXPORTED[name], subject, cumulative)


def add_histogram(b: Batch, signal: str, subject: str, h: Histogram) -> None:
    """A cumulative histogram as the samples of a histogram signal (moptd/catalog/spec.py):
    one per bucket, le written as prometheus_client writes it, and the sum. A page without
    the +Inf bucket gets it from _count, which the text format defines as equal to it."""
    buckets = dict(h.buckets)
    if math.inf not in buckets:
        buckets[math.inf] = h.count
    for le in sorted(buckets):
        b.add(signal, subject, buckets[le], ((BUCKET_LABEL, _le(le)),))
    b.add(signal, subject, h.sum, HISTOGRAM_SUM)


# le texts by bound: a page's buckets are the same few bounds page after page (an hour of
# the replay bench's vLLM pages: 20,880 bounds, 43 distinct). Bounded: a hostile endpoint's
# page may name new bounds on every scrape; past the bound a text is made, not kept.
_LE_TEXTS: dict[float, str] = {}
_LE_TEXTS_MAX = 1024


def _le(bound: float) -> str:
    text = _LE_TEXTS.get(bound)
    if text is None:
        text = go_float(bound)
        if len(_LE_TEXTS) < _LE_TEXTS_MAX and bound != 0:  # 0.0 == -0.0, written apart
            _LE_TEXTS[bound] = text
    return text


def go_float(d: float) -> str:
    """A float as prometheus_client writes le and quantile labels: its
    ``prometheus_client.utils.floatToGoString`` (0.26.0, Apache-2.0), copied so that a
    replay and `moptd explain`, which never export, do not import prometheus_client (18 ms
    of a replay: BENCHMARKS.md, issue 32 on the merged tree). tests/test_latency_histograms.py
    holds it equal to the installed prometheus_client's for any float."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    # Go switches to exponents sooner than Python (prometheus_client's comment); only
    # positive values matter for le and quantile
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def fill_from_log(b: Batch, subject: str, st: LogState) -> None:
    """What the engine's stats lines and preemption warnings say, as the samples a /metrics
    page would give: the running and waiting requests summed over engines, the fullest
    engine's KV-cache usage, the cumulative preemptions. For a log without its page (a
    pasted log); where the page is read, it is the authority and this is not called."""
    stats = list(st.stats_by_engine.values())
    if stats:
        for key, signal in (
            ("running", "serving.requests_running"),
            ("waiting", "serving.requests_waiting"),
        ):
            b.add(signal, subject, sum(_num(s.get(key)) for s in stats))
        b.add("serving.kv_cache_usage", subject, max(_num(s.get("kv_usage")) for s in stats))
    if st.preemptions_total is not None:
        b.add("serving.preemptions", subject, st.preemptions_total)


# CUDA_VISIBLE_DEVICES and the order its indices count in (CUDA C++ Programming Guide,
# "CUDA Environment Variables"): the only variables read from the engine's environment.
CUDA_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
MAX_ENVIRON_BYTES = 1 << 20  # /proc/PID/environ is bounded by ARG_MAX; a bundle's too
MAX_VISIBLE = 64  # GPUs one CUDA_VISIBLE_DEVICES may name that are kept
_GPU_ID_CHARS = 100


def cuda_environ(data: bytes) -> dict[str, str]:
    """CUDA_ENV's values from an environment block: /proc/PID/environ (NUL separated) or
    a bundle's environ.txt (one VAR=value a line). Nothing else is kept."""
    out: dict[str, str] = {}
    for item in data[:MAX_ENVIRON_BYTES].replace(b"\0", b"\n").split(b"\n"):
        name, sep, value = item.partition(b"=")
        key = name.strip().decode("ascii", "replace")
        if sep and key in CUDA_ENV:
            out[key] = value.strip().decode("utf-8", "replace")
    return out


def visible_gpus(environ: dict[str, str]) -> list[str]:
    """The GPUs CUDA_VISIBLE_DEVICES names, as NVML can find them: a GPU UUID (or the
    prefix CUDA accepts) as written, an index only where CUDA_DEVICE_ORDER is PCI_BUS_ID
    (NVML numbers GPUs by PCI bus; CUDA's default FASTEST_FIRST need not). CUDA stops at
    the first entry it cannot use, and so does this; a MIG instance names no whole GPU.
    Empty when it is unset (every GPU may be used: NVML's process list says which)."""
    text = environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return []
    by_bus = environ.get("CUDA_DEVICE_ORDER", "").strip() == "PCI_BUS_ID"
    out: list[str] = []
    for entry in text.split(","):
        gpu = entry.strip()
        if gpu.isascii() and gpu.isdigit():
            if not by_bus:
                continue  # a real GPU, but which one NVML calls it is not known
            out.append(str(int(gpu)))
        elif gpu.startswith("GPU-") and len(gpu) > 4:
            out.append(gpu[:_GPU_ID_CHARS])
        else:
            break
        if len(out) >= MAX_VISIBLE:
            break
    return out


def fill_engine_gpus(
    b: Batch, subject: str, pids: list[int], environ: dict[str, str] | None
) -> None:
    """serving.process for each process of the engine's tree, serving.gpu for each GPU
    its CUDA_VISIBLE_DEVICES names (moptd.diagnose.links joins them to GPU findings)."""
    for pid in sorted(set(pids)):
        b.add("serving.process", subject, 1.0, labels_of(pid=str(pid)))
    for gpu in dict.fromkeys(visible_gpus(environ or {})):
        b.add("serving.gpu", subject, 1.0, labels_of(gpu=gpu))


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
