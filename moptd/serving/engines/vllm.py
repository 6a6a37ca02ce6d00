"""vLLM: its /metrics names, its periodic stats log line (V1 and V0) and V0's preemption
warning.

V1's names (0.10 .. 0.33) come first; the older names they replaced (gpu_cache_usage_perc,
gpu_prefix_cache_*, time_per_output_token_seconds) map onto the same fields, so one rule
set reads 0.8 and 0.33 alike.
"""

from __future__ import annotations

import re

from moptd.serving.engines.contract import Engine, EngineView, Scalars
from moptd.serving.logrecord import LogRecord, number

SCALARS: Scalars = {
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
}

HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:inter_token_latency_seconds": "itl",
    "vllm:time_per_output_token_seconds": "itl_old",
    "vllm:e2e_request_latency_seconds": "e2e",
    "vllm:request_queue_time_seconds": "queue_time",
}


def fold_old_names(view: EngineView) -> None:
    """The deprecated names only count where the new ones are absent (0.8-0.10 servers
    export both, with the same meaning)."""
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


_STATS = re.compile(
    r"(?:Engine (?P<eng>\d{3})|(?P<neng>\d+) Engines Aggregated): Avg prompt throughput: "
    r"(?P<prompt_tps>[\d.]+) tokens/s, Avg generation throughput: (?P<gen_tps>[\d.]+) tokens/s, "
    r"Running: (?P<running>\d+) reqs, Waiting: (?P<waiting>\d+) reqs"
    r"(?:, Deferred: (?P<deferred>\d+) reqs)?"
    r"(?:, KV fetch: \d+ waiting to start, \d+ in progress, \d+ completed waiting)?"
    r"(?:, Preemptions: (?P<preemptions>\d+))?, (?P<kv_dev>[A-Z+ a-z]+?) KV cache usage: "
    r"(?P<kv_pct>[\d.]+)%(?:, Prefix cache hit rate: (?P<prefix_pct>[\d.]+)%)?"
)


# V0 (<= 0.10 with VLLM_USE_V1=0; vllm/engine/metrics.py): one engine, "Pending" for
# waiting, "Swapped" for requests preempted by swapping (V1 has no swap), no preemption count.
_STATS_V0 = re.compile(
    r"Avg prompt throughput: (?P<prompt_tps>[\d.]+) tokens/s, Avg generation throughput: "
    r"(?P<gen_tps>[\d.]+) tokens/s, Running: (?P<running>\d+) reqs, Swapped: (?P<swapped>\d+) "
    r"reqs, Pending: (?P<waiting>\d+) reqs, GPU KV cache usage: (?P<kv_pct>[\d.]+)%"
)
# V0's scheduler.py warning, printed at the first preemption and every 50th after it, with
# the engine's cumulative count (vllm:num_preemptions_total's value then).
_PREEMPTED = re.compile(
    r"Sequence group \S+ is preempted by PreemptionMode\.(?P<mode>[A-Z]+) mode because there "
    r"is not enough KV cache space\..*?total_num_cumulative_preemption=(?P<total>\d+)"
)


def parse_preemption(msg: str) -> LogRecord | None:
    m = _PREEMPTED.search(msg)
    if m is None:
        return None
    return LogRecord(
        "serving.preemption",
        {"mode": m.group("mode").lower(), "total": number(m.group("total"))},
    )


def parse_stats(msg: str) -> LogRecord | None:
    """loggers.py's ``Engine 000: Avg prompt throughput ... KV cache usage ...`` line, or
    V0's metrics.py line without the engine."""
    m = _STATS.search(msg)
    if m is None:
        m = _STATS_V0.search(msg)
        if m is None:
            return None
        return LogRecord(
            "serving.log_stats",
            {
                "engine": "0",
                "prompt_tps": number(m.group("prompt_tps")),
                "gen_tps": number(m.group("gen_tps")),
                "running": number(m.group("running")),
                "waiting": number(m.group("waiting")),
                "preemptions": 0.0,
                "kv_usage": number(m.group("kv_pct")) / 100.0,
                "swapped": number(m.group("swapped")),
            },
        )
    return LogRecord(
        "serving.log_stats",
        {
            "engine": m.group("eng") or "all",
            "prompt_tps": number(m.group("prompt_tps")),
            "gen_tps": number(m.group("gen_tps")),
            "running": number(m.group("running")),
            "waiting": number(m.group("waiting")),
            "preemptions": number(m.group("preemptions")),
            "kv_usage": number(m.group("kv_pct")) / 100.0,
            "swapped": 0.0,
        },
    )


ENGINE = Engine(
    name="vllm",
    title="vLLM",
    metrics_path="/metrics",
    prefixes=("vllm:",),
    aliases={"vllm_": "vllm:"},
    scalars=SCALARS,
    histograms=HISTOGRAMS,
    info_series="vllm:cache_config_info",
    fold=fold_old_names,
    log_parsers=(
        ("Avg prompt throughput", parse_stats),
        ("is preempted by", parse_preemption),
    ),
)
