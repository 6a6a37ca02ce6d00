"""`moptd install-service` refuses a unit that could not execute the moptd it names
(issue 31, item 8): real files, real modes, the shipped unit's User=/ProtectHome=/PrivateTmp=."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from moptd.cli.service_sandbox import cannot_run

REPO = Path(__file__).parent.parent
UNIT = (REPO / "systemd" / "moptd.service").read_text()
UNSANDBOXED = "[Service]\nUser=nobody\nPrivateTmp=no\nProtectHome=no\n"


def test_a_moptd_under_tmp_is_refused_with_the_reason(tmp_path: Path) -> None:
    script = tmp_path / "moptd"
    script.write_text("#!/usr/bin/python3\n")
    script.chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "install-service", "--dry-run", "--moptd", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert f"could not start {script}: {script} is under /tmp, which PrivateTmp=yes" in out.stderr
    assert "install " not in out.stdout  # nothing written, not even shown as to be written


@pytest.fixture
def shm() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="moptd-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_an_interpreter_under_root_is_hidden_by_protect_home(tmp_path: Path) -> None:
    """A virtual environment's script is fine where it is; its #! interpreter is not."""
    venv_script = tmp_path / "moptd"
    venv_script.write_text("#!/root/venv/bin/python3\n")
    unit = UNIT.replace("PrivateTmp=yes", "PrivateTmp=no")
    assert cannot_run(unit, str(venv_script)) == (
        "/root/venv/bin/python3 is under /root, which ProtectHome=yes hides from the unit"
    )


def test_a_directory_the_user_cannot_enter_is_said(shm: Path) -> None:
    closed = shm / "closed"
    closed.mkdir(mode=0o700)
    script = closed / "moptd"
    script.write_text("#!/usr/bin/python3\n")
    script.chmod(0o755)
    why = cannot_run(UNSANDBOXED, str(script))
    assert why == f"user nobody cannot enter {closed} (mode drwx------)"
    closed.chmod(0o755)
    script.chmod(0o700)
    assert cannot_run(UNSANDBOXED, str(script)) == (
        f"user nobody cannot execute {script} (mode -rwx------)"
    )
    script.chmod(0o755)
    assert cannot_run(UNSANDBOXED, str(script)) is None


def test_a_system_executable_passes_the_shipped_unit() -> None:
    assert cannot_run(UNIT, "/usr/bin/true") is None
