"""The record splitter (moptd.serving.logrecord.split_record), the access-log and
request-log exclusion, and error records no pattern classifies (UNCLASSIFIED_ERROR).

Lines are copied from public material: the fixtures' logs (their SOURCE.md names each
address) and the issue threads named beside each constant."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.serving.errorrecords import STREAM
from moptd.serving.logparse import LogState, parse_line
from moptd.serving.logrecord import MAX_SPLIT_CHARS, LogRecord, split_record

FIXTURES = Path(__file__).parent / "fixtures"
# vllm#20170 (tests/fixtures/incidents/vllm-v1-illegal-address-tp-nccl-watchdog)
WATCHDOG = FIXTURES / "incidents/vllm-v1-illegal-address-tp-nccl-watchdog/serving/vllm/log.txt"
# vllm#4108 (opening post): PyTorch's older c10 prefix, no vLLM prefix
OLD_C10 = (
    "[E ProcessGroupNCCL.cpp:916] [Rank 0] NCCL watchdog thread terminated with exception: "
    "CUDA error: an illegal memory access was encountered"
)
# vllm#17098 (opening post): a V0 worker's traceback lines
V0_FRAME = "ERROR 04-15 00:31:11 worker_base.py:574]     self.launch(*args, **kwargs)"
V0_FINAL = (
    "ERROR 04-15 00:31:11 worker_base.py:574] RuntimeError: Triton Error [CUDA]: "
    "an illegal memory access was encountered"
)
# vllm#12474 (turn 2): V0 run by systemd, read back with journalctl
JOURNAL = (
    FIXTURES / "incidents/vllm-v0-journald-engine-process-failed-to-start/serving/vllm/log.txt"
)
JOURNAL_PREFIX = "Jan 28 10:40:07 localhost bash[367371]: "
# vllm#16107 (turn 5): `docker logs --timestamps` in front of V0's records
DOCKER = FIXTURES / "incidents/vllm-v0-startup-debug-waiting-docker-timestamps/serving/vllm/log.txt"
# gpustack#2415 (turn 2): Ray's ActorDiedError text as vLLM's engine core logs it
RAY = FIXTURES / "incidents/vllm-v1-ray-actor-died-engine-core-start/serving/vllm/log.txt"
# vllm#6042 (opening post): a log viewer's bare "  | " column before V0's and PyTorch's records
VIEWER = (
    FIXTURES / "incidents/vllm-v0-tp-worker-died-allreduce-watchdog-log-viewer/serving/vllm/log.txt"
)
# TensorRT-LLM#5389: the PyTorch backend's "[TRT-LLM] [RANK 0] [E]" record
TRTLLM_RANK = FIXTURES / (
    "incidents/trtllm-pytorch-backend-executor-init-gemm-assertion/serving/trtllm/log.txt"
)
# TensorRT-LLM#7706: a traceback pasted from its middle (no "Traceback" line)
HEADLESS = FIXTURES / (
    "incidents/trtllm-serve-executor-worker-returned-error-headless-traceback/serving/trtllm/log.txt"
)
# rhymes-ai/Aria#24: V0 repeats "ERROR" on the line that chains two exceptions
CHAINED = (
    FIXTURES / "incidents/vllm-v0-tp-worker-oom-nvml-zero-bytes-own-process/serving/vllm/log.txt"
)
# flashinfer#362: V0 workers run inside a Ray actor, two process tags in front
RAY_V0 = FIXTURES / (
    "incidents/vllm-v0-ray-flashinfer-workspace-alignedallocator/serving/vllm/log.txt"
)
# sglang#34676: the KV-pool allocator's RuntimeError, fatal to every scheduler rank
SGLANG_KV = (
    FIXTURES / "incidents/sglang-prefill-oom-kv-pool-hybrid-mamba-ranks/serving/sglang/log.txt"
)
# sglang#10408 (description): the request-slot allocator's RuntimeError, quoted by the reporter
SGLANG_SLOTS = (
    "RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for "
    "`--max-running-requests`. self.req_to_token_pool.available_size()=1, num_reqs=2,"
)
# guidance-ai/llgtrt#7: TensorRT's allocator and deserialiser out of memory under TensorRT-LLM
TRT_OOM = FIXTURES / ("incidents/trtllm-engine-68gib-deserialize-oom-llgtrt/serving/trtllm/log.txt")
# nccl#962: a traceback pasted from its middle, then NCCL_DEBUG's WARN lines
NCCL_OOM = FIXTURES / ("incidents/nccl-2181-proxy-calloc-oom-allgather-rank93/serving/app/log.txt")
# nccl#1029: every line behind a multi-node launcher's host column
HOST_COLUMN = FIXTURES / (
    "incidents/nccl-2183-cuda-initialization-error-barrier-pdsh/serving/app/log.txt"
)
# sglang#5762: a scheduler process dying before its own handler (no "Scheduler hit ...")
SCHED_ENOMEM = FIXTURES / (
    "incidents/sglang-scheduler-enomem-faulthandler-h20-tp8/serving/sglang/log.txt"
)
# The access-log shape of vLLM's docs (emitters.md section 4 d, uvicorn's AccessFormatter)
ACCESS = '127.0.0.1:5000 - "{method} {path} HTTP/1.1" {status} Not Found'


def test_vllm_prefixes_split_into_emitter_level_file_message() -> None:
    head = split_record(V0_FINAL)
    assert (head.emitter, head.level, head.logger) == ("vllm", "ERROR", "worker_base.py")
    assert head.message.startswith("RuntimeError: Triton Error")
    lines = WATCHDOG.read_text().splitlines()
    worker = split_record(lines[0])
    assert (worker.emitter, worker.level, worker.logger) == (
        "vllm",
        "ERROR",
        "multiproc_executor.py",
    )
    assert worker.proc == "VllmWorker rank=2 pid=225"
    torch = split_record(next(ln for ln in lines if ln.startswith("[rank2]")))
    assert (torch.emitter, torch.level, torch.logger) == (
        "pytorch",
        "ERROR",
        "ProcessGroupNCCL.cpp",
    )
    assert torch.message.startswith("[PG ID 2 PG GUID 3 Rank 2] Process group watchdog")


def test_the_journal_and_docker_prefixes_are_read_past() -> None:
    lines = JOURNAL.read_text().splitlines()
    frame = split_record(lines[0])
    assert frame.message.startswith('  File "/networkpath/'), frame
    final = split_record(lines[2])
    assert final.message.startswith("RuntimeError: Engine process failed to start"), final
    rec = parse_line(lines[2])
    assert rec is not None
    assert rec.fields["kind"] == "engine_init_failed"
    for line in DOCKER.read_text().splitlines():
        head = split_record(line)
        assert head.emitter == "vllm", line
        assert head.level in ("DEBUG", "INFO", "WARNING"), line
        assert head.stamp.startswith("04-06 00:55:"), line


def test_a_ray_worker_death_under_vllm_is_an_engine_death() -> None:
    line = RAY.read_text().splitlines()[0]
    head = split_record(line)
    assert (head.emitter, head.level, head.logger) == ("vllm", "ERROR", "core.py")
    rec = LogState().record(line)
    assert rec is not None
    assert (rec.stream, rec.fields["kind"]) == ("serving.engine_dead", "ray_actor_died")


def test_a_ray_actors_tag_before_a_v0_workers_tag_is_read_past() -> None:
    lines = RAY_V0.read_text().splitlines()
    final = split_record(lines[1])
    assert (final.emitter, final.level, final.logger) == (
        "vllm",
        "ERROR",
        "multiproc_worker_utils.py",
    )
    assert final.proc == "VllmWorkerProcess pid=1950430"
    assert (
        final.message == "RuntimeError: RuntimeError: Out of workspace memory in AlignedAlloactor"
    )
    # read, the log is no longer silent: its error record is quoted (it was "No findings")
    state = LogState()
    recs = [r for r in map(state.record, lines) if r is not None]
    assert [(r.stream, r.fields.get("message") or r.fields["kind"]) for r in recs] == [
        (STREAM, "RuntimeError: RuntimeError: Out of workspace memory in AlignedAlloactor"),
        # a worker failing a start-up method: the engine does not start
        ("serving.engine_dead", "engine_init_failed"),
    ]


@pytest.mark.parametrize("line", [SGLANG_KV.read_text().splitlines()[0], SGLANG_SLOTS])
def test_sglangs_kv_pool_exhaustion_is_an_engine_death_not_a_cuda_oom(line: str) -> None:
    # it was "No findings": the line has no record prefix and is no CUDA allocation
    rec = LogState().record(line)
    assert rec is not None
    assert (rec.stream, rec.fields["kind"]) == ("serving.engine_dead", "sglang_kv_pool_exhausted")


def test_tensorrts_allocator_out_of_memory_is_a_cuda_oom() -> None:
    # it was quoted as unclassified, and the deserialisation failure after it read as an
    # incompatible engine
    state = LogState()
    recs = [r for r in map(state.record, TRT_OOM.read_text().splitlines()) if r is not None]
    kinds = [(r.stream, r.fields.get("form") or r.fields.get("kind")) for r in recs]
    assert kinds[:3] == [("serving.cuda_oom", "tensorrt")] * 3
    assert ("serving.cuda_error", "trt_deserialize_failed") in kinds
    assert not [k for k in kinds if k[0] == STREAM]


def _read(path: Path) -> list[LogRecord]:
    """The records of a log as the collector reads it: observe, then record, each line."""
    state = LogState()
    out = []
    for line in path.read_text().splitlines():
        state.observe(line)
        rec = state.record(line)
        if rec is not None:
            out.append(rec)
    return out


def _records(path: Path) -> list[tuple[str, object]]:
    return [(r.stream, r.fields.get("form") or r.fields.get("message")) for r in _read(path)]


def test_an_error_ending_in_a_version_is_an_error_and_nccls_cuda_oom_an_oom() -> None:
    # both were "No findings": the DistBackendError read as "NCCL version 2.18.1" announced,
    # NCCL's "Cuda failure 'out of memory'" as nothing
    final = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1296, internal error - please report this issue to the NCCL "
        "developers, NCCL version 2.18.1"
    )
    assert _records(NCCL_OOM) == [
        (STREAM, final),
        ("serving.version", None),  # "NCCL version 2.18.1+cuda12.0" on its own line
        ("serving.cuda_oom", "cuda_runtime"),
    ]


def test_a_launchers_host_column_is_read_past() -> None:
    lines = HOST_COLUMN.read_text().splitlines()
    affinity = split_record(lines[-2])
    assert (affinity.emitter, affinity.level) == ("nccl", "INFO")
    assert [stream for stream, _ in _records(HOST_COLUMN)] == [STREAM]
    # an exception's class or a word before a colon is no host
    for line in ("RuntimeError: CUDA error", "Last error:", "ncclUnhandledCudaError: Call"):
        assert split_record(line).message == line


def test_a_traceback_through_sglangs_scheduler_entry_is_an_engine_death() -> None:
    # it was quoted as unclassified only: the process that died is the scheduler
    recs = _read(SCHED_ENOMEM)
    assert [(r.stream, r.fields["kind"]) for r in recs] == [
        ("serving.engine_dead", "sglang_scheduler")
    ]


def test_a_log_viewers_bare_column_is_read_past() -> None:
    lines = VIEWER.read_text().splitlines()
    died = split_record(lines[0])
    assert (died.emitter, died.level, died.logger) == ("vllm", "ERROR", "multiproc_worker_utils.py")
    rec = parse_line(lines[0])
    assert rec is not None
    assert (rec.stream, rec.fields["kind"]) == ("serving.engine_dead", "worker_died")
    watchdog = split_record(lines[2])
    assert (watchdog.emitter, watchdog.level) == ("pytorch", "ERROR")


def test_trtllm_rank_tagged_records_carry_their_level() -> None:
    line = TRTLLM_RANK.read_text().splitlines()[1]
    head = split_record(line)
    assert (head.emitter, head.level) == ("trtllm", "ERROR")
    assert head.message.startswith("Failed to initialize executor on rank 0: ")


def test_a_traceback_pasted_from_its_middle_still_ends_in_an_error_record() -> None:
    state = LogState()
    messages = [
        state.errors.error_message(split_record(ln)) for ln in HEADLESS.read_text().splitlines()
    ]
    assert [m for m in messages if m] == ["RuntimeError: Executor worker returned error"]
    assert state.errors.frame_file == "proxy.py"


def test_the_line_chaining_two_exceptions_is_no_error_record() -> None:
    state = LogState()
    records = [state.record(ln) for ln in CHAINED.read_text().splitlines()]
    assert [r.stream for r in records if r is not None] == ["serving.cuda_oom"]


def test_pytorch_lines_without_vllm_prefix_are_read() -> None:
    head = split_record(OLD_C10)
    assert (head.emitter, head.level, head.logger) == ("pytorch", "ERROR", "ProcessGroupNCCL.cpp")
    rec = parse_line(OLD_C10)
    assert rec is not None
    assert rec.fields["kind"] == "illegal_address"


def test_access_log_paths_are_never_evidence() -> None:
    for path in (
        "/v1/EngineDeadError",
        "/CUDA out of memory. Tried to allocate 2.00 GiB",
        "/CUDA%20out%20of%20memory",
        "/an illegal memory access was encountered",
        "/NCCL timed out",
        '/x" 200 EngineCore encountered a fatal error',
    ):
        for prefix in ("INFO:     ", "(APIServer pid=8) INFO:     ", "", JOURNAL_PREFIX):
            line = prefix + ACCESS.format(method="GET", path=path, status=404)
            assert split_record(line).user_text, line
            assert parse_line(line) is None, line
            st_ = LogState()
            assert st_.record(line) is None


def test_request_logging_is_never_evidence() -> None:
    line = (
        "INFO 12-05 08:00:00 [logger.py:40] Received request cmpl-1: prompt: "
        "'EngineCore encountered a fatal error. CUDA out of memory.', params: x"
    )
    assert split_record(line).user_text
    assert parse_line(line) is None


def test_a_traceback_on_its_own_is_unclassified_once() -> None:
    state = LogState()
    lines = [
        "Traceback (most recent call last):",
        '  File "/srv/app.py", line 3, in <module>',
        "    main()",
        "RuntimeError: something nobody knows",
    ]
    recs = [r for r in map(state.record, lines) if r is not None]
    assert [r.stream for r in recs] == [STREAM]
    assert recs[0].fields["message"] == "RuntimeError: something nobody knows"
    assert recs[0].fields["file"] == "app.py"


def test_frames_of_a_prefixed_traceback_are_not_error_records() -> None:
    state = LogState()
    assert state.record(V0_FRAME) is None
    rec = state.record(V0_FINAL)
    assert rec is not None
    assert rec.stream == "serving.cuda_error"


def test_pytorchs_cuda_error_suffix_is_benign() -> None:
    state = LogState()
    recs = [state.record(ln) for ln in WATCHDOG.read_text().splitlines()]
    streams = {r.stream for r in recs if r is not None}
    assert STREAM not in streams
    assert "serving.cuda_error" in streams


def test_repeated_messages_are_counted_and_bounded() -> None:
    state = LogState()
    out = None
    for i in range(200):
        out = state.record(f"ERROR 12-05 08:00:{i % 60:02d} [x.py:1] odd failure {i % 70}")
    assert out is not None
    assert out.fields["distinct"] == 65.0  # 64 quoted and counted, the rest as "others"
    summary = str(out.fields["messages"])
    assert summary.count('"') == 10  # five quoted
    assert "more distinct" in summary


def test_a_requested_stop_is_not_unclassified() -> None:
    state = LogState()
    state.record("INFO 12-05 08:00:00 [launcher.py:80] Shutting down FastAPI HTTP server.")
    state.shutting_down = True
    assert state.record("ERROR 12-05 08:00:01 [core.py:1] RuntimeError: cancelled") is None


_PREFIXES = st.sampled_from(
    [
        "",
        "(EngineCore_DP0 pid=12) ERROR 12-05 08:00:00 [core.py:1] ",
        "ERROR 04-15 00:31:11 worker_base.py:574] ",
        "[rank0]:[E219 12:00:00.123456789 ProcessGroupNCCL.cpp:629] ",
        "[2026-12-05 08:00:00 TP0] ",
        "INFO:     ",
        "node1:1:2 [0] NCCL WARN ",
        "[06/08/2022-15:28:47] [TRT] [E] ",
        "[TensorRT-LLM][ERROR] ",
        "E1220 01:42:16.589091 100348 model_lifecycle.cc:818] ",
        "\x1b[36m(VllmWorker rank=2 pid=225)\x1b[0m ",
        "(VLLM pid=1950315) (VllmWorkerProcess pid=1950430) ERROR 07-07 13:43:36 x.py:1] ",
        "rdma-test-gpu-worker-1: ",
    ]
)


@settings(max_examples=300, deadline=None)
@given(prefix=_PREFIXES, text=st.text(max_size=300))
def test_split_never_raises_and_keeps_the_message(prefix: str, text: str) -> None:
    line = prefix + text
    head = split_record(line)
    assert len(head.message) <= MAX_SPLIT_CHARS
    clean = "\n" not in text and "\r" not in text and "\x1b" not in text
    if clean and prefix.strip() and not head.user_text:
        assert head.message.rstrip() == text.rstrip()[: len(head.message.rstrip())] or (
            text.rstrip().endswith(head.message.rstrip())
        )


@settings(max_examples=300, deadline=None)
@given(
    path=st.text(st.characters(blacklist_characters="\n\r\x1b"), max_size=200),
    method=st.sampled_from(["GET", "POST", "DELETE", "OPTIONS"]),
    status=st.integers(100, 599),
    prefix=st.sampled_from(
        [
            "INFO:     ",
            "(APIServer pid=8) INFO:     ",
            "WARNING:  ",
            "[2025-09-03 18:33:31] INFO:     ",
            JOURNAL_PREFIX + "INFO:     ",
            "2025-04-06T07:55:55.958207240Z INFO:     ",
        ]
    ),
)
def test_no_access_log_line_is_ever_evidence(
    path: str, method: str, status: int, prefix: str
) -> None:
    line = prefix + ACCESS.format(method=method, path="/" + path, status=status)
    assert parse_line(line) is None
    assert LogState().record(line) is None


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.text(max_size=120), max_size=40))
def test_the_error_tracker_never_raises_and_stays_bounded(lines: list[str]) -> None:
    state = LogState()
    for ln in lines:
        rec = state.record(ln)
        if rec is not None and rec.stream == STREAM:
            assert len(str(rec.fields["message"])) <= 240
    assert len(state.errors.seen) <= 64
