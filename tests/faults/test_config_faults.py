"""Start-up with a configuration or token file that is a FIFO (issue 18, item 10).

Opening a FIFO for reading waits for a writer: `moptd run` used to hang there before its
signal handlers existed, so SIGTERM did nothing and only SIGKILL ended it. Start-up must
refuse such a path at once (exit 2, the path named), never wait on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.daemon_proc import free_port

# far below the time a hang takes to notice, far above a start-up that refuses
DEADLINE = 30.0


def run_moptd(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_a_config_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "moptd.yaml"
    os.mkfifo(fifo)
    proc = run_moptd(fifo)
    assert proc.returncode == 2, proc.stderr
    assert f"{fifo}: not a regular file (a FIFO)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_token_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)
    config = tmp_path / "moptd.yaml"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"exporter:\n  listen: 127.0.0.1:{free_port()}\n"
        f"api:\n  socket: {tmp_path / 'api.sock'}\n  listen: 127.0.0.1:{free_port()}\n"
        f"  token_file: {fifo}\n"
    )
    proc = run_moptd(config)
    assert proc.returncode == 2, proc.stderr
    assert f"{config}:7: key 'api.token_file': {fifo} is a FIFO, not a regular file" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_a_managed_engine_and_an_endpoint_of_one_name_are_refused_with_the_line(
    tmp_path: Path,
) -> None:
    """Issue 30, item 8: one serving name, one engine; two endpoints of one name too."""
    both = tmp_path / "both.yaml"
    both.write_text(
        "collectors:\n  serving:\n    endpoints:\n      - name: llm\n"
        "        url: http://127.0.0.1:8000\n    managed:\n      name: llm\n"
        "      engine: vllm\n      command: [vllm, serve, /models/x]\n      port: 8001\n"
    )
    twice = tmp_path / "twice.yaml"
    twice.write_text(
        "collectors:\n  serving:\n    endpoints:\n      - name: llm\n"
        "        url: http://127.0.0.1:8000\n      - name: llm\n"
        "        url: http://127.0.0.1:8001\n"
    )
    for path, where in (
        (both, f"{both}:7: key 'collectors.serving.managed.name'"),
        (twice, f"{twice}:3: key 'collectors.serving.endpoints'"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "moptd", "config", "--config", str(path)],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 2, out.stdout + out.stderr
        assert where in out.stderr, out.stderr
        assert "'llm'" in out.stderr, out.stderr
