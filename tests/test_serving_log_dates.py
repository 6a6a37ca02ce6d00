"""Serving-log replay takes a full date where a line has one (moptd/serving/bundle.py
full_date): ONNX Runtime's, TensorRT's, SGLang's and Python logging's stamps, on lines
pasted in public issues (the SOURCE.md beside each fixture), never a year made up."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.bundle.intake import read_inputs
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.replay import replay_timeline
from moptd.serving.bundle import full_date, read_serving_dir

FIX = Path(__file__).parent / "fixtures"
ORT = FIX / "onnxruntime-paste"


def utc(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "first"),
    [
        # "2023-07-31 14:22:06.483132863 [W:onnxruntime:Default, ..." (Linux: nanoseconds)
        ("cuda-ep-create-failed.log", utc(2023, 7, 31, 14, 22, 6) + 0.483132863),
        # "2024-07-19 17:43:44.2260019 [E:onnxruntime:..." (Windows: 100 ns)
        ("cuda-ep-require-cudnn9-cuda12-21425.log", utc(2024, 7, 19, 17, 43, 44) + 0.2260019),
        ("libcudnn-so9-missing-rembg.log", utc(2025, 10, 30, 11, 3, 17) + 0.233410897),
    ],
)
def test_a_pasted_onnxruntime_log_replays_at_its_own_time(name: str, first: float) -> None:
    timeline = read_inputs([str(ORT / name)])
    report = replay_timeline(timeline, load_rules([default_rules_dir()]).ruleset)
    assert not report.untimed
    (finding,) = [f for f in report.findings if f["code"] == "ONNXRUNTIME_CPU_FALLBACK"]
    assert finding["first_seen"] == pytest.approx(first, abs=1e-6)
    assert "untimed" not in finding


def _serving_dir(tmp_path: Path, log: Path) -> Path:
    d = tmp_path / "serving" / "engine"
    d.mkdir(parents=True)
    shutil.copy(log, d / "log.txt")
    return d


def test_tensorrt_stamps_are_month_first_and_give_the_vllm_lines_their_year(
    tmp_path: Path,
) -> None:
    # "INFO 10-10 17:37:56 [model_runner.py:...]" then "[10/10/2025-17:37:58] [TRT] [E] 6: ..."
    d = _serving_dir(tmp_path, FIX / "trt-engine" / "logs" / "cosyvoice-1600.txt")
    replay = read_serving_dir(d)
    times = {round(e.t) for e in replay.events}
    assert times, "the log's records became events"
    assert min(times) >= round(utc(2025, 10, 10, 17, 37, 56))
    assert max(times) <= round(utc(2025, 10, 10, 17, 40, 0))


@pytest.mark.parametrize(
    ("line", "want"),
    [
        (
            "[2024-03-27 06:33:22,299] [    INFO] - >>> [InferBackend] Use GPU to inference ...",
            utc(2024, 3, 27, 6, 33, 22) + 0.299,
        ),
        (
            "  | [2024-09-05T00:38:34Z] INFO:     Started server process [60858]",
            utc(2024, 9, 5, 0, 38, 34),
        ),
        (
            "[06/08/2022-15:28:47] [TRT] [E] 4: [runtime.cpp::deserializeCudaEngine::50] Error",
            utc(2022, 6, 8, 15, 28, 47),
        ),
        # tests/fixtures/intake/sglang-8826-scheduler.txt
        (
            "[2025-08-05 11:14:39 TP2] Scheduler hit an exception: Traceback (most recent call "
            "last):",
            utc(2025, 8, 5, 11, 14, 39),
        ),
        # vLLM's stamps carry no year: not a full date
        ("INFO 07-24 09:55:30 metrics.py:334] Avg prompt throughput: 0.0 tokens/s", None),
        ("(EngineCore_0 pid=5839) WARNING 08-20 18:04:08 [marlin_utils_fp4.py:196] Your GPU", None),
        ("[TensorRT-LLM][ERROR] 6: The engine plan file is not compatible", None),
    ],
)
def test_the_stamp_forms(line: str, want: float | None) -> None:
    got = full_date(line)
    assert got == (None if want is None else pytest.approx(want, abs=1e-6))


def test_a_date_that_does_not_exist_is_no_date() -> None:
    # the form of "2024-03-27 06:33:23.219728338 [E:onnxruntime:..." with day and month out
    # of range: left untimed (the previous line's time), never moved to another day
    assert full_date("2024-02-30 06:33:23.219728338 [E:onnxruntime:Default] x") is None
    assert full_date("[13/27/2024-11:09:02] [TRT] [E] x") is None


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=400))
def test_no_line_crashes_full_date(line: str) -> None:
    got = full_date(line)
    assert got is None or got == got  # a number, never NaN


@settings(max_examples=200, deadline=None)
@given(
    st.from_regex(
        r"\A\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d([.,]\d{1,9})?(Z|[+-]\d\d:?\d\d)?[\] ]",
        fullmatch=True,
    )
)
def test_any_stamp_shaped_text_is_a_date_or_none(line: str) -> None:
    got = full_date(line + "message")
    assert got is None or isinstance(got, float)


def test_a_long_line_costs_little() -> None:
    lines = ["2024-03-27 " + "0" * 100_000, "  " * 50_000 + "| [2024-03-27 06:33:22", "[" * 100_000]
    start = time.perf_counter()
    for line in lines * 20:
        full_date(line)
    assert time.perf_counter() - start < 0.5
