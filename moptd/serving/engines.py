"""Map each engine's own metric names onto one view (vLLM, SGLang, TensorRT-LLM).

vLLM's V1 names come first; the older names it replaced (gpu_cache_usage_perc,
gpu_prefix_cache_*, time_per_output_token_seconds) map onto the same fields, so one rule
set reads 0.8 and 0.33 alike. Every engine field sums over data-parallel engine ranks,
except KV usage, where the fullest rank is what matters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from moptd.serving.histogram import Histogram
from moptd.serving.promtext import PromSample

ENGINES = ("vllm", "sglang", "trtllm")
HISTOGRAMS = ("ttft", "itl", "e2e", "queue_time")

Agg = Literal["sum", "max"]

# wire name -> (field, label that splits it or "", aggregation)
_SCALARS: dict[str, tuple[str, str, Agg]] = {
    # vLLM V1 (0.10 .. 0.33) and the V0 / early-V1 names
    "vllm:num_requests_running": ("running", "", "sum"),
    "vllm:num_requests_waiting": ("waiting", "", "sum"),
    "vllm:num_requests_waiting_by_reason": ("waiting_by_reason", "reason", "sum"),
    "vllm:kv_cache_usage_perc": ("kv_usage", "", "max"),
    "vllm:gpu_cache_usage_perc": ("kv_usage_old", "", "max"),
    "vllm:num_preemptions_total": ("preemptions", "", "sum"),
    "vllm:prompt_tokens_total": ("prompt_tokens", "", "sum"),
    "vllm:generation_tokens_total": ("generation_tokens", "", "sum"),
    "vllm:request_success_total": ("finished", "finished_reason", "sum"),
    "vllm:iteration_tokens_total_count": ("steps", "", "sum"),
    "vllm:iteration_tokens_total_sum": ("step_tokens", "", "sum"),
    "vllm:prefix_cache_queries_total": ("prefix_queries", "", "sum"),
    "vllm:prefix_cache_hits_total": ("prefix_hits", "", "sum"),
    "vllm:gpu_prefix_cache_queries_total": ("prefix_queries_old", "", "sum"),
    "vllm:gpu_prefix_cache_hits_total": ("prefix_hits_old", "", "sum"),
    # SGLang (--enable-metrics); retraction is its preemption
    "sglang:num_running_reqs": ("running", "", "sum"),
    "sglang:num_queue_reqs": ("waiting", "", "sum"),
    "sglang:token_usage": ("kv_usage", "", "max"),
    "sglang:num_retracted_requests_total": ("preemptions", "", "sum"),
    "sglang:prompt_tokens_total": ("prompt_tokens", "", "sum"),
    "sglang:generation_tokens_total": ("generation_tokens", "", "sum"),
    "sglang:num_aborted_requests_total": ("aborted", "", "sum"),
    "sglang:num_requests_total": ("requests_total", "", "sum"),
    "sglang:is_cuda_graph": ("cuda_graph", "", "max"),
    "sglang:cache_hit_rate": ("prefix_hit_ratio", "", "max"),
    # TensorRT-LLM /prometheus/metrics (trtllm_ prefix, or bare names in older releases)
    "trtllm_num_requests_running": ("running", "", "sum"),
    "trtllm_num_requests_waiting": ("waiting", "", "sum"),
    "trtllm_kv_cache_utilization": ("kv_usage", "", "max"),
    "trtllm_request_success_total": ("finished", "finished_reason", "sum"),
    "request_success_total": ("finished", "finished_reason", "sum"),
    # the API server's own process (absent with several API servers: multiprocess mode)
    "process_cpu_seconds_total": ("process_cpu_seconds", "", "sum"),
    "process_start_time_seconds": ("process_start_time", "", "max"),
    "process_resident_memory_bytes": ("process_rss", "", "sum"),
}

_HISTOGRAMS: dict[str, str] = {
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:inter_token_latency_seconds": "itl",
    "vllm:time_per_output_token_seconds": "itl_old",
    "vllm:e2e_request_latency_seconds": "e2e",
    "vllm:request_queue_time_seconds": "queue_time",
    "sglang:time_to_first_token_seconds": "ttft",
    "sglang:inter_token_latency_seconds": "itl",
    "sglang:e2e_request_latency_seconds": "e2e",
    "sglang:queue_time_seconds": "queue_time",
    "trtllm_time_to_first_token_seconds": "ttft",
    "trtllm_time_per_output_token_seconds": "itl",
    "trtllm_e2e_request_latency_seconds": "e2e",
    "trtllm_request_queue_time_seconds": "queue_time",
    "time_to_first_token_seconds": "ttft",
    "time_per_output_token_seconds": "itl",
    "e2e_request_latency_seconds": "e2e",
    "request_queue_time_seconds": "queue_time",
}

_ENGINE_PREFIXES = ("vllm:", "sglang:", "trtllm_")


@dataclass
class EngineView:
    """What one scrape says about one serving endpoint, in engine-neutral terms."""

    scalars: dict[str, float] = field(default_factory=dict)
    by_label: dict[str, dict[str, float]] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)
    model: str = ""
    engine_series: int = 0  # engine-specific samples seen; 0 with vLLM --disable-log-stats

    def get(self, name: str) -> float | None:
        return self.scalars.get(name)


def _canonical(name: str) -> str:
    # A scraper that sent Prometheus 2.x's Accept header gets vllm_ for vllm:; moptd sends
    # none, but a saved page (a bundle) may come from such a scraper.
    if name.startswith("vllm_"):
        return "vllm:" + name[5:]
    if name.startswith("sglang_"):
        return "sglang:" + name[7:]
    return name


def view_from_samples(samples: Iterable[PromSample]) -> EngineView:
    view = EngineView()
    aggs: dict[str, Agg] = {}
    for s in samples:
        name = _canonical(s.name)
        if name.startswith(_ENGINE_PREFIXES):
            view.engine_series += 1
            if not view.model:
                for k, v in s.labels:
                    if k == "model_name":
                        view.model = v
        spec = _SCALARS.get(name)
        if spec is not None:
            if math.isnan(s.value):
                continue
            fld, split, agg = spec
            if split:
                key = next((v for k, v in s.labels if k == split), "")
                bucket = view.by_label.setdefault(fld, {})
                bucket[key] = bucket.get(key, 0.0) + s.value
            else:
                _accumulate(view.scalars, aggs, fld, s.value, agg)
            continue
        if name == "vllm:cache_config_info":
            view.cache_config = {k: v for k, v in s.labels if k not in ("engine", "model_name")}
            continue
        base, _, suffix = name.rpartition("_")
        if suffix in ("bucket", "count", "sum"):
            hname = _HISTOGRAMS.get(base)
            if hname is not None:
                h = view.histograms.setdefault(hname, Histogram())
                if suffix == "bucket":
                    le = next((v for k, v in s.labels if k == "le"), None)
                    if le is not None:
                        h.add_bucket(math.inf if le in ("+Inf", "Inf") else float(le), s.value)
                elif suffix == "count":
                    h.count += s.value
                else:
                    h.sum += s.value
    _fold_old_names(view)
    return view


def _accumulate(out: dict[str, float], aggs: dict[str, Agg], fld: str, v: float, agg: Agg) -> None:
    if fld not in out:
        out[fld] = v
        aggs[fld] = agg
    elif agg == "sum":
        out[fld] += v
    else:
        out[fld] = max(out[fld], v)


def _fold_old_names(view: EngineView) -> None:
    """The deprecated vLLM names only count where the new ones are absent (0.8-0.10
    servers export both, with the same meaning)."""
    for old, new in (
        ("kv_usage_old", "kv_usage"),
        ("prefix_queries_old", "prefix_queries"),
        ("prefix_hits_old", "prefix_hits"),
    ):
        value = view.scalars.pop(old, None)
        if value is not None and new not in view.scalars:
            view.scalars[new] = value
    old_itl = view.histograms.pop("itl_old", None)
    if old_itl is not None and "itl" not in view.histograms:
        view.histograms["itl"] = old_itl
    finished = view.by_label.get("finished")
    if finished is None and "requests_total" in view.scalars:
        # SGLang counts finished requests in one series; aborts apart
        aborted = view.scalars.get("aborted", 0.0)
        view.by_label["finished"] = {
            "stop": view.scalars["requests_total"] - aborted,
            "abort": aborted,
        }


def view_from_trtllm_stats(payload: Any) -> EngineView:
    """TensorRT-LLM's JSON ``/metrics``: a list of per-iteration dicts (each GET drains the
    queue, so the list holds the iterations since the previous read)."""
    if isinstance(payload, (str, bytes)):
        payload = json.loads(payload)
    if not isinstance(payload, list):
        raise ValueError("TensorRT-LLM /metrics: expected a JSON list of iteration stats")
    view = EngineView()
    view.engine_series = len(payload)
    view.scalars["steps_since_last"] = float(len(payload))
    if not payload:
        return view
    last = payload[-1]
    if not isinstance(last, dict):
        raise ValueError("TensorRT-LLM /metrics: an iteration entry is not an object")
    for key, fld in (
        ("numActiveRequests", "running"),
        ("numQueuedRequests", "waiting"),
        ("gpuMemUsage", "gpu_memory"),
        ("iter", "iteration"),
    ):
        value = last.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            view.scalars[fld] = float(value)
    kv = last.get("kvCacheStats")
    if isinstance(kv, dict):
        used, total = kv.get("usedNumBlocks"), kv.get("maxNumBlocks")
        if isinstance(used, (int, float)) and isinstance(total, (int, float)) and total > 0:
            view.scalars["kv_usage"] = float(used) / float(total)
    return view


def detect_engine(samples: Iterable[PromSample]) -> str:
    for s in samples:
        if s.name.startswith(("vllm:", "vllm_")):
            return "vllm"
        if s.name.startswith(("sglang:", "sglang_")):
            return "sglang"
        if s.name.startswith("trtllm_"):
            return "trtllm"
    return ""
