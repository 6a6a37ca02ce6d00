"""Docs that derive from code are current."""

import subprocess
import sys

from tests.conftest import REPO


def test_generated_docs_are_current():
    proc = subprocess.run([sys.executable, "tools/gen_docs.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_every_exported_metric_is_documented():
    from moptd.catalog import CATALOG

    text = (REPO / "docs/metrics.md").read_text()
    missing = [s.metric for s in CATALOG.exported() if f"`{s.metric}`" not in text]
    assert not missing
