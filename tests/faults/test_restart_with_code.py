"""`restart_with` refuses what changes the code that runs (issue 30, item 8).

A remediation policy could restart the engine with `--trust-remote-code` or
`env: {LD_PRELOAD: ...}`: a remedy that loads code from elsewhere into the engine. The list
is data (moptd/remediation/policy.py CODE_ARGS, CODE_ENV, each with why); each is refused
with file, line and key, through the same `moptd config` check the daemon's start runs.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from moptd.remediation.policy import CODE_ARGS, CODE_ENV


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ("args: [--trust-remote-code]", "policy[0].args"),
        ("args: [--enforce-eager, --trust_remote_code]", "policy[0].args"),
        ("args: ['--worker-cls=evil.Worker']", "policy[0].args"),
        ("env: {LD_PRELOAD: /tmp/x.so}", "policy[0].env.LD_PRELOAD"),
        ("env: {PYTHONPATH: /tmp}", "policy[0].env.PYTHONPATH"),
        ("env: {LD_BIND_NOW: '1'}", "policy[0].env.LD_BIND_NOW"),
    ],
)
def test_moptd_config_refuses_a_restart_with_that_changes_the_code(tmp_path, entry, key):
    cfg = tmp_path / "moptd.yaml"
    cfg.write_text(
        "remediation:\n  policy:\n"
        f"    - {{code: SCHEDULER_STALL, remedy: restart_with, {entry}}}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "moptd", "config", "--config", str(cfg)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"moptd.yaml:3: key 'remediation.{key}'" in out, out
    assert "changes the code that runs" in out, out


def test_every_refusal_says_why():
    assert all(why.strip() for why in {**CODE_ARGS, **CODE_ENV}.values())
