"""Docs that derive from code are current."""

import os
import subprocess
import sys

from tests.conftest import REPO, require_tool

# 2031-06-01: a day on which the committed pages were certainly not generated
LATER = "2031-06-01 12:00:00"
LATER_EPOCH = "1938081600"


def _check(*prefix: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "tools/gen_docs.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


def test_generated_docs_are_current():
    proc = _check()
    assert proc.returncode == 0, proc.stderr


def test_generated_docs_do_not_depend_on_source_date_epoch():
    # argparse-manpage stamps SOURCE_DATE_EPOCH, else today, into a page given no date
    proc = _check(env={**os.environ, "SOURCE_DATE_EPOCH": LATER_EPOCH})
    assert proc.returncode == 0, proc.stderr


def test_generated_docs_do_not_depend_on_the_date():
    # whatever reads the clock: the whole generator run on a later day
    faketime = require_tool("faketime")
    proc = _check(faketime, LATER)
    assert proc.returncode == 0, proc.stderr


def test_the_man_page_carries_the_version_and_no_date():
    from moptd import __version__

    head = (REPO / "docs/man/moptd.1").read_text().partition("\n")[0]
    assert head == f'.TH MOPTD "1" "" "moptd {__version__}" "moptd manual"'


def test_every_exported_metric_is_documented():
    from moptd.catalog import CATALOG

    text = (REPO / "docs/metrics.md").read_text()
    missing = [s.metric for s in CATALOG.exported() if f"`{s.metric}`" not in text]
    assert not missing
