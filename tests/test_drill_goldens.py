"""The drill read line by line (issue 31, "golden files for each case"): each public
kernel-log excerpt of tests/fixtures/kernel-drill/, pasted into `moptd explain --bundle -`
as an SRE pastes a ticket, gives the one-screen answer in tests/golden/drill/<case>.txt.
tests/test_xid_drill.py holds each case's code, subject, severity and first action against
NVIDIA's catalog; these goldens hold what the SRE reads around them (order, wording, the
commands with their subjects, the time notes). `MOPTD_UPDATE_GOLDEN=1` rewrites them: read
the diff line by line before committing it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from tests.conftest import REPO, year_free

DRILL = REPO / "tests/fixtures/kernel-drill"
GOLDEN = REPO / "tests/golden/drill"
CASES = sorted(p.stem for p in DRILL.glob("*.log"))


def test_every_case_has_its_golden():
    assert len(CASES) >= 16
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == CASES


def _explain_paste(data: bytes) -> str:
    """`moptd explain --bundle -` over DATA as an SRE pastes it; exit 0 asserted."""
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "explain", "--bundle", "-"],
        input=data,
        capture_output=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode()


@pytest.mark.parametrize("case", CASES)
def test_the_drill_case_reads_as_its_golden(case: str) -> None:
    text = year_free(_explain_paste((DRILL / f"{case}.log").read_bytes()))
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("MOPTD_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")


def test_a_year_moptd_gave_year_less_lines_is_said() -> None:
    """A syslog kernel line and a vLLM line carry no year: a paste of either is dated this
    year, and the header says so (a ticket from last year would otherwise read as this
    year's); `dmesg -T` lines, whose stamps hold their year, say nothing of the kind."""
    this_year = datetime.now(UTC).year
    kernel = _explain_paste((DRILL / "xid48.log").read_bytes())
    assert f"No year in the kernel log's lines: their dates are read as {this_year}" in kernel
    vllm_line = (REPO / "tests/fixtures/emitter-lines/cuda-errors.txt").read_bytes()
    vllm = _explain_paste(vllm_line.splitlines(keepends=True)[0])
    assert f"No year in serving:vllm's log lines: their dates are read as {this_year}" in vllm
    dated = REPO / "tests/fixtures/kernel-color/dmesg-T-color.txt"
    assert "No year in" not in _explain_paste(dated.read_bytes())
