"""Serving-engine signals (subject ``serving:<name>``), read from the engine's /metrics.

moptd does not re-export the engine's own series; it exports these few normalised ones so
one dashboard and one rule set fit vLLM, SGLang and TensorRT-LLM alike. Each HELP names
the vLLM source metric where there is one. The serving collector (moptd/collectors/serving.py)
and the managed-process supervisor (moptd/serving/) fill them; the event streams at the end
come from the serving log and the supervisor.
"""

from moptd.catalog.spec import SignalSpec


def _s(
    name: str, kind: str, unit: str, help: str, metric: str | None, labels: tuple[str, ...] = ()
) -> SignalSpec:
    return SignalSpec(f"serving.{name}", kind, unit, help, "serving", metric, labels)  # type: ignore[arg-type]


SIGNALS = [
    _s(
        "up",
        "gauge",
        "bool",
        "1 when moptd read the serving endpoint's /metrics on its last try.",
        "moptd_serving_up",
    ),
    _s(
        "healthy",
        "gauge",
        "bool",
        "1 when the serving endpoint's health probe (/health) answered 200 on its last try.",
        "moptd_serving_healthy",
    ),
    _s(
        "requests_running",
        "gauge",
        "count",
        "Requests in the engine's running batch (vllm:num_requests_running).",
        "moptd_serving_requests_running",
    ),
    _s(
        "requests_waiting",
        "gauge",
        "count",
        "Requests queued for admission (vllm:num_requests_waiting).",
        "moptd_serving_requests_waiting",
    ),
    _s(
        "kv_cache_usage",
        "gauge",
        "ratio",
        "Share of KV-cache blocks in use, 0-1 (vllm:kv_cache_usage_perc, itself 0-1).",
        "moptd_serving_kv_cache_usage_ratio",
    ),
    _s(
        "preemptions",
        "counter",
        "count",
        "Requests preempted for lack of KV-cache space (vllm:num_preemptions_total).",
        "moptd_serving_preemptions_total",
    ),
    _s(
        "generation_tokens",
        "counter",
        "count",
        "Tokens generated (vllm:generation_tokens_total).",
        "moptd_serving_generation_tokens_total",
    ),
    _s(
        "requests_finished",
        "counter",
        "count",
        "Requests finished, by reason: stop, length, abort, error (vllm:request_success_total).",
        "moptd_serving_requests_finished_total",
        ("finished_reason",),
    ),
    _s(
        "ttft",
        "gauge",
        "seconds",
        "Time to first token over the collector's quantile window, by quantile (0.5, 0.9, "
        "0.99), from vllm:time_to_first_token_seconds. For rules and explain; Prometheus gets "
        "the histogram (serving.time_to_first_token).",
        None,
        ("quantile",),
    ),
    _s(
        "queue_time",
        "gauge",
        "seconds",
        "Time requests spent queued over the collector's quantile window, by quantile (0.5, "
        "0.9, 0.99), from vllm:request_queue_time_seconds. For rules and explain; Prometheus "
        "gets the histogram (serving.request_queue_time).",
        None,
        ("quantile",),
    ),
    _s(
        "e2e_latency",
        "gauge",
        "seconds",
        "End-to-end request latency over the collector's quantile window, by quantile (0.5, "
        "0.9, 0.99), from vllm:e2e_request_latency_seconds. For rules and explain; Prometheus "
        "gets the histogram (serving.e2e_request_latency).",
        None,
        ("quantile",),
    ),
    _s(
        "info",
        "info",
        "",
        "Serving endpoint identity; value 1.",
        "moptd_serving_info",
        ("engine", "version", "model", "endpoint"),
    ),
    _s(
        "gpu",
        "info",
        "",
        "1 for each GPU the managed serving process may use, as its CUDA_VISIBLE_DEVICES "
        "names them: a GPU UUID (or its prefix), or an index where CUDA_DEVICE_ORDER is "
        "PCI_BUS_ID (CUDA's default order need not be NVML's). Join GPU series on "
        "(instance, gpu) to put them next to the serving endpoint.",
        "moptd_serving_gpu_info",
        ("gpu",),
    ),
    _s(
        "process",
        "info",
        "",
        "1 for each process of the managed serving process's tree (its process group): "
        "with NVML's process list (moptd_gpu_process_memory_used_bytes) it says which GPUs "
        "the engine runs on.",
        "moptd_serving_process_info",
        ("pid",),
    ),
]


def _h(name: str, what: str, sources: str, metric: str) -> SignalSpec:
    return _s(
        name,
        "histogram",
        "seconds",
        f"{what}: the engine's own cumulative histogram, its buckets passed through (summed "
        f"over data-parallel ranks), from {sources}. Resets when the engine restarts; "
        "aggregate with histogram_quantile(q, sum by (le) (rate(..._bucket[5m]))).",
        metric,
    )


# The engines' latency histograms as Prometheus histograms, which a fleet can aggregate
# across hosts (the quantile gauges above cannot be); the vLLM names, moptd_serving_ prefixed.
SIGNALS += [
    _h(
        "time_to_first_token",
        "Time to first token",
        "vllm:time_to_first_token_seconds, sglang:time_to_first_token_seconds, "
        "trtllm_time_to_first_token_seconds",
        "moptd_serving_time_to_first_token_seconds",
    ),
    _h(
        "inter_token_latency",
        "Time between two output tokens of a request",
        "vllm:inter_token_latency_seconds (vllm:time_per_output_token_seconds before 0.15), "
        "sglang:inter_token_latency_seconds, trtllm_time_per_output_token_seconds",
        "moptd_serving_inter_token_latency_seconds",
    ),
    _h(
        "request_queue_time",
        "Time a request waited before the engine scheduled it",
        "vllm:request_queue_time_seconds, sglang:queue_time_seconds, "
        "trtllm_request_queue_time_seconds",
        "moptd_serving_request_queue_time_seconds",
    ),
    _h(
        "e2e_request_latency",
        "End-to-end request latency",
        "vllm:e2e_request_latency_seconds, sglang:e2e_request_latency_seconds, "
        "trtllm_e2e_request_latency_seconds",
        "moptd_serving_e2e_request_latency_seconds",
    ),
]


def _e(name: str, help: str, fields: tuple[str, ...]) -> SignalSpec:
    return SignalSpec(f"serving.{name}", "event", "", help, "serving", None, (), "", fields)


# Signals of the serving collector and the managed serving process (issue 6).
SIGNALS += [
    _s(
        "requests_waiting_by_reason",
        "gauge",
        "count",
        "Waiting requests by reason: capacity (no room in the batch or KV cache) or deferred "
        "(LoRA budget, KV transfer) (vllm:num_requests_waiting_by_reason).",
        "moptd_serving_requests_waiting_by_reason",
        ("reason",),
    ),
    _s(
        "prompt_tokens",
        "counter",
        "count",
        "Prompt tokens processed, cached ones included (vllm:prompt_tokens_total).",
        "moptd_serving_prompt_tokens_total",
    ),
    _s(
        "engine_steps",
        "counter",
        "count",
        "Engine steps that produced output (vllm:iteration_tokens_total_count); stops rising "
        "when the scheduler hangs.",
        "moptd_serving_engine_steps_total",
    ),
    _s(
        "itl",
        "gauge",
        "seconds",
        "Inter-token latency over the collector's quantile window, by quantile (0.5, 0.9, "
        "0.99), from vllm:inter_token_latency_seconds (vllm:time_per_output_token_seconds "
        "before 0.15). For rules and explain; Prometheus gets the histogram "
        "(serving.inter_token_latency).",
        None,
        ("quantile",),
    ),
    _s(
        "engine_metrics_present",
        "gauge",
        "bool",
        "1 when /metrics carries the engine's own series; 0 when only HTTP/process series "
        "are there (vLLM --disable-log-stats), so engine-based rules have no evidence.",
        "moptd_serving_engine_metrics_present",
    ),
    _s(
        "kv_cache_capacity_tokens",
        "gauge",
        "count",
        "KV-cache capacity in tokens (cache_config_info kv_cache_size_tokens, or the start-up "
        "log line).",
        "moptd_serving_kv_cache_capacity_tokens",
    ),
    _s(
        "kv_cache_max_concurrency",
        "gauge",
        "",
        "Requests of the maximum length the KV cache can hold at once (start-up log line).",
        "moptd_serving_kv_cache_max_concurrency",
    ),
    _s(
        "max_num_seqs",
        "gauge",
        "count",
        "The engine's batch limit (--max-num-seqs from the managed command line).",
        "moptd_serving_max_num_seqs",
    ),
    _s(
        "gpu_memory_utilization",
        "gauge",
        "ratio",
        "Share of GPU memory the engine was told to take (vLLM gpu_memory_utilization); vLLM "
        "takes it on purpose for its KV cache, so high GPU memory use alone is not a finding.",
        "moptd_serving_gpu_memory_utilization_ratio",
    ),
    _s(
        "probe_success",
        "gauge",
        "bool",
        "1 when the probe passed on its last try: health (/health), models (/v1/models), "
        "generate (a one-token completion within its deadline).",
        "moptd_serving_probe_success",
        ("probe",),
    ),
    _s(
        "probe_latency",
        "gauge",
        "seconds",
        "How long the probe's last try took.",
        "moptd_serving_probe_latency_seconds",
        ("probe",),
    ),
    _s(
        "scrape_duration",
        "gauge",
        "seconds",
        "How long the last /metrics scrape and parse took.",
        "moptd_serving_scrape_duration_seconds",
    ),
    _s(
        "scrape_failures",
        "counter",
        "count",
        "Failed /metrics scrapes (refused, timed out, too large, not the text format).",
        "moptd_serving_scrape_failures_total",
    ),
    _s(
        "api_cpu_seconds",
        "counter",
        "seconds",
        "CPU time of the engine's API-server process (process_cpu_seconds_total on its "
        "/metrics; absent with several API servers).",
        "moptd_serving_api_server_cpu_seconds_total",
    ),
    _s(
        "busiest_process_cpu",
        "gauge",
        "ratio",
        "CPU use of the busiest process of the managed serving process tree, as a share of one "
        "core (the engine loop is one Python thread: near 1 means CPU bound).",
        "moptd_serving_busiest_process_cpu_ratio",
    ),
    _s(
        "process_up",
        "gauge",
        "bool",
        "1 while the managed serving process runs.",
        "moptd_serving_process_up",
    ),
    _s(
        "starting",
        "gauge",
        "bool",
        "1 while the managed serving process runs but has not said it listens yet (model "
        "loading, warm-up); probes failing then are not an outage.",
        "moptd_serving_starting",
    ),
    _s(
        "stopping",
        "gauge",
        "bool",
        "1 while moptd itself stops the managed serving process (a stop, an operator's or a "
        "remedy's restart): its probes failing then are the stop, not a fault.",
        "moptd_serving_stopping",
    ),
    _s(
        "restarts",
        "counter",
        "count",
        "Restarts of the managed serving process by moptd.",
        "moptd_serving_restarts_total",
    ),
    _s(
        "crash_loop",
        "gauge",
        "bool",
        "1 when the managed serving process failed too often in a row and moptd stopped "
        "restarting it.",
        "moptd_serving_crash_loop",
    ),
    _s(
        "cuda_graphs_enabled",
        "gauge",
        "bool",
        "0 when the serving log says CUDA graphs are off (Enforce eager set, cudagraph mode "
        "NONE); 1 when graph capture finished.",
        "moptd_serving_cuda_graphs_enabled",
    ),
    _s(
        "log_stats_age",
        "gauge",
        "seconds",
        "Seconds since the engine's last periodic stats log line (vLLM logs one every 10 s "
        "while busy, and stops when the engine hangs).",
        "moptd_serving_log_stats_age_seconds",
    ),
    _s(
        "model_tokenizer_present",
        "gauge",
        "bool",
        "1 when the model directory has tokenizer files (tokenizer.json, tokenizer.model, "
        "vocab files).",
        "moptd_serving_model_tokenizer_present",
    ),
    _s(
        "model_unsafe_weights",
        "gauge",
        "bool",
        "1 when the model directory's weights are only in pickle formats (.bin/.pt/.pth), "
        "not safetensors.",
        "moptd_serving_model_unsafe_weights",
    ),
    _e(
        "log_stats",
        "The engine's periodic stats log line (vLLM loggers.py, V0 metrics.py, SGLang decode "
        "batch); preemptions are those of the interval (vLLM >= 0.15), swapped V0's requests "
        "swapped out to the CPU.",
        (
            "engine",
            "prompt_tps",
            "gen_tps",
            "running",
            "waiting",
            "preemptions",
            "kv_usage",
            "swapped",
        ),
    ),
    _e(
        "preemption",
        "vLLM V0's preemption warning (the first and every 50th preemption): mode recompute "
        "or swap, total the engine's cumulative count.",
        ("mode", "total"),
    ),
    _e(
        "engine_dead",
        "An engine-death line: EngineDeadError, EngineCore fatal error, worker died "
        "(kind says which). Not recorded while moptd itself stops the process.",
        ("kind",),
    ),
    _e(
        "unclassified_error",
        "An error record no pattern of moptd's classifies (a record at ERROR/CRITICAL/FATAL "
        "or a Python traceback's final line) and no emitter catalog calls benign: emitter, "
        "level, file (the emitter's logger or source file), message (the quote), distinct "
        "(distinct messages so far) and messages (the most frequent ones quoted with their "
        "counts, bounded). Never from an access-log or request-log record.",
        ("emitter", "level", "file", "message", "distinct", "messages"),
    ),
    _e(
        "cuda_oom",
        "A CUDA out-of-memory message: form pytorch (the caching allocator's, its numbers in "
        "bytes; reserved_unallocated_share is reserved-but-unallocated over all PyTorch "
        "reserved), cuda_runtime (CUDA error: out of memory), tensorrt_llm, tensorrt or "
        "onnxruntime_arena (ONNX Runtime's arena could not grow); the "
        "numbers a form does not print read -1. other_process_bytes: what the other processes "
        "on the GPU hold, counted only where PyTorch also printed its own line (else -1: a "
        "'Process N' may be the failing process itself, seen from a container); holders: "
        "those processes, largest first (pid and size as printed).",
        (
            "form",
            "gpu",
            "requested_bytes",
            "total_bytes",
            "free_bytes",
            "allocated_bytes",
            "reserved_unallocated_bytes",
            "private_pool_bytes",
            "process_bytes",
            "other_process_bytes",
            "holders",
            "reserved_unallocated_share",
        ),
    ),
    _e(
        "cuda_error",
        "A CUDA error in the serving log that is no OOM: illegal_address (an illegal memory "
        "access), no_kernel_image / arch_not_in_build (the build lacks this GPU's "
        "architecture), driver_too_old (driver older than the CUDA runtime), "
        "system_not_ready (CUDA error 802: the NVLink fabric is not initialised), "
        "trt_engine_version / trt_engine_device / trt_plugin_missing (a TensorRT engine built "
        "for another TensorRT, GPU or plugin set), trt_deserialize_failed (the plan was "
        "refused, reason elsewhere), trt_not_a_plan (the file is no plan); built and runtime: "
        "what the plan or binary was built for and what this host runs, where the line says.",
        ("kind", "built", "runtime"),
    ),
    _e(
        "cuda_graphs",
        "CUDA-graph state from the log: disabled (enforce eager, mode NONE) or captured.",
        ("state", "reason", "memory_bytes"),
    ),
    _e(
        "hang",
        "A hang symptom in the log: watchdog stack dump, shm_broadcast wait, NCCL or RPC timeout; "
        "phase loading when printed while the engine was still starting, else serving.",
        ("kind", "seconds", "phase"),
    ),
    _e(
        "startup_error",
        "A start-up failure in the log: tokenizer, port_in_use, oom_on_load, kv_no_memory (no "
        "memory left for KV-cache blocks), kv_too_small (the KV cache holds less than one "
        "max_model_len sequence), gpu_memory_taken (other processes hold the GPU memory the "
        "engine's budget needs), max_model_len_too_long (above the model's own context), "
        "quantization_unsupported (the checkpoint's quantization needs a newer GPU); "
        "internal_port_in_use when 'Address "
        "already in use' came from an internal port (vLLM's get_open_port, torch.distributed's "
        "store), not the serving port.",
        ("kind",),
    ),
    _e(
        "request_error",
        "Requests refused while the server stays up, from the serving log: kind "
        "chat_template_missing (the tokenizer has no chat template and none was given).",
        ("kind",),
    ),
    _e(
        "kv_capacity",
        "The start-up KV-cache capacity line.",
        ("tokens", "max_concurrency", "tokens_per_request"),
    ),
    _e(
        "lifecycle",
        "The server's phase from its log: kind loading (weights, compilation, profiling), "
        "server_started (listening) or shutdown_requested.",
        ("kind",),
    ),
    _e("version", "The engine version the log announced.", ("version",)),
    _e(
        "process_exit",
        "The managed serving process exited; expected is false when moptd did not ask it to "
        "stop (an exit with status 0 then is a failure too).",
        ("exit_code", "signal", "expected"),
    ),
    _e(
        "ep_fallback",
        "An ONNX Runtime execution-provider line (moptd/serving/onnxruntime.py): kind "
        "create_failed (Failed to create CUDAExecutionProvider), library_missing (the provider "
        "library did not load; library is the shared object not found), retry (EP Error, "
        "Falling back to [...]) or applied (the session's providers); to is cpu when the "
        "session is left with the CPU provider alone, gpu when a GPU provider remains.",
        ("provider", "kind", "to", "library"),
    ),
    _e(
        "gate",
        "A pre-start gate refused to start the managed serving process; code is the "
        "diagnosis code (PORT_CONFLICT, TOKENIZER_MISSING, ...).",
        ("code", "check", "reason"),
    ),
]
