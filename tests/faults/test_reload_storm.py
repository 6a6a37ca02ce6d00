"""Broken rule and config files and a SIGHUP storm against a real daemon.

SIGHUP reloads the rule files only (README: "SIGHUP reloads the rules"; moptd/daemon/app.py);
the configuration is read once at start. So the storm alternates good and broken local rule
files while the config file on disk is replaced by a broken one, and checks that the daemon
never dies and keeps serving, that a refused reload leaves the last good rule set in force
(read back from /v1/rules) and says why (log and /v1/rules "errors"), that the reload a
SIGHUP asks for reads the files as they are after that signal (the newest good version wins,
never an older one finishing late), that the broken config changed nothing, and that a
finding committed before the storm is still in the findings database afterwards.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import pytest

from moptd.diagnose.loader import default_rules_dir
from moptd.findings.db import FILE_NAME
from tests.faults.conftest import api_get, assert_serving, metric_value, start_daemon, wait_for

pytestmark = pytest.mark.slow

CANARY = """\
schema: moptd.rules/v1
rules:
  - id: storm-canary
    title: "canary version {version}"
    layer: host
    scope: node
    status: stable
    for: 0s
    keep_firing_for: 0s
    decide:
      - id: always
        if: last(collector.success, collector="host") == 1
        verdict:
          code: DISK_SPACE_LOW
          summary: "the storm canary fires (version {version})"
          actions:
            - {{kind: inspect, command: "true"}}
          runbook: https://example.invalid/storm-canary
"""

BROKEN_RULES = [
    b"schema: moptd.rules/v1\nrules:\n  - id: x\n",  # misses required keys
    b"schema: moptd.rules/v1\nrules: [\n",  # not YAML
    os.urandom(512),  # not text
    CANARY.format(version=0).replace('== 1', '=== 1').encode(),  # bad expression
]
BROKEN_CONFIG = b"exporter: {listen: [\nnot yaml at all\x00"


def canary_version(d) -> str | None:
    rules = api_get(d, "/v1/rules")
    titles = [r["title"] for r in rules["rules"] if r["id"] == "storm-canary"]
    return titles[0].removeprefix("canary version ") if titles else None


def test_sighup_storm_with_broken_files_keeps_the_last_good_rules(tmp_path):
    local = tmp_path / "rules.d"
    local.mkdir()
    canary = local / "canary.rules.yaml"
    canary.write_text(CANARY.format(version=0))
    extra = {
        "rules": {"paths": [str(default_rules_dir()), str(local)], "interval": 0.2},
        "collectors": {"host": {"interval": 0.5}, "kernel": {"enabled": False}},
    }
    d = start_daemon(tmp_path / "d", extra)
    try:
        assert d.proc is not None
        rules = api_get(d, "/v1/rules")
        assert rules["errors"] == [], rules["errors"]
        shipped = len(rules["rules"])
        assert canary_version(d) == "0"
        # a committed finding: the canary fires and its transition is written
        wait_for(
            lambda: metric_value(assert_serving(d), "moptd_finding_active",
                                 rule="storm-canary") == 1.0,
            timeout=15,
        )
        committed = wait_for(lambda: committed_findings(d), timeout=10)

        # the config file on disk turns to garbage; it is not reloaded, so nothing changes
        config_before = d.config_path.read_bytes()
        d.config_path.write_bytes(BROKEN_CONFIG)

        # the storm: 50 SIGHUPs in about a second, the rule file alternating between a new
        # good version and a broken one; it ends on a good version written just before the
        # last signals, while reloads of older versions may still be under way
        worst = 0.0
        last_good = 0
        for i in range(50):
            if i % 2 == 0:
                last_good = i // 2 + 1
                canary.write_text(CANARY.format(version=last_good))
            else:
                canary.write_bytes(BROKEN_RULES[(i // 2) % len(BROKEN_RULES)])
            d.proc.send_signal(signal.SIGHUP)
            if i % 10 == 0:
                started = time.monotonic()
                assert_serving(d, within=5.0)
                worst = max(worst, time.monotonic() - started)
            time.sleep(0.02)
        last_good += 1
        canary.write_text(CANARY.format(version=last_good))
        for _ in range(3):
            d.proc.send_signal(signal.SIGHUP)

        # the newest version is the one in force once the reloads have settled
        wait_for(lambda: canary_version(d) == str(last_good), timeout=20, step=0.2)
        time.sleep(2.0)  # any reload of an older version still running ends in this time
        assert canary_version(d) == str(last_good), "an older rule set was put in force late"
        rules = api_get(d, "/v1/rules")
        assert len(rules["rules"]) == shipped
        assert rules["errors"] == []

        # a broken file now: refused whole, the rules in force stay, the refusal is reported
        canary.write_bytes(BROKEN_RULES[0])
        d.proc.send_signal(signal.SIGHUP)
        rules = wait_for(lambda: refused(d), timeout=10)
        assert any(str(canary) in e for e in rules["errors"]), rules["errors"]
        assert canary_version(d) == str(last_good)
        assert len(rules["rules"]) == shipped
        text = assert_serving(d)
        assert metric_value(text, "moptd_finding_active", rule="storm-canary") == 1.0
        log = d.log()
        assert "rules not reloaded" in log
        assert "Traceback" not in log
        assert "exception was never retrieved" not in log
        assert worst < 3.0, f"worst /metrics + /v1/health round trip {worst:.2f}s"
        # the broken config on disk did not disturb the running daemon (it still serves on
        # the listener and with the rule paths the original file named)
        assert d.proc.poll() is None
    finally:
        rc = d.stop()
    assert rc == 0, d.log()[-3000:]
    d.config_path.write_bytes(config_before)
    # committed before the storm, still there after it
    after = {row[0] for row in db_rows(d)}
    assert committed <= after, (committed, after)


def refused(d) -> dict | None:
    rules = api_get(d, "/v1/rules")
    return rules if rules["errors"] else None


def db_rows(d) -> list[tuple[int, str, str]]:
    with sqlite3.connect(f"file:{d.state_dir / FILE_NAME}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT id, rule, state FROM findings WHERE rule = 'storm-canary'"
        ).fetchall()


def committed_findings(d) -> set[int]:
    return {row[0] for row in db_rows(d) if row[2] == "firing"}
