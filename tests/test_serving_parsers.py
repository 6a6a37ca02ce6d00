"""Parsers of the serving layer: Prometheus text, engine name mapping, histograms, the
PyTorch OOM message and the engine log lines. Real captures first, hypothesis for the rest."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moptd.serving.engines import detect_engine, view_from_samples, view_from_trtllm_stats
from moptd.serving.histogram import Histogram, histogram_quantile
from moptd.serving.logparse import LogState, parse_line
from moptd.serving.logring import LineSplitter, LogRing
from moptd.serving.oom import GIB, parse_oom, parse_size
from moptd.serving.promtext import PromParseError, PromSample, parse, parse_labels
from tests.conftest import FIXTURES

VLLM = FIXTURES / "vllm-cpu"


def page(name: str) -> str:
    return (VLLM / name).read_text()


# --- Prometheus text ---------------------------------------------------------------


def test_real_vllm_page_parses_with_colon_names() -> None:
    samples = parse(page("vllm_cpu_metrics_load.txt"))
    names = {s.name for s in samples}
    assert "vllm:num_requests_running" in names
    assert "vllm:iteration_tokens_total_count" in names
    running = next(s for s in samples if s.name == "vllm:num_requests_running")
    assert running.value == 8.0
    assert dict(running.labels) == {"engine": "0", "model_name": "tinyllama"}


def test_same_samples_as_prometheus_client() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = page("vllm_0.33.0_metrics_sample_synthetic.txt")
    theirs = {
        (s.name, tuple(sorted(s.labels.items())))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    ours = {(s.name, s.labels) for s in parse(text)}
    assert ours == theirs


@pytest.mark.parametrize(
    "bad",
    [
        'vllm:x{engine="0" 1\n',
        "<html>502 Bad Gateway</html>",
        "vllm:x 1.0abc",
        "{} 1",
        'x{a="1",,b} 2',
    ],
)
def test_garbage_is_a_parse_error_naming_the_line(bad: str) -> None:
    with pytest.raises(PromParseError) as err:
        parse("# HELP fine\nok 1\n" + bad)
    assert err.value.line == 3


def test_special_values_and_timestamps() -> None:
    s = parse('a{le="+Inf"} +Inf\nb NaN\nc -Inf 1700000000000\nd 1e3')
    assert s[0].value == math.inf
    assert math.isnan(s[1].value)
    assert s[2].value == -math.inf
    assert s[3].value == 1000.0


_label_value = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_label_name = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True)
_metric_name = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,30}", fullmatch=True)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@given(
    st.lists(
        st.tuples(
            _metric_name,
            st.dictionaries(_label_name, _label_value, max_size=4),
            st.floats(allow_nan=False, width=64),
        ),
        max_size=20,
    )
)
def test_round_trip(items: list[tuple[str, dict[str, str], float]]) -> None:
    lines = []
    for name, labels, value in items:
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {value!r}" if labels else f"{name} {value!r}")
    got = parse("\n".join(lines))
    assert got == [PromSample(n, tuple(sorted(lab.items())), v) for n, lab, v in items]


@given(st.text(max_size=300))
def test_any_text_parses_or_is_a_parse_error(text: str) -> None:
    try:
        parse(text)
    except PromParseError:
        pass


@given(st.text(max_size=100))
def test_label_parser_never_crashes(text: str) -> None:
    try:
        parse_labels(text)
    except PromParseError:
        pass


# --- engine mapping --------------------------------------------------------------------


def test_vllm_load_page_view() -> None:
    view = view_from_samples(parse(page("vllm_cpu_metrics_load.txt")))
    assert view.scalars["running"] == 8
    assert view.scalars["waiting"] == 12
    assert view.by_label["waiting_by_reason"] == {"capacity": 12.0, "deferred": 0.0}
    assert view.scalars["kv_usage"] == pytest.approx(0.8205, abs=1e-4)
    assert view.scalars["steps"] > 0
    assert view.model == "tinyllama"
    assert view.cache_config["num_gpu_blocks"] == "40"
    assert view.cache_config["kv_cache_size_tokens"] == "5120"
    assert view.histograms["ttft"].count == view.histograms["ttft"].buckets[math.inf]
    assert view.engine_series > 100


def test_vllm_after_load_counters_kept_gauges_zero() -> None:
    load = view_from_samples(parse(page("vllm_cpu_metrics_load.txt")))
    after = view_from_samples(parse(page("vllm_cpu_metrics_after_load.txt")))
    assert after.scalars["running"] == 0
    assert after.scalars["generation_tokens"] > load.scalars["generation_tokens"]
    assert sum(after.by_label["finished"].values()) == 20 + sum(load.by_label["finished"].values())


def test_disable_log_stats_page_has_no_engine_series() -> None:
    text = "\n".join(
        line
        for line in page("vllm_cpu_metrics_idle.txt").splitlines()
        if not line.startswith("vllm:")
    )
    view = view_from_samples(parse(text))
    assert view.engine_series == 0
    assert "running" not in view.scalars
    assert "process_cpu_seconds" in view.scalars


def test_old_vllm_names_map_onto_new_fields() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 10\n'
        'vllm:time_per_output_token_seconds_bucket{le="0.1",model_name="m"} 3\n'
        'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 4\n'
    )
    view = view_from_samples(parse(text))
    assert view.scalars["kv_usage"] == 0.5
    assert view.scalars["prefix_queries"] == 10
    assert view.histograms["itl"].count == 4


def test_new_name_wins_over_old() -> None:
    text = "vllm:gpu_cache_usage_perc 0.5\nvllm:kv_cache_usage_perc 0.25\n"
    assert view_from_samples(parse(text)).scalars["kv_usage"] == 0.25


def test_underscore_escaped_names_are_understood() -> None:
    text = page("vllm_cpu_metrics_load.txt").replace("\nvllm:", "\nvllm_")
    view = view_from_samples(parse(text))
    assert view.scalars["running"] == 8


def test_data_parallel_ranks_add_up_kv_takes_max() -> None:
    text = (
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 4\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.9\n'
    )
    view = view_from_samples(parse(text))
    assert view.scalars["running"] == 7
    assert view.scalars["kv_usage"] == 0.9


def test_sglang_names() -> None:
    text = (
        'sglang:num_running_reqs{model_name="m",tp_rank="0"} 5\n'
        'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2\n'
        'sglang:token_usage{model_name="m",tp_rank="0"} 0.97\n'
        'sglang:num_retracted_requests_total{model_name="m"} 11\n'
        'sglang:generation_tokens_total{model_name="m"} 1000\n'
        'sglang:num_requests_total{model_name="m"} 50\n'
        'sglang:num_aborted_requests_total{model_name="m"} 3\n'
        'sglang:is_cuda_graph{model_name="m"} 1\n'
    )
    samples = parse(text)
    assert detect_engine(samples) == "sglang"
    view = view_from_samples(samples)
    assert (view.scalars["running"], view.scalars["waiting"]) == (5, 2)
    assert view.scalars["kv_usage"] == 0.97
    assert view.scalars["preemptions"] == 11
    assert view.by_label["finished"] == {"stop": 47.0, "abort": 3.0}


def test_trtllm_prometheus_and_json() -> None:
    text = (
        'trtllm_request_success_total{finished_reason="stop",model_name="m"} 9\n'
        'trtllm_kv_cache_utilization{model_name="m"} 0.4\n'
        'trtllm_time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 9\n'
        'trtllm_time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 9\n'
        'trtllm_time_to_first_token_seconds_count{model_name="m"} 9\n'
    )
    view = view_from_samples(parse(text))
    assert view.by_label["finished"] == {"stop": 9.0}
    assert view.histograms["ttft"].quantile(0.5) == pytest.approx(0.25)
    stats = [
        {"iter": 10, "numActiveRequests": 1, "numQueuedRequests": 0},
        {
            "iter": 11,
            "numActiveRequests": 4,
            "numQueuedRequests": 2,
            "gpuMemUsage": 123,
            "kvCacheStats": {"usedNumBlocks": 30, "maxNumBlocks": 40, "freeNumBlocks": 10},
        },
    ]
    jv = view_from_trtllm_stats(json.dumps(stats).encode())
    assert jv.scalars["running"] == 4
    assert jv.scalars["waiting"] == 2
    assert jv.scalars["kv_usage"] == 0.75
    assert jv.scalars["steps_since_last"] == 2
    with pytest.raises(ValueError, match="JSON list"):
        view_from_trtllm_stats(b'{"x": 1}')


# --- histograms -------------------------------------------------------------------------


def test_quantile_interpolates_like_prometheus() -> None:
    buckets = {0.1: 10.0, 0.5: 20.0, 1.0: 40.0, math.inf: 40.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.5)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.75)
    assert histogram_quantile(0.99, {1.0: 1.0, math.inf: 5.0}) == 1.0  # +Inf bucket
    assert histogram_quantile(0.5, {1.0: 0.0, math.inf: 0.0}) is None


def test_window_difference_and_reset() -> None:
    a = Histogram({1.0: 5, math.inf: 5}, 5, 2.5)
    b = Histogram({1.0: 5, 2.0: 0, math.inf: 9}, 9, 20)
    d = b.minus(a)
    assert d.count == 4
    assert d.buckets[math.inf] == 4
    restarted = Histogram({1.0: 1, math.inf: 1}, 1, 0.5)
    assert restarted.minus(a) is restarted


@given(
    st.lists(st.integers(0, 100), min_size=1, max_size=10),
    st.floats(0, 1),
)
def test_quantile_stays_within_the_bounds(counts: list[int], q: float) -> None:
    bounds = [0.5 * (i + 1) for i in range(len(counts))]
    cum, total = {}, 0
    for le, c in zip(bounds, counts, strict=True):
        total += c
        cum[le] = float(total)
    cum[math.inf] = float(total)
    v = histogram_quantile(q, cum)
    if total == 0:
        assert v is None
    else:
        assert v is not None
        assert 0.0 <= v <= bounds[-1]


# --- PyTorch OOM --------------------------------------------------------------------------


def test_real_fragmentation_oom() -> None:
    oom = parse_oom((FIXTURES / "h200" / "oom_fragmentation.txt").read_text())
    assert oom is not None
    assert oom.requested == 40 * GIB
    assert oom.total == pytest.approx(139.80 * GIB)
    assert oom.free == pytest.approx(9.12 * 2**20)
    assert oom.this_process == pytest.approx(139.78 * GIB)
    assert oom.allocated == pytest.approx(48.75 * GIB)
    assert oom.reserved_unallocated == pytest.approx(90.53 * GIB)
    # 90.53 of the 139.28 GiB PyTorch reserved is stranded: the rule's "large share"
    assert oom.reserved_unallocated_share == pytest.approx(90.53 / (48.75 + 90.53), abs=1e-3)
    assert oom.fields()["form"] == "pytorch"


def test_real_plain_oom() -> None:
    oom = parse_oom((FIXTURES / "h200" / "oom_plain.txt").read_text())
    assert oom is not None
    assert oom.requested == 200 * GIB
    assert oom.reserved_unallocated == 0
    assert oom.allocated == 0
    assert oom.reserved_unallocated_share == 0.0


def test_private_pools_other_processes_and_allowed() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a "
        "total capacity of 79.19 GiB of which 1.50 GiB is free. Process 4242 has 10.00 GiB "
        "memory in use. Including non-PyTorch memory, this process has 67.00 GiB memory in use. "
        "70.00 GiB allowed; Of the allocated memory 60.00 GiB is allocated by PyTorch, with "
        "8.00 GiB allocated in private pools (e.g., CUDA Graphs), and 512.00 MiB is reserved "
        "by PyTorch but unallocated. If reserved ..."
    )
    oom = parse_oom(text)
    assert oom is not None
    assert oom.gpu == 1
    assert oom.other_processes == 10 * GIB
    assert oom.private_pools == 8 * GIB
    assert oom.allowed == 70 * GIB
    assert oom.reserved_unallocated_share == pytest.approx(0.5 / 60.5)


def test_other_processes_are_counted_only_beside_pytorchs_own_line() -> None:
    incidents = FIXTURES / "incidents"
    # terraform-vss: PyTorch printed its own line, so the three "Process N" are others
    vss = parse_oom(
        (
            incidents
            / "trtllm-executor-init-oom-three-other-processes-compose/serving/trtllm/log.txt"
        ).read_text()
    )
    assert vss is not None
    assert vss.this_process == pytest.approx(12.90 * GIB)
    assert vss.other_processes == pytest.approx(1.08 * GIB + 468 * 2**20 + 26.06 * 2**20)
    assert vss.holders == "pid 238746 1.08 GiB, pid 244515 468.00 MiB, pid 244271 26.06 MiB"
    # vllm#2140: a lone "Process N" holding what PyTorch reserved is the process itself, seen
    # from a container: who else holds memory is unknown
    own = parse_oom(
        (incidents / "vllm-v0-oom-pid-is-own-process-in-container/serving/vllm/log.txt").read_text()
    )
    assert own is not None
    assert own.this_process is None
    assert own.other_processes == -1.0
    assert own.holders == ""


def test_onnxruntimes_arena_failure_is_an_oom_without_numbers() -> None:
    # onnxruntime#9939 (8 GB buffer on a V100-16GB) and #20038 (Triton's ONNX Runtime
    # backend on a T4 serving seven other models): the arena's text says no "out of memory"
    for bundle, engine in (
        ("onnxruntime-cuda-arena-8gib-buffer-v100-16gb", "onnxruntime"),
        ("triton-onnxruntime-arena-oom-eighth-model-t4", "triton"),
    ):
        line = (FIXTURES / "incidents" / bundle / "serving" / engine / "log.txt").read_text()
        rec = parse_line(line.splitlines()[0])
        assert rec is not None, bundle
        assert (rec.stream, rec.fields["form"]) == ("serving.cuda_oom", "onnxruntime_arena")
        assert rec.fields["requested_bytes"] == -1.0


def test_legacy_and_transitional_formats() -> None:
    legacy = (
        "RuntimeError: CUDA out of memory. Tried to allocate 74.00 MiB (GPU 0; 10.76 GiB "
        "total capacity; 9.47 GiB already allocated; 62.44 MiB free; 9.83 GiB reserved in "
        "total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb"
    )
    oom = parse_oom(legacy)
    assert oom is not None
    assert oom.reserved_unallocated == pytest.approx(0.36 * GIB)
    # 0.36 of 9.83 GiB reserved: not "reserved >> allocated", the old message's own test
    assert oom.reserved_unallocated_share == pytest.approx(0.36 / 9.83, abs=1e-3)
    typo = (
        "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacty of 23.69 GiB "
        "of which 7.11 GiB is free. Process 2006998 has 256.00 MiB memory in use. Including "
        "non-PyTorch memory, this process has 16.31 GiB memory in use. Of the allocated memory "
        "16.01 GiB is allocated by PyTorch, and 7.47 MiB is reserved by PyTorch but unallocated."
    )
    oom2 = parse_oom(typo)
    assert oom2 is not None
    assert oom2.requested == 8 * GIB
    assert oom2.reserved_unallocated_share < 0.001


_size = st.tuples(
    st.floats(0, 1023.99, allow_nan=False).map(lambda f: round(f, 2)),
    st.sampled_from(["KiB", "MiB", "GiB"]),
)


def _fmt(s: tuple[float, str]) -> str:
    return f"{s[0]:.2f} {s[1]}"


@given(_size, _size, _size, _size, _size, st.integers(0, 15))
def test_current_format_round_trip(req, total, free, alloc, unalloc, gpu) -> None:  # type: ignore[no-untyped-def]
    text = (
        f"CUDA out of memory. Tried to allocate {_fmt(req)}. GPU {gpu} has a total capacity of "
        f"{_fmt(total)} of which {_fmt(free)} is free. Of the allocated memory {_fmt(alloc)} is "
        f"allocated by PyTorch, and {_fmt(unalloc)} is reserved by PyTorch but unallocated."
    )
    oom = parse_oom(text)
    assert oom is not None
    assert oom.gpu == gpu
    assert oom.requested == pytest.approx(parse_size(_fmt(req)))
    assert oom.reserved_unallocated == pytest.approx(parse_size(_fmt(unalloc)))
    share = oom.reserved_unallocated_share
    assert 0.0 <= share <= 1.0
    reserved = oom.allocated + oom.reserved_unallocated
    assert share == (pytest.approx(oom.reserved_unallocated / reserved) if reserved else 0.0)


@given(st.text(max_size=400))
def test_oom_parser_never_crashes(text: str) -> None:
    parse_oom("CUDA out of memory. " + text)


# --- log lines -----------------------------------------------------------------------------


def test_real_vllm_log() -> None:
    streams: dict[str, int] = {}
    state = LogState()
    for line in (VLLM / "vllm_cpu_server_log.txt").read_text().splitlines():
        rec = parse_line(line)
        if rec is not None:
            streams[rec.stream] = streams.get(rec.stream, 0) + 1
            state.update(rec, 1.0)
    assert streams["serving.log_stats"] == 6
    assert streams["serving.cuda_graphs"] == 2
    assert streams["serving.kv_capacity"] == 1
    assert state.kv_tokens == 5120
    assert state.max_concurrency == 10.0
    assert state.cuda_graphs == "disabled"
    assert state.version == "0.32.0"
    assert state.started
    # the shutdown after SIGTERM prints EngineDeadError; the readers ignore it after the
    # "shutdown triggered" line (section 1 of the capture ends in the same shutdown)
    # (each twice: "AsyncLLM output_handler failed." and the EngineDeadError final line; the
    # first was missed before the parsers read the message without its prefix)
    assert streams["serving.engine_dead"] == 4
    assert state.shutting_down


def test_stats_line_fields() -> None:
    line = (
        "(APIServer pid=19622) INFO 11-29 16:30:39 [loggers.py:335] Engine 000: Avg prompt "
        "throughput: 9.7 tokens/s, Avg generation throughput: 245.7 tokens/s, Running: 8 reqs, "
        "Waiting: 12 reqs, Preemptions: 3, GPU KV cache usage: 61.5%, Prefix cache hit rate: 0.0%"
    )
    rec = parse_line(line)
    assert rec is not None
    assert rec.fields["running"] == 8
    assert rec.fields["waiting"] == 12
    assert rec.fields["preemptions"] == 3
    assert rec.fields["kv_usage"] == pytest.approx(0.615)


@pytest.mark.parametrize(
    ("line", "stream", "kind"),
    [
        (
            "(EngineCore_DP0 pid=9) ERROR 01-02 03:04:05 [core.py:1586] EngineCore encountered a "
            "fatal error.",
            "serving.engine_dead",
            "engine_core_fatal",
        ),
        (
            "(Worker_TP1 pid=9) ERROR 01-02 03:04:05 [multiproc_executor.py:380] Worker proc "
            "VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.",
            "serving.engine_dead",
            "worker_died",
        ),
        (
            "(EngineCore pid=1) INFO 01-02 03:04:05 [watch_dog.py:92] [Watchdog]Dumped stack to "
            "/tmp/d/VLLM_STACK_DUMP_for_engine_0_1.log due to feed timeout",
            "serving.hang",
            "watchdog_dump",
        ),
        (
            "WARNING 01-02 03:04:05 [shm_broadcast.py:111] No available shared memory broadcast "
            "block found in 60 seconds. This typically happens when some processes are hanging",
            "serving.hang",
            "shm_broadcast",
        ),
        (
            "[rank0]:[E102 03:04:05] [PG ID 0 PG GUID 0 Rank 0] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds",
            "serving.hang",
            "nccl_timeout",
        ),
        (
            "OSError: Can't load tokenizer for '/models/x'. If you were trying to load it",
            "serving.startup_error",
            "tokenizer",
        ),
        (
            "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): "
            "address already in use",
            "serving.startup_error",
            "port_in_use",
        ),
        (
            "(EngineCore pid=1) INFO 01-02 03:04:05 [vllm.py:2005] Cudagraph is disabled under "
            "eager mode",
            "serving.cuda_graphs",
            None,
        ),
    ],
)
def test_failure_lines(line: str, stream: str, kind: str | None) -> None:
    rec = parse_line(line)
    assert rec is not None
    assert rec.stream == stream
    if kind is not None:
        assert rec.fields["kind"] == kind


def test_graph_capture_and_sglang_decode() -> None:
    rec = parse_line(
        "INFO 01-02 03:04:05 [gpu_model_runner.py:6516] Graph capturing finished "
        "in 12 secs, took 0.52 GiB"
    )
    assert rec is not None
    assert rec.fields["state"] == "captured"
    rec = parse_line(
        "[2026-01-01 00:00:00] Decode batch, #running-req: 12, #token: 4000, token "
        "usage: 0.95, cuda graph: True, gen throughput (token/s): 1234.56, "
        "#queue-req: 7"
    )
    assert rec is not None
    assert rec.stream == "serving.log_stats"
    assert (rec.fields["running"], rec.fields["waiting"]) == (12, 7)


def test_oom_in_a_vllm_traceback_line() -> None:
    text = (FIXTURES / "h200" / "oom_plain.txt").read_text().splitlines()[-1]
    rec = parse_line(
        "(Worker_TP0 pid=254) ERROR 01-02 03:04:05 [multiproc_executor.py:1189] " + text
    )
    assert rec is not None
    assert rec.stream == "serving.cuda_oom"
    assert rec.fields["reserved_unallocated_share"] == 0.0


@given(st.text(max_size=500))
def test_log_parser_never_crashes(line: str) -> None:
    parse_line(line)


# --- bounded log handling -------------------------------------------------------------------


@given(st.lists(st.binary(max_size=200), max_size=30), st.integers(4, 64))
def test_line_splitter_bounds_lines(chunks: list[bytes], max_line: int) -> None:
    sp = LineSplitter(max_line)
    lines = []
    for c in chunks:
        lines += sp.feed(c)
    lines += sp.flush()
    assert all(len(line.encode("utf-8", "surrogatepass")) <= 4 * max_line for line in lines)
    data = b"".join(chunks)
    complete = data.count(b"\n")
    assert len(lines) >= complete
    if all(len(p) <= max_line for p in data.split(b"\n")) and b"\r" not in data:
        expected = data.split(b"\n")
        if expected and expected[-1] == b"":
            expected.pop()
        assert lines == [p.decode("utf-8", "replace") for p in expected]


def test_log_ring_is_bounded() -> None:
    ring = LogRing(3)
    for i in range(10):
        ring.append(float(i), str(i))
    assert [line for _, line in ring.tail()] == ["7", "8", "9"]
    assert ring.dropped == 7
    assert ring.total == 10
