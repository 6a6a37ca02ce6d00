"""TensorRT-LLM: its Prometheus page (``/prometheus/metrics``) and its JSON ``/metrics``.

The Prometheus names carry a ``trtllm_`` prefix, or none in older releases. ``/metrics`` is
JSON iteration stats that each GET drains (one reader only); its iteration count is per
read, and the collector adds the reads up into ``steps``.
"""

from __future__ import annotations

import json
from typing import Any

from moptd.serving.engines.contract import Engine, EngineView, Scalars

SCALARS: Scalars = {
    "trtllm_num_requests_running": ("running", "", "sum"),
    "trtllm_num_requests_waiting": ("waiting", "", "sum"),
    "trtllm_kv_cache_utilization": ("kv_usage", "", "max"),
    "trtllm_request_success_total": ("finished", "finished_reason", "sum"),
    "request_success_total": ("finished", "finished_reason", "sum"),
}

HISTOGRAMS = {
    "trtllm_time_to_first_token_seconds": "ttft",
    "trtllm_time_per_output_token_seconds": "itl",
    "trtllm_e2e_request_latency_seconds": "e2e",
    "trtllm_request_queue_time_seconds": "queue_time",
    "time_to_first_token_seconds": "ttft",
    "time_per_output_token_seconds": "itl",
    "e2e_request_latency_seconds": "e2e",
    "request_queue_time_seconds": "queue_time",
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


ENGINE = Engine(
    name="trtllm",
    title="TensorRT-LLM",
    metrics_path="/prometheus/metrics",
    prefixes=("trtllm_",),
    scalars=SCALARS,
    histograms=HISTOGRAMS,
    page_readers={"/metrics": view_from_trtllm_stats},
    running_totals={"steps_since_last": "steps"},
)
