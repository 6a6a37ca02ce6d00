"""Every benchmark script under bench/ still imports: a module that moves must take its
benchmarks along (they are how BENCHMARKS.md's figures are made again). Importing runs
only their top level; nothing is measured here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("script", sorted(p.stem for p in BENCH.glob("*.py")))
def test_bench_script_imports(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", f"import {script}"],
        cwd=BENCH,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": f"{BENCH.parent}:{BENCH}", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
