"""Rule files that are not what they seem (issue 18, item 9): a FIFO, a huge file, a
file that is big without any alias. Each is refused by name and kind, promptly, by
`moptd rules check` and by a running daemon's reload, which then still stops on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moptd.diagnose.loader import MAX_RULE_FILE_BYTES, default_rules_dir, load_rules
from tests.faults.conftest import api_get, assert_serving, metric_value, start_daemon, wait_for

REPO = Path(__file__).resolve().parents[2]


def rules_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", "rules", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_rules_check_refuses_a_fifo_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "local.rules.yaml")
    start = time.monotonic()
    out = rules_check(tmp_path)
    assert time.monotonic() - start < 30
    assert out.returncode != 0
    assert "local.rules.yaml" in out.stdout + out.stderr
    assert "a FIFO" in out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_rules_check_refuses_a_huge_file_by_its_size_before_parsing_it(tmp_path):
    big = tmp_path / "big.rules.yaml"
    big.write_bytes(b"schema: moptd.rules/v1\nrules:\n" + b"# padding\n" * (4 << 20))
    start = time.monotonic()
    out = rules_check(big)
    assert time.monotonic() - start < 20
    assert out.returncode != 0
    assert f"over the {MAX_RULE_FILE_BYTES}-byte limit" in out.stdout + out.stderr


def test_a_big_file_without_aliases_is_not_blamed_on_aliases(tmp_path):
    many = tmp_path / "many.rules.yaml"
    many.write_bytes(b"schema: moptd.rules/v1\nrules:\n" + b"- 1\n" * 250_000)
    assert many.stat().st_size < MAX_RULE_FILE_BYTES
    out = rules_check(many)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "has more than 200000 nodes" in text, text
    assert "aliases" not in text


@pytest.mark.slow
def test_a_fifo_in_rules_d_neither_wedges_reloads_nor_stops_sigterm(tmp_path):
    local = tmp_path / "rules.d"
    local.mkdir()
    extra = {
        "rules": {"paths": [str(default_rules_dir()), str(local)], "interval": 0.5},
        "collectors": {"host": {"interval": 0.5}, "kernel": {"enabled": False}},
    }
    d = start_daemon(tmp_path / "d", extra)
    try:
        assert d.proc is not None
        shipped = len(api_get(d, "/v1/rules")["rules"])
        os.mkfifo(local / "wedge.rules.yaml")
        d.proc.send_signal(signal.SIGHUP)
        rules = wait_for(lambda: api_get(d, "/v1/rules")["errors"] or None, timeout=15)
        assert any("wedge.rules.yaml" in e and "a FIFO" in e for e in rules), rules
        # the refused reload left the shipped rules in force, and a second reload still runs
        assert len(api_get(d, "/v1/rules")["rules"]) == shipped
        # ... and /metrics says both: what runs, and that the last load failed
        wait_for(
            lambda: metric_value(assert_serving(d), "moptd_rules_load_errors") == 1.0, timeout=10
        )
        assert metric_value(assert_serving(d), "moptd_rules_loaded") == float(shipped)
        (local / "wedge.rules.yaml").unlink()
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: api_get(d, "/v1/rules")["errors"] == [] or None, timeout=15)
        wait_for(
            lambda: metric_value(assert_serving(d), "moptd_rules_load_errors") == 0.0, timeout=10
        )
    finally:
        start = time.monotonic()
        rc = d.stop(timeout=20)
        assert time.monotonic() - start < 20
    assert rc == 0
    assert "Traceback" not in d.log()


@pytest.mark.slow
def test_one_broken_local_file_at_start_leaves_the_shipped_rules_running(tmp_path):
    local = tmp_path / "rules.d"
    local.mkdir()
    (local / "broken.rules.yaml").write_text("schema: moptd.rules/v1\nrules:\n  - id: x\n")
    shipped = len(load_rules([default_rules_dir()]).ruleset.rules)
    d = start_daemon(
        tmp_path / "d",
        {
            "rules": {"paths": [str(default_rules_dir()), str(local)]},
            "collectors": {"kernel": {"enabled": False}},
        },
    )
    try:
        rules = api_get(d, "/v1/rules")
        assert any("broken.rules.yaml" in e for e in rules["errors"]), rules["errors"]
        assert len(rules["rules"]) == shipped  # diagnosis runs, on the shipped set
        wait_for(lambda: metric_value(assert_serving(d), "moptd_rules_loaded") == shipped)
        wait_for(lambda: (metric_value(assert_serving(d), "moptd_rules_load_errors") or 0) >= 1)
    finally:
        assert d.stop() == 0
    assert "running with the" in d.log()
    assert "shipped rules only" in d.log()
