"""Hostile tar headers never reach `tarfile` (issue 30, item 6).

`tarfile.is_tarfile()` parses the first member, pax header included, with CPython's
quadratic parser: a 243-byte .tar.gz with an 80,001-digit pax length ended `moptd replay`
with a ValueError traceback after 6.6 s, and a 600 MB pax header cost 22 s and 1.9 GB before
the guard ran. Each archive here is built by the test (an input, not a log line); `moptd
replay` runs as a real subprocess and must exit 3 naming the header, and the checks that
decide it (the guard and the reader without a guard) take under a second in-process.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from moptd.bundle import BundleError
from moptd.bundle.archive import is_tar
from moptd.bundle.intake import read_bundle
from moptd.cli.bundle_guard import BundleRefused, check_bundle
from tests.faults.hostile_inputs import pax_tar, write_huge_extended

REPO = Path(__file__).resolve().parents[2]
META = b"format: moptd-bundle/v1\ncaptured_at: 2026-01-01T00:00:00Z\n"


def digits_pax(tmp_path: Path, compress: bool) -> Path:
    """The first member is a pax header whose one record's length has 80,001 digits."""
    raw = pax_tar(b"8" * 80_001 + b" path=x\n")
    path = tmp_path / ("digits.tar.gz" if compress else "digits.tar")
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


def huge_extended(tmp_path: Path, kind: bytes) -> Path:
    """A 600 MB extended header (pax or GNU long name) first, its data a sparse hole."""
    return write_huge_extended(tmp_path / f"huge-{kind.decode()}.tar", kind)


CASES = {
    "80001-digit pax length, .tar.gz": lambda p: digits_pax(p, compress=True),
    "80001-digit pax length, plain .tar": lambda p: digits_pax(p, compress=False),
    "600 MB pax header": lambda p: huge_extended(p, tarfile.XHDTYPE),
    "600 MB GNU long name": lambda p: huge_extended(p, tarfile.GNUTYPE_LONGNAME),
}


@pytest.fixture(params=sorted(CASES))
def hostile(request, tmp_path) -> Path:
    return CASES[request.param](tmp_path)


def test_replay_refuses_a_hostile_header_with_exit_3(hostile):
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "replay", str(hostile)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    took = time.monotonic() - start
    assert out.returncode == 3, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "bundle refused" in out.stderr
    assert "over the 65536-byte limit" in out.stderr
    assert took < 30, took  # interpreter start included; main took 6.6 s to 25 s


def test_replay_refuses_a_hostile_header_on_stdin(tmp_path):
    bundle = digits_pax(tmp_path, compress=True)
    with bundle.open("rb") as fh:
        out = subprocess.run(
            [sys.executable, "-m", "moptd", "replay", "-"],
            stdin=fh,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert out.returncode == 3, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert "over the 65536-byte limit" in out.stderr


def test_the_checks_decide_in_under_a_second(hostile):
    start = time.process_time()
    assert is_tar(hostile)
    with pytest.raises(BundleRefused, match="over the 65536-byte limit"):
        check_bundle(hostile)
    # the reader without the CLI's guard refuses it too, before any tarfile call
    with pytest.raises(BundleError, match="over the 65536-byte limit"):
        read_bundle(hostile)
    assert time.process_time() - start < 1.0


def test_a_tarball_is_still_recognised_by_its_first_header(tmp_path):
    root = tmp_path / "b"
    (root / "kernel").mkdir(parents=True)
    (root / "bundle.yaml").write_bytes(META)
    (root / "kernel" / "dmesg.txt").write_bytes(
        (REPO / "tests/fixtures/h200/dmesg.txt").read_bytes()
    )
    for mode, name in (("w", "b.tar"), ("w:gz", "b.tar.gz"), ("w:bz2", "b.tbz"), ("w:xz", "b.txz")):
        with tarfile.open(tmp_path / name, mode) as tar:
            tar.add(root, arcname="b")
        assert is_tar(tmp_path / name), name
        check_bundle(tmp_path / name)
        assert read_bundle(tmp_path / name).read, name
    # neither a gzip that is not a tar nor text is taken for one
    (tmp_path / "dmesg.gz").write_bytes(gzip.compress(b"x" * 600))
    (tmp_path / "dmesg.txt").write_bytes(b"x" * 600)
    (tmp_path / "empty").write_bytes(b"")
    for name in ("dmesg.gz", "dmesg.txt", "empty"):
        assert not is_tar(tmp_path / name), name
    os.mkfifo(tmp_path / "fifo")
    assert not is_tar(tmp_path / "fifo")
