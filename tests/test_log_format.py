"""The daemon's log lines as an operator reads them (issue 34): under journald the journal
stamps each line, and moptd prefixes the syslog priority; anywhere else (`docker logs`, a
terminal, a file) moptd writes the time itself, RFC 3339 with the UTC offset, since a line
without a time cannot be put beside the kernel's or the engine's."""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import yaml

STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d) (\S+) (\S+): ")


def _run_into(tmp_path: Path, log: Path, journal: bool) -> list[str]:
    """`moptd run` whose port is taken: it logs why and exits 1. Its stderr goes to `log`;
    with journal, JOURNAL_STREAM names that file as systemd names the journal stream."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "moptd.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "state_dir": str(tmp_path / "state"),
                    "exporter": {"listen": f"127.0.0.1:{port}"},
                    "api": {"socket": str(tmp_path / "api.sock"), "listen": None},
                    "collectors": {"nvml": {"enabled": False}},
                }
            )
        )
        env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
        with log.open("w") as err:
            if journal:
                st = os.fstat(err.fileno())
                env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
            code = subprocess.run(
                [sys.executable, "-m", "moptd", "run", "--config", str(config)],
                stderr=err,
                stdout=subprocess.DEVNULL,
                env=env,
                timeout=60,
                check=False,
            ).returncode
    assert code == 1
    lines = log.read_text().splitlines()
    assert any(f"127.0.0.1:{port}" in line for line in lines), lines
    return lines


def test_log_lines_carry_their_time_outside_journald(tmp_path):
    before = dt.datetime.now(dt.UTC)
    lines = _run_into(tmp_path, tmp_path / "stderr.log", journal=False)
    after = dt.datetime.now(dt.UTC)
    for line in lines:
        if line.startswith((" ", "Traceback")):
            continue  # a traceback's continuation lines belong to the record above
        m = STAMP.match(line)
        assert m, line
        when = dt.datetime.fromisoformat(m.group(1))
        assert when.tzinfo is not None
        assert before - dt.timedelta(seconds=1) <= when <= after + dt.timedelta(seconds=1)
        assert m.group(2) in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def test_under_journald_the_priority_and_no_time(tmp_path):
    lines = _run_into(tmp_path, tmp_path / "journal.log", journal=True)
    for line in lines:
        assert re.match(r"^<[0-7]>[A-Z]+ ", line), line
        assert not STAMP.match(line.split(">", 1)[1])
