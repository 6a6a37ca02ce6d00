"""Serving logs pasted from public issues (tests/fixtures/serving-paste/): each replayed alone
as a bundle's serving log, with the diagnosis a careful reader of that paste would give."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moptd.bundle import read_bundle
from moptd.diagnose.loader import default_rules_dir
from moptd.diagnose.replay import replay
from moptd.serving.bundle import read_serving_dir
from moptd.serving.logparse import LogState, parse_line, split_prefix
from moptd.serving.oom import bare_oom
from tests.conftest import FIXTURES

PASTE = FIXTURES / "serving-paste"
OOMS = {"CUDA_OOM", "CUDA_OOM_FRAGMENTATION"}


def _bundle(tmp_path: Path, paste: Path) -> Path:
    root = tmp_path / "bundle"
    (root / "serving" / "main").mkdir(parents=True, exist_ok=True)
    (root / "bundle.yaml").write_text(
        "format: moptd-bundle/v1\nhost: paste\nnotes: a pasted serving log\n"
    )
    (root / "serving" / "main" / "log.txt").write_bytes(paste.read_bytes())
    return root


def _codes(tmp_path: Path, paste: Path) -> set[str]:
    report = replay(_bundle(tmp_path, paste), [default_rules_dir()], read_bundle)
    for f in report.findings:
        assert f["subject"] == "serving:main"
        assert f["actions"]
    return {str(f["code"]) for f in report.findings}


# (fixture file, codes that must be found, codes that must not)
CASES = [
    ("trtllm-oom/log.txt", {"CUDA_OOM"}, {"CUDA_OOM_FRAGMENTATION"}),
    ("trtllm-oom/trtllm-3636.txt", {"CUDA_OOM"}, {"CUDA_OOM_FRAGMENTATION"}),
    ("trtllm-oom/trtllm-1060.txt", {"CUDA_OOM"}, {"CUDA_OOM_FRAGMENTATION"}),
    ("sglang-cuda-error-oom/log.txt", {"CUDA_OOM"}, {"CUDA_OOM_FRAGMENTATION"}),
    # 737 MiB stranded of 14.5 GiB reserved: PyTorch's "large" it is not
    ("oom-small-unallocated/log.txt", {"CUDA_OOM"}, {"CUDA_OOM_FRAGMENTATION"}),
    ("vllm-tokenizer-file-missing/log.txt", {"TOKENIZER_MISSING"}, OOMS),
    # the engine wants more memory: calling it an OOM would send the operator the wrong way
    ("vllm-kv-no-cache-blocks/log.txt", {"KV_CACHE_CAPACITY_INSUFFICIENT"}, OOMS),
    ("vllm-kv-max-seq-len/log.txt", {"KV_CACHE_CAPACITY_INSUFFICIENT"}, OOMS),
    ("vllm-kv-max-seq-len/basalam-10.txt", {"KV_CACHE_CAPACITY_INSUFFICIENT"}, OOMS),
    ("vllm-illegal-address/log.txt", {"CUDA_ILLEGAL_ADDRESS"}, OOMS | {"CUDA_ARCH_UNSUPPORTED"}),
    ("vllm-arch-unsupported/log.txt", {"CUDA_ARCH_UNSUPPORTED"}, {"CUDA_DRIVER_TOO_OLD"}),
    ("vllm-arch-unsupported/vllm-16901.txt", {"CUDA_ARCH_UNSUPPORTED"}, {"CUDA_DRIVER_TOO_OLD"}),
    ("cuda-driver-too-old/log.txt", {"CUDA_DRIVER_TOO_OLD"}, {"CUDA_ARCH_UNSUPPORTED"}),
    ("cuda-driver-too-old/mmskeleton-30.txt", {"CUDA_DRIVER_TOO_OLD"}, {"CUDA_ARCH_UNSUPPORTED"}),
    ("trt-engine-incompatible/log.txt", {"TRT_ENGINE_INCOMPATIBLE"}, {"CUDA_ARCH_UNSUPPORTED"}),
    (
        "trt-engine-incompatible/llama-index-12318.txt",
        {"TRT_ENGINE_INCOMPATIBLE"},
        {"CUDA_ARCH_UNSUPPORTED"},
    ),
    (
        "trt-engine-incompatible/tensorrt-2041.txt",
        {"TRT_ENGINE_INCOMPATIBLE"},
        {"CUDA_DRIVER_TOO_OLD", "DRIVER_VERSION_MISMATCH"},
    ),
    # "Available KV cache memory: -2.14 GiB": nothing left for the cache, no OOM
    ("vllm-kv-negative-available/log.txt", {"KV_CACHE_CAPACITY_INSUFFICIENT"}, OOMS),
    ("sglang-kv-not-enough-memory/log.txt", {"KV_CACHE_CAPACITY_INSUFFICIENT"}, OOMS),
    # a release that prints no exit code after "died unexpectedly"
    ("vllm-worker-died-no-exit-code/log.txt", {"ENGINE_DEAD"}, OOMS),
    # get_open_port's and torch.distributed's binds are internal ports, not the serving port
    ("vllm-internal-port-in-use/log.txt", set(), {"PORT_CONFLICT"} | OOMS),
    # healthy stats lines and a single preemption warning diagnose nothing
    ("vllm-v0-stats-light/log.txt", set(), {"KV_CACHE_PRESSURE", "PREEMPTION_STORM"} | OOMS),
    ("vllm-v0-preemption/log.txt", set(), {"PREEMPTION_STORM"} | OOMS),
]


@pytest.mark.parametrize(("name", "must", "must_not"), CASES, ids=[c[0] for c in CASES])
def test_paste_diagnosis(tmp_path: Path, name: str, must: set[str], must_not: set[str]) -> None:
    codes = _codes(tmp_path, PASTE / name)
    assert must <= codes, codes
    assert not (must_not & codes), codes


def test_every_paste_has_a_source_and_a_case() -> None:
    named = {c[0] for c in CASES} | {
        "vllm-v0-stats-kv-full/log.txt",  # test_v0_stats_become_the_metrics_signals
        "vllm-v0-preemption/limo-29.txt",  # test_v0_preemption_warning_is_the_counter
    }
    for d in PASTE.iterdir():
        assert (d / "SOURCE.md").is_file(), d
        for f in d.glob("*.txt"):
            assert f"{d.name}/{f.name}" in named, f
            assert f.name in (d / "SOURCE.md").read_text(), f


def _series(tmp_path: Path, paste: Path, signal: str) -> list[tuple[float, float]]:
    d = _bundle(tmp_path, paste) / "serving" / "main"
    out = read_serving_dir(d, year=2024)
    return [
        (t, s.value)
        for t, b in out.observations
        for s in b.samples
        if s.signal == signal and s.subject == "serving:main"
    ]


def test_v0_stats_become_the_metrics_signals(tmp_path: Path) -> None:
    paste = PASTE / "vllm-v0-stats-kv-full" / "log.txt"
    running = _series(tmp_path, paste, "serving.requests_running")
    assert [v for _, v in running] == [247, 241, 233, 226, 219]
    waiting = _series(tmp_path, paste, "serving.requests_waiting")
    assert [v for _, v in waiting] == [740, 746, 754, 761, 768]  # V0's "Pending"
    kv = [v for _, v in _series(tmp_path, paste, "serving.kv_cache_usage")]
    assert kv == pytest.approx([0.997, 0.996, 0.997, 0.999, 1.0])
    # V0's prefix (no brackets around file:line) dates the lines: 5 s apart, 07-24 09:55:30
    times = [t for t, _ in running]
    assert [b - a for a, b in itertools.pairwise(times)] == [5.0] * 4
    assert times[0] == 1721814930.0  # 2024-07-24T09:55:30Z
    (line,) = [e for e in read_serving_dir(paste.parent, year=2024).events][:1]
    assert line.stream == "serving.log_stats"
    assert line.fields["swapped"] == 0


def test_v0_preemption_warning_is_the_counter(tmp_path: Path) -> None:
    for name, total in (("log.txt", 1.0), ("limo-29.txt", 101.0)):
        paste = PASTE / "vllm-v0-preemption" / name
        assert [v for _, v in _series(tmp_path / name, paste, "serving.preemptions")] == [total]
        rec = parse_line(paste.read_text().splitlines()[0])
        assert rec is not None
        assert rec.fields == {"mode": "recompute", "total": total}


def test_stats_lines_with_a_metrics_page_leave_the_page_authoritative(tmp_path: Path) -> None:
    d = _bundle(tmp_path, PASTE / "vllm-v0-stats-kv-full" / "log.txt") / "serving" / "main"
    (d / "metrics").mkdir()
    page = FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_load.txt"
    (d / "metrics" / "1721814930.prom").write_bytes(page.read_bytes())
    out = read_serving_dir(d, year=2024)
    running = [
        s.value
        for _, b in out.observations
        for s in b.samples
        if s.signal == "serving.requests_running"
    ]
    assert running == [8.0]  # the page's, not the log's 247..219


def test_docker_compose_and_v0_prefixes_are_split() -> None:
    head, msg = split_prefix(
        "vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory for "
        "the cache blocks."
    )
    assert head["ts"] == "11-18 18:07:28"
    assert head["file"] == "engine.py"
    assert msg.startswith("ValueError")
    head, msg = split_prefix(
        "\x1b[0;36m(APIServer pid=3604781)\x1b[0;0m INFO 12-28 10:00:01 [api_server.py:1] x"
    )
    assert (head["proc"], head["ts"], msg) == ("APIServer", "12-28 10:00:01", "x")


def test_address_in_use_is_the_serving_port_unless_an_internal_bind_raised_it() -> None:
    lines = (PASTE / "vllm-internal-port-in-use" / "log.txt").read_text().splitlines()
    oserror = next(line for line in lines if line.startswith("OSError"))
    rec = parse_line(oserror)
    assert rec is not None
    assert rec.fields["kind"] == "port_in_use"  # alone, the line names no port
    state = LogState()
    kinds = []
    for line in lines:
        state.observe(line)
        r = parse_line(line)
        if r is not None:
            state.update(r)
            kinds.append(state.event_fields(r)["kind"])
    assert kinds == ["internal_port_in_use"]
    state.observe("Traceback (most recent call last):")  # a new traceback forgets it
    assert state.event_fields(rec)["kind"] == "port_in_use"


def test_memory_words_that_are_no_cuda_oom() -> None:
    # SGLang's request-slot pool (sglang#10408): a capacity limit, not a CUDA allocation
    assert (
        bare_oom(
            "RuntimeError: alloc_req_slots runs out of memory. Please set a smaller "
            "number for `--max-running-requests`."
        )
        is None
    )
    # a TensorRT-LLM error that is no OOM
    assert bare_oom("[TensorRT-LLM][ERROR] 6: The engine plan file is not compatible") is None


_prefixes = st.sampled_from(
    [
        "",
        "vllm-1  | ",
        "\x1b[0;36m(APIServer pid=1)\x1b[0;0m ",
        "(Worker_TP0 pid=9) ",
        "INFO 07-24 09:55:30 metrics.py:334] ",
        "ERROR 07-15 21:01:01 [core.py:1240] ",
    ]
)
_needles = st.sampled_from(
    [
        "out of memory",
        "CUDA error: out of memory",
        "[TensorRT-LLM][ERROR] ",
        "illegal memory access",
        "no kernel image",
        "current PyTorch installation",
        "engine plan file",
        "driver version is insufficient",
        "is preempted by PreemptionMode.",
        "Swapped: ",
        "stored in KV cache",
        "No tokenizer file found in directory",
        "Avg prompt throughput: ",
    ]
)


@given(st.lists(st.one_of(_prefixes, _needles, st.text(max_size=40)), max_size=12))
def test_mutated_paste_lines_never_crash(parts: list[str]) -> None:
    line = "".join(parts)
    rec = parse_line(line)
    if rec is not None:
        assert rec.stream.startswith("serving.")
    split_prefix(line)
    bare_oom(line)


@given(st.sampled_from(["a-", "vllm-1 ", "[", "x:1", "INFO 01-01 00:00:00 "]), st.integers(1, 9000))
def test_long_repetitive_lines_stay_cheap(unit: str, times: int) -> None:
    # hypothesis's deadline (200 ms) bounds each call: no backtracking blow-up in the prefix
    line = unit * times
    split_prefix(line)
    parse_line(line + " out of memory")


@given(st.lists(st.integers(0, 999), max_size=200))
def test_stats_of_many_engines_stay_bounded(engines: list[int]) -> None:
    state = LogState()
    for n in engines:
        rec = parse_line(
            f"Engine {n:03d}: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
            "1.0 tokens/s, Running: 1 reqs, Waiting: 2 reqs, GPU KV cache usage: 3.0%"
        )
        assert rec is not None
        state.update(rec)
    assert len(state.stats_by_engine) <= 64
    assert state.preemptions_total == (0.0 if engines else None)


@pytest.mark.parametrize(
    ("bundle", "engine", "kind"),
    [
        # vllm#12474: the journal's "Jan 28 10:40:07 localhost bash[367371]: " prefix
        ("vllm-v0-journald-engine-process-failed-to-start", "vllm", "python-log"),
        # vllm#16107: docker logs --timestamps
        ("vllm-v0-startup-debug-waiting-docker-timestamps", "vllm", "vllm-log"),
        # vllm#6042: a log viewer's bare "  | " column
        ("vllm-v0-tp-worker-died-allreduce-watchdog-log-viewer", "vllm", "vllm-log"),
        # terraform-vss: docker compose's "via-server-1  | "
        ("trtllm-executor-init-oom-three-other-processes-compose", "trtllm", "trtllm-log"),
    ],
)
def test_a_serving_log_behind_a_collectors_prefix_is_pasted_as_one(
    bundle: str, engine: str, kind: str
) -> None:
    from moptd.bundle.classify import split

    text = (FIXTURES / "incidents" / bundle / "serving" / engine / "log.txt").read_text()
    sections = split(text)
    assert sections[0].kind == kind, [(s.kind, s.first, s.last) for s in sections]
    assert "kernel-log" not in {s.kind for s in sections[:1]}
