"""ONNX Runtime's execution-provider lines (moptd/serving/onnxruntime.py): parsed, classified
as a pasted log, and replayed into ONNXRUNTIME_CPU_FALLBACK, on lines from public issues
(tests/fixtures/onnxruntime-paste/SOURCE.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.bundle import classify
from moptd.bundle.intake import read_inputs
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.model import RuleSet
from moptd.diagnose.replay import replay_timeline
from moptd.serving.logparse import LogState, parse_line
from moptd.serving.logring import LogRing
from moptd.serving.logsource import log_events

PASTES = Path(__file__).parent / "fixtures" / "onnxruntime-paste"


def records(name: str) -> list[dict[str, object]]:
    out = []
    for line in (PASTES / name).read_text(encoding="utf-8").splitlines():
        rec = parse_line(line)
        if rec is not None and rec.stream == "serving.ep_fallback":
            out.append(rec.fields)
    return out


def _ep(provider: str, kind: str, to: str, library: str = "") -> dict[str, object]:
    return {"provider": provider, "kind": kind, "to": to, "library": library}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cuda-ep-create-failed.log", [_ep("cuda", "create_failed", "cpu")]),
        (
            # onnxruntime 1.19's wording of the warning, after Windows' LoadLibrary error 126
            "cuda-ep-require-cudnn9-cuda12-21425.log",
            [_ep("cuda", "library_missing", "cpu"), _ep("cuda", "create_failed", "cpu")],
        ),
        (
            "cublaslt-so11-missing.log",
            [
                _ep("cuda", "library_missing", "cpu", "libcublasLt.so.11"),
                _ep("cuda", "create_failed", "cpu"),
            ],
        ),
        (
            "libcudnn-adv-so9-missing-cpu-applied.log",
            [_ep("cuda", "library_missing", "cpu", "libcudnn_adv.so.9"), _ep("", "applied", "cpu")],
        ),
        (
            "libcudnn-so9-missing-rembg.log",
            [_ep("cuda", "library_missing", "cpu", "libcudnn.so.9")],
        ),
        (
            # Windows: LoadLibrary error 126 names the DLL, not the dependency it missed
            "trt-ep-error-then-cuda-dll-cpu-applied.log",
            [
                _ep("", "retry", "gpu"),
                _ep("cuda", "library_missing", "cpu"),
                _ep("", "applied", "cpu"),
            ],
        ),
        # TensorRT failing over to CUDA is still on the GPU; a TensorRT line alone cannot say
        ("trt-ep-error-falls-back-to-cuda.log", [_ep("", "retry", "gpu")]),
        (
            "trt-ep-dll-falls-back-to-cuda-17394.log",
            [_ep("tensorrt", "library_missing", ""), _ep("", "retry", "gpu")],
        ),
    ],
)
def test_each_paste_gives_its_records(name: str, expected: list[dict[str, object]]) -> None:
    assert records(name) == expected


@pytest.mark.parametrize("path", sorted(PASTES.glob("*.log")), ids=lambda p: p.name)
def test_a_pasted_onnxruntime_log_is_classified_not_ignored(path: Path) -> None:
    sections = classify.split(path.read_text(encoding="utf-8"))
    kinds = {s.kind for s in sections} - {"prose"}
    assert kinds == {"onnxruntime-log"}


@pytest.fixture(scope="module")
def ruleset() -> RuleSet:
    loaded = load_rules([default_rules_dir()])
    assert loaded.errors == []
    return loaded.ruleset


@pytest.mark.parametrize(
    ("name", "on_cpu"),
    [
        ("cuda-ep-create-failed.log", True),
        ("cuda-ep-require-cudnn9-cuda12-21425.log", True),
        ("cublaslt-so11-missing.log", True),
        ("libcudnn-adv-so9-missing-cpu-applied.log", True),
        ("libcudnn-so9-missing-rembg.log", True),
        ("trt-ep-error-then-cuda-dll-cpu-applied.log", True),
        ("trt-ep-error-falls-back-to-cuda.log", False),
        ("trt-ep-dll-falls-back-to-cuda-17394.log", False),
    ],
)
def test_replay_of_the_paste(name: str, on_cpu: bool, ruleset: RuleSet) -> None:
    timeline = read_inputs([str(PASTES / name)])
    used = [e for e in timeline.read if e.get("used")]
    assert [e["kind"] for e in used] == ["onnxruntime-log"]
    report = replay_timeline(timeline, ruleset)
    codes = {(str(f["code"]), str(f["subject"])) for f in report.findings}
    assert (("ONNXRUNTIME_CPU_FALLBACK", "serving:onnxruntime") in codes) is on_cpu
    assert {c for c, _ in codes} <= {"ONNXRUNTIME_CPU_FALLBACK"}


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=300).map(
        lambda s: (
            s
            + " Failed to create CUDAExecutionProvider Failed to load library "
            + "libonnxruntime_providers_cuda.so with error: Falling back to ['"
            + s
        )
    )
)
def test_no_line_crashes_the_parser(line: str) -> None:
    rec = parse_line(line)
    assert rec is None or rec.stream.startswith("serving.")


def test_a_long_line_costs_little() -> None:
    line = "Falling back to [" + "'CPUExecutionProvider', " * 20_000 + "x"
    line2 = 'LoadLibrary failed with error 126 "' + "a" * 60_000
    start = time.perf_counter()
    for text in (line, line2, "Failed to create " + "A" * 60_000):
        parse_line(text)
    assert time.perf_counter() - start < 0.5


def test_a_followed_log_file_gives_the_same_events() -> None:
    # the live path: an endpoint's log_file / journal_unit lines (moptd/serving/logsource.py)
    lines = (PASTES / "cublaslt-so11-missing.log").read_text(encoding="utf-8").splitlines()
    events = log_events(lines, 100.0, "serving:ort", LogRing(100), LogState(), lambda s: False)
    assert [(e.stream, e.fields["kind"], e.fields["to"]) for e in events] == [
        ("serving.ep_fallback", "library_missing", "cpu"),
        ("serving.ep_fallback", "create_failed", "cpu"),
    ]
