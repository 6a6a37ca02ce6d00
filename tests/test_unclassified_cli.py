"""Never silent, end to end through `moptd replay` (issue 29 "Done when"): an error record
moptd cannot classify is UNCLASSIFIED_ERROR, quoted, exit 1, from a file and from stdin;
healthy logs (their access lines included) raise no finding; PyTorch's own record shape is
read. Every input is public material with its SOURCE.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# NVIDIA/TensorRT-LLM#260 (tests/fixtures/intake/SOURCE.md): Triton's E-record quoting a
# TensorRT-LLM CUDA error whose "out of memory" the paste wrapped onto the next line
TRTLLM_260 = FIXTURES / "intake" / "trtllm-260-oom.txt"
RECORDS = FIXTURES / "serving-records"
ENV = {**os.environ, "COLUMNS": "200", "TZ": "UTC", "PYTHONPATH": str(REPO)}


def replay(*args: str, stdin: bytes | None = None) -> tuple[int, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "moptd", "replay", *args, "--json"],
        input=stdin,
        capture_output=True,
        timeout=120,
        env=ENV,
        cwd=REPO,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout)


def _unclassified(report: dict[str, object]) -> list[dict[str, object]]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return [f for f in findings if f["code"] == "UNCLASSIFIED_ERROR"]


def test_an_unknown_error_record_is_quoted_from_a_file_and_from_stdin() -> None:
    for args, stdin in (((str(TRTLLM_260),), None), (("-",), TRTLLM_260.read_bytes())):
        rc, report = replay(*args, stdin=stdin)
        found = _unclassified(report)
        assert rc == 1, report
        assert len(found) == 1
        f = found[0]
        assert "cudaMallocAsync" in str(f["summary"])
        assert f["evidence"]["emitter"] == "triton"  # type: ignore[index]
        assert f["evidence"]["file"] == "backend_model.cc"  # type: ignore[index]


def test_a_healthy_sglang_log_with_access_lines_raises_nothing() -> None:
    rc, report = replay(str(RECORDS / "sglang-10053-healthy.txt"))
    assert rc == 0
    assert report["findings"] == []


def test_the_real_vllm_log_with_its_shutdown_errors_is_not_unclassified() -> None:
    # vLLM prints EngineDeadError, output_handler and cancelled-task tracebacks on every
    # requested stop (section 3 of the capture): the stop's own, not unknown errors
    _, report = replay(str(FIXTURES / "vllm-cpu" / "vllm_cpu_server_log.txt"))
    assert _unclassified(report) == []


def test_pytorchs_own_watchdog_line_is_read_not_refused() -> None:
    rc, report = replay(str(RECORDS / "vllm-4108-c10-watchdog.txt"))
    codes = {f["code"] for f in report["findings"]}  # type: ignore[union-attr]
    assert codes == {"CUDA_ILLEGAL_ADDRESS"}
    assert rc == 2


def test_prose_around_the_log_of_a_whole_ticket_is_skipped() -> None:
    rc, report = replay(str(RECORDS / "sglang-8741-ticket.txt"))
    assert rc == 0
    assert report["findings"] == []
    read = report["read"]
    assert isinstance(read, list)
    assert any(e.get("kind") == "sglang-log" and e.get("used") for e in read), read


def test_explain_quotes_an_unclassified_message_once_beside_its_line() -> None:
    """The summary quotes the messages and the evidence quotes the line; the evidence values
    do not say the messages a third time (--verbose lists every value)."""
    def explain(*extra: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "moptd", "explain", "--bundle", str(TRTLLM_260), *extra],
            capture_output=True,
            timeout=120,
            env={**ENV, "NO_COLOR": "1"},
            cwd=REPO,
            check=False,
        )
        return proc.stdout.decode()

    compact = explain()
    assert compact.count("Failed to create instance") == 2, compact
    evidence = next(x for x in compact.splitlines() if x.lstrip().startswith("evidence:"))
    assert "messages =" not in evidence
    assert "emitter = triton, file = backend_model.cc" in evidence
    assert "messages" in explain("--verbose")
