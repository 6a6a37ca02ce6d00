"""SGLang (``--enable-metrics``): its /metrics names and its ``Decode batch`` log line.

Retraction is SGLang's preemption; it counts finished requests in one series, aborts apart.
"""

from __future__ import annotations

import re

from moptd.serving.engines.contract import Engine, EngineView, Scalars
from moptd.serving.logrecord import LogRecord, number

SCALARS: Scalars = {
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
}

HISTOGRAMS = {
    "sglang:time_to_first_token_seconds": "ttft",
    "sglang:inter_token_latency_seconds": "itl",
    "sglang:e2e_request_latency_seconds": "e2e",
    "sglang:queue_time_seconds": "queue_time",
}


def fold_finished(view: EngineView) -> None:
    """Finished requests by reason, from the total and the aborted count."""
    finished = view.by_label.get("finished")
    if finished is None and "requests_total" in view.scalars:
        aborted = view.scalars.get("aborted", 0.0)
        view.by_label["finished"] = {
            "stop": view.scalars["requests_total"] - aborted,
            "abort": aborted,
        }


_DECODE = re.compile(
    r"Decode batch.*?#running-req: (?P<running>\d+).*?token usage: (?P<usage>[\d.]+)"
    r"(?:.*?cuda graph: (?P<graph>True|False))?.*?gen throughput \(token/s\): (?P<gen_tps>[\d.]+)"
    r".*?#queue-req: (?P<waiting>\d+)"
)


def parse_decode_batch(msg: str) -> LogRecord | None:
    m = _DECODE.search(msg)
    if m is None:
        return None
    return LogRecord(
        "serving.log_stats",
        {
            "engine": "0",
            "prompt_tps": 0.0,
            "gen_tps": number(m.group("gen_tps")),
            "running": number(m.group("running")),
            "waiting": number(m.group("waiting")),
            "preemptions": 0.0,
            "kv_usage": number(m.group("usage")),
            "swapped": 0.0,
        },
    )


ENGINE = Engine(
    name="sglang",
    title="SGLang",
    metrics_path="/metrics",
    prefixes=("sglang:",),
    aliases={"sglang_": "sglang:"},
    scalars=SCALARS,
    histograms=HISTOGRAMS,
    fold=fold_finished,
    log_parsers=(("Decode batch", parse_decode_batch),),
)
