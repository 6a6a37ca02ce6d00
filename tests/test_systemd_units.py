"""The shipped systemd files: `systemd-analyze verify`, the security threshold, install-service."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moptd.cli import main

from .conftest import REPO, require_tool

SYSTEMD = REPO / "systemd"
MAX_EXPOSURE = 2.5  # node_exporter's example unit scores 9.2, dcgm-exporter's 9.6
UNITS = ("moptd.service", "moptd-serving@.service")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The files as `moptd install-service --prefix` renders them (ExecStart= resolved)."""
    root = tmp_path_factory.mktemp("root")
    code = main(["install-service", "--prefix", str(root), "--moptd", sys.executable])
    assert code == 0
    return root


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    tool = require_tool("systemd-analyze")
    return subprocess.run(
        [tool, "verify", "--man=no", str(path)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies(installed, unit):
    result = verify(installed / "etc/systemd/system" / unit)
    assert result.returncode == 0, f"{unit}: {result.stderr}"
    assert result.stderr.strip() == "", f"{unit}: {result.stderr}"


def exposure(path: Path) -> float:
    tool = require_tool("systemd-analyze")
    result = subprocess.run(
        [tool, "security", "--offline=true", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, f"{path.name}: no exposure in output: {result.stdout[-500:]}{result.stderr}"
    return float(match.group(1))


def test_moptd_service_exposure_at_most_2_5(installed):
    score = exposure(installed / "etc/systemd/system/moptd.service")
    assert score <= MAX_EXPOSURE, f"moptd.service: exposure {score} > {MAX_EXPOSURE}"


def test_threshold_flag_agrees(installed):
    # The form CI documentation shows: --threshold is on a 0-100 scale.
    tool = require_tool("systemd-analyze")
    unit = installed / "etc/systemd/system/moptd.service"
    ok = subprocess.run(
        [tool, "security", "--offline=true", "--threshold=25", str(unit)],
        capture_output=True,
        check=False,
    )
    assert ok.returncode == 0


def test_a_broken_unit_is_named(tmp_path, installed):
    text = (installed / "etc/systemd/system/moptd.service").read_text()
    bad = tmp_path / "moptd.service"
    bad.write_text(text.replace("Restart=on-failure", "Restart=sometimes"))
    result = verify(bad)
    # systemd only warns (exit 0) on a bad value, so the check is: stderr stays empty.
    assert f"{bad}:" in result.stderr, result.stderr
    assert "sometimes" in result.stderr


def test_every_relaxation_carries_a_reason():
    text = (SYSTEMD / "moptd.service").read_text()
    for setting in (
        "ProtectProc=default",
        "ProtectKernelLogs=no",
        "PrivateDevices=no",
        "CapabilityBoundingSet=CAP_SYSLOG",
        "MemoryDenyWriteExecute=yes",
    ):
        lines = text.splitlines()
        index = next(i for i, line in enumerate(lines) if line.startswith(setting))
        assert lines[index - 1].startswith("#"), f"{setting} has no comment above it"


def test_install_service_places_every_file(installed):
    expected = [
        "etc/systemd/system/moptd.service",
        "etc/systemd/system/moptd-serving@.service",
        "etc/sysusers.d/moptd.conf",
        "etc/tmpfiles.d/moptd.conf",
        "etc/polkit-1/rules.d/50-moptd.rules",
        "etc/moptd/moptd.yaml",
    ]
    for rel in expected:
        assert (installed / rel).is_file(), rel
    unit = (installed / "etc/systemd/system/moptd.service").read_text()
    assert f"ExecStart={sys.executable} run --config /etc/moptd/moptd.yaml" in unit


def test_install_service_keeps_an_edited_config(tmp_path, capsys):
    config = tmp_path / "etc/moptd/moptd.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("log_level: debug\n")
    assert main(["install-service", "--prefix", str(tmp_path)]) == 0
    assert config.read_text() == "log_level: debug\n"
    assert "keep    " in capsys.readouterr().out


def test_dry_run_changes_nothing(tmp_path, capsys):
    assert main(["install-service", "--prefix", str(tmp_path), "--dry-run"]) == 0
    assert list(tmp_path.iterdir()) == []
    out = capsys.readouterr().out
    assert "install " in out
    assert "moptd.service" in out


def test_shipped_config_loads():
    from moptd.collectors import registry
    from moptd.config import load_config

    config = load_config(SYSTEMD / "moptd.yaml", registry())
    assert str(config.api_socket) == "/run/moptd/api.sock"
    assert config.api_group == "moptd"


def test_sysusers_and_tmpfiles_apply_to_a_root(tmp_path):
    sysusers = require_tool("systemd-sysusers")
    tmpfiles = require_tool("systemd-tmpfiles")
    (tmp_path / "etc").mkdir()
    for command in (
        [sysusers, f"--root={tmp_path}", str(SYSTEMD / "moptd.sysusers")],
        [tmpfiles, f"--root={tmp_path}", "--create", str(SYSTEMD / "moptd.tmpfiles")],
    ):
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{command[0]}: {result.stderr}"
    users = {line.split(":")[0] for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    assert {"moptd", "moptd-serving"} <= users
    assert (tmp_path / "etc/moptd").is_dir()
    # the env files are moptd's to write: in its StateDirectory, not under /etc
    assert not (tmp_path / "etc/moptd/serving").exists()
    assert (tmp_path / "var/lib/moptd-serving").is_dir()


POLKIT_HARNESS = """
const fs = require("fs");
let rule = null;
const polkit = {Result: {YES: "yes", NO: "no", NOT_HANDLED: "not_handled"},
                addRule: (f) => { rule = f; }};
new Function("polkit", fs.readFileSync(process.argv[1], "utf8"))(polkit);
const cases = JSON.parse(process.argv[2]);
const out = cases.map(([user, id, unit, verb]) => rule(
    {id: id, lookup: (k) => ({unit: unit, verb: verb})[k]}, {user: user}));
console.log(JSON.stringify(out));
"""


def test_polkit_rule_allows_only_serving_units():
    import json

    node = require_tool("node")
    manage = "org.freedesktop.systemd1.manage-units"
    cases = [
        ["moptd", manage, "moptd-serving@llama.service", "restart", "yes"],
        ["moptd", manage, "moptd-serving@llama.service", "start", "yes"],
        ["moptd", manage, "moptd-serving@llama.service", "stop", "yes"],
        ["moptd", manage, "sshd.service", "stop", "not_handled"],
        ["moptd", manage, "moptd.service", "restart", "not_handled"],
        ["moptd", manage, "moptd-serving@x.service; sshd.service", "stop", "not_handled"],
        [
            "moptd",
            "org.freedesktop.systemd1.manage-unit-files",
            "moptd-serving@a.service",
            "enable",
            "not_handled",
        ],
        ["nobody", manage, "moptd-serving@llama.service", "restart", "not_handled"],
    ]
    result = subprocess.run(
        [
            node,
            "-e",
            POLKIT_HARNESS,
            str(SYSTEMD / "50-moptd.rules"),
            json.dumps([c[:4] for c in cases]),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [c[4] for c in cases]


def syscalls(group: str) -> set[str]:
    tool = require_tool("systemd-analyze")
    out = subprocess.run(
        [tool, "syscall-filter", "--no-pager", group], capture_output=True, text=True, check=True
    ).stdout
    return {w for w in out.split() if re.fullmatch(r"[a-z0-9_]+", w)}


def test_the_filter_lets_moptd_give_its_socket_to_api_group():
    """The SystemCallFilter= lines, evaluated the way systemd does: the first (an allow
    list) sets the set, then each line adds (allow) or removes (~). chown of the API
    socket (os.chown -> fchownat) must survive ~@privileged."""
    text = (SYSTEMD / "moptd.service").read_text()
    allowed: set[str] = set()
    for i, line in enumerate(re.findall(r"^SystemCallFilter=(.*)$", text, re.M)):
        deny = line.startswith("~")
        names: set[str] = set()
        for item in line.lstrip("~").split():
            names |= syscalls(item) if item.startswith("@") else {item}
        assert i > 0 or not deny, "the first SystemCallFilter= must be the allow list"
        allowed = allowed - names if deny else allowed | names
    assert {"fchownat", "chown", "fchown"} <= allowed
    assert "mount" not in allowed
    assert "setrlimit" not in allowed


def test_limits_and_journal_group_are_set():
    text = (SYSTEMD / "moptd.service").read_text()
    assert re.search(r"^MemoryMax=1G$", text, re.M)
    assert re.search(r"^TasksMax=256$", text, re.M)
    assert re.search(r"^SupplementaryGroups=.*\bsystemd-journal\b", text, re.M)


# --- systemctl reload: nothing outside moptd and systemd (issue 34) ------------------------


def test_reload_needs_nothing_outside_moptd_and_systemd(installed):
    """ExecReload= was /bin/kill (procps), missing on minimal hosts and in the image."""
    shipped = (SYSTEMD / "moptd.service").read_text()
    (reload_line,) = re.findall(r"^ExecReload=(.*)$", shipped, re.MULTILINE)
    assert reload_line == "/usr/bin/moptd reload --pid $MAINPID"
    unit = (installed / "etc/systemd/system/moptd.service").read_text()
    assert f"ExecReload={sys.executable} reload --pid $MAINPID" in unit  # rewritten too


def _moptd(*args, env=None):
    return subprocess.run([sys.executable, "-m", "moptd", *args], capture_output=True,
                          text=True, timeout=60, env=env, check=False)  # fmt: skip


def test_moptd_reload_makes_a_running_daemon_reload(tmp_path):
    from tests.api_helpers import wait_for, wait_socket
    from tests.daemon_proc import DaemonProcess

    d = DaemonProcess(tmp_path).start()
    try:
        wait_socket(d.socket, d.proc)
        assert "reloaded" not in d.log()
        env = {k: v for k, v in os.environ.items() if k != "MAINPID"}
        # as systemd runs it: the pid in $MAINPID (systemd substitutes it on the line too)
        done = _moptd("reload", env={**env, "MAINPID": str(d.proc.pid)})
        assert done.returncode == 0, done.stderr
        assert f"pid {d.proc.pid}" in done.stdout
        wait_for(lambda: re.search(r"reloaded \d+ rules from \d+ files", d.log()), 15)
        assert d.proc.poll() is None  # SIGHUP reloads, it does not stop the daemon
    finally:
        d.stop()


def test_moptd_reload_signals_nothing_but_moptd():
    with subprocess.Popen(["sleep", "60"]) as other:
        try:
            refused = _moptd("reload", "--pid", str(other.pid))
            assert refused.returncode == 1
            assert f"pid {other.pid} is not a running `moptd run`: nothing sent" in refused.stderr
            assert other.poll() is None  # a SIGHUP would have ended sleep
        finally:
            other.kill()
    env = {k: v for k, v in os.environ.items() if k != "MAINPID"}
    usage = _moptd("reload", env=env)
    assert usage.returncode == 2
    assert "--pid PID" in usage.stderr
