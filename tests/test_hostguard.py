"""The guard that keeps tests off the host's own moptd sees what a subprocess reaches."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.hostguard import sitecustomize as hostguard

GUARD_DIR = Path(hostguard.__file__).parent


def _run(tmp_path: Path, code: str, pythonpath: str) -> list[str]:
    """What the subprocess running `code` reached, each without the process that did."""
    log = tmp_path / "reached.log"
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath,
        hostguard.ENV_LOG: str(log),
        hostguard.ENV_PLACES: json.dumps([str(tmp_path / "run")]),
        hostguard.ENV_PORT: "9",
    }
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split(" by pid ")[0] for line in lines]


def test_a_subprocess_that_reaches_a_default_place_is_reported(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(run / "api.sock"))
    listener.listen(1)
    try:
        reached = _run(
            tmp_path,
            "import socket, sqlite3\n"
            f"socket.socket(socket.AF_UNIX).connect({str(run / 'api.sock')!r})\n"
            f"sqlite3.connect({str(run / 'f.db')!r}).close()\n"
            f"open({str(tmp_path / 'elsewhere')!r}, 'w').close()\n",
            str(GUARD_DIR),
        )
    finally:
        listener.close()
    assert reached == [
        f"socket.connect {str(run / 'api.sock')!r}",
        f"sqlite3.connect {str(run / 'f.db')!r}",
    ]


def test_the_default_port_on_loopback_is_reported_another_port_not(tmp_path: Path) -> None:
    # nothing listens on port 9 (discard): each connect is refused at once
    reached = _run(
        tmp_path,
        "import socket\n"
        "for host in ('127.0.0.1', '0.0.0.0', '127.0.0.2'):\n"
        "    try: socket.create_connection((host, 9), timeout=1)\n"
        "    except OSError: pass\n"
        "socket.socket().bind(('127.0.0.1', 0))\n",
        str(GUARD_DIR),
    )
    assert reached == [
        "socket.connect ('127.0.0.1', 9)",
        "socket.connect ('0.0.0.0', 9)",
        "socket.connect ('127.0.0.2', 9)",
    ]


def test_the_sitecustomize_it_shadows_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        f"open({str(tmp_path / 'run' / 'x')!r}, 'w').close()\n"
    )
    (tmp_path / "run").mkdir()
    reached = _run(tmp_path, "pass", os.pathsep.join([str(GUARD_DIR), str(theirs)]))
    assert reached == [f"open {str(tmp_path / 'run' / 'x')!r}"]
