"""Hostile bundles (issue 18, items 7 and 11): refused by name, quickly, in bounded memory.

Each case is a bundle as a ticket could carry it. `moptd replay` runs as a real
subprocess and must exit 3 with the member named, never hang, never print a traceback and
never read what a link points to; the in-process cases measure the guard's memory.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.bundle.tar_scan import TarScanError, _check_pax_records, scan_tar
from moptd.cli.bundle_guard import BundleRefused, check_bundle

REPO = Path(__file__).resolve().parents[2]
META = b"format: moptd-bundle/v1\ncaptured_at: 2026-01-01T00:00:00Z\n"


def replay(bundle: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", "replay", str(bundle)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def refused(bundle: Path, member: str) -> str:
    start = time.monotonic()
    out = replay(bundle)
    # 3: an input that could not be used (bundle spec, issue 17)
    assert out.returncode == 3, out.stdout + out.stderr
    assert f"{member}:" in out.stderr, out.stderr
    assert "bundle refused" in out.stderr
    assert "Traceback" not in out.stderr
    assert time.monotonic() - start < 30
    return out.stderr


def bundle_dir(tmp_path: Path) -> Path:
    root = tmp_path / "b"
    (root / "kernel").mkdir(parents=True)
    (root / "bundle.yaml").write_bytes(META)
    return root


def test_a_directory_bundle_never_follows_a_link_to_dev_zero(tmp_path):
    root = bundle_dir(tmp_path)
    (root / "kernel" / "dmesg.txt").symlink_to("/dev/zero")
    err = refused(root, "kernel/dmesg.txt")
    assert "symbolic link to '/dev/zero'" in err


def test_a_directory_bundle_never_prints_what_a_link_points_to(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root:SECRET-HASH:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    root = bundle_dir(tmp_path)
    (root / "kernel" / "dmesg.txt").symlink_to(secret)
    err = refused(root, "kernel/dmesg.txt")
    assert "SECRET-HASH" not in err


def test_a_fifo_in_a_directory_bundle_is_refused_not_waited_on(tmp_path):
    root = bundle_dir(tmp_path)
    os.mkfifo(root / "kernel" / "dmesg.txt")
    err = refused(root, "kernel/dmesg.txt")
    assert "FIFO" in err


def test_a_linked_folder_is_not_walked(tmp_path):
    root = bundle_dir(tmp_path)
    (root / "host").symlink_to("/proc")
    refused(root, "host")


def test_a_directory_a_thousand_levels_deep_is_refused_without_recursion(tmp_path):
    root = bundle_dir(tmp_path)
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(1100):  # short relative steps: the full path would pass PATH_MAX
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
    try:
        err = refused(root, "d/d/d")
        assert "folders deep" in err
    finally:
        remove_deep(root, "d")


def remove_deep(root: Path, name: str) -> None:
    """Undo the chain without recursion (shutil.rmtree, and so pytest's clean-up of old
    temporary folders, would hit RecursionError): pull the subtree up one level at a time."""
    fd = os.open(root, os.O_RDONLY)
    try:
        while True:
            try:
                os.rename(f"{name}/{name}", "pulled", src_dir_fd=fd, dst_dir_fd=fd)
            except FileNotFoundError:
                os.rmdir(name, dir_fd=fd)
                return
            os.rmdir(name, dir_fd=fd)
            os.rename("pulled", name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_huge_pax_header_is_refused_before_it_is_read(tmp_path):
    info = tarfile.TarInfo("b/kernel/dmesg.txt")
    info.pax_headers = {"comment": "A" * (16 << 20)}
    bundle = _tar(tmp_path / "pax.tar.gz", [(tarfile.TarInfo("b/bundle.yaml"), META), (info, b"")])
    assert bundle.stat().st_size < 256 << 10
    tracemalloc.start()
    try:
        with pytest.raises(BundleRefused, match="pax header of 16777234 bytes"):
            check_bundle(bundle)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # the 16 MiB header is never held
    assert "(after b/bundle.yaml)" in refused(bundle, "@PaxHeader")


def test_a_malformed_pax_header_never_reaches_tarfile(tmp_path):
    # Records whose lengths do not add up are what CVE-2024-6232's backtracking needed.
    bad = tarfile.TarInfo("b/PaxHeaders/dmesg.txt")
    bad.type = tarfile.XHDTYPE
    bundle = _tar(
        tmp_path / "bad.tar.gz",
        [(tarfile.TarInfo("b/bundle.yaml"), META), (bad, b"0" * 300 + b"\n")],
    )
    err = refused(bundle, "b/PaxHeaders/dmesg.txt")
    assert "pax record at byte 0" in err


def test_a_gzip_bomb_within_the_member_limits_is_refused_early(tmp_path):
    # 120 MiB of zeros: under the 128 MiB per-file limit, about 120 KiB compressed.
    bundle = tmp_path / "bomb.tar.gz"
    zeros = tarfile.TarInfo("b/kernel/dmesg.txt")
    zeros.size = 120 << 20
    with gzip.open(bundle, "wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        meta = tarfile.TarInfo("b/bundle.yaml")
        meta.size = len(META)
        tar.addfile(meta, io.BytesIO(META))
        tar.addfile(zeros, _Zeros(zeros.size))
    assert bundle.stat().st_size < 1 << 20
    start = time.process_time()
    with pytest.raises(BundleRefused, match="decompresses to over"):
        check_bundle(bundle)
    assert time.process_time() - start < 10
    refused(bundle, "b/kernel/dmesg.txt")


def test_an_ordinary_recorded_tarball_still_passes(tmp_path):
    root = bundle_dir(tmp_path)
    (root / "kernel" / "dmesg.txt").write_bytes(
        (REPO / "tests/fixtures/h200/dmesg.txt").read_bytes()
    )
    bundle = tmp_path / "ok.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(root, arcname="b")
    check_bundle(bundle)
    check_bundle(root)


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]
        n = min(len(buf), self.left)
        buf[:n] = bytes(n)
        self.left -= n
        return n


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096))
def test_the_header_scan_refuses_or_accepts_any_bytes_without_crashing(data):
    with tempfile.NamedTemporaryFile(suffix=".tar") as fh:
        fh.write(data)
        fh.flush()
        error = None
        try:
            scan_tar(Path(fh.name), 1 << 20)
        except TarScanError as exc:
            error = exc
        assert error is None or (error.member and error.reason)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.text(max_size=20), st.text(max_size=40)), max_size=8),
    st.binary(max_size=64),
)
def test_pax_records_well_formed_pass_and_tails_are_judged(records, tail):
    # Records as tarfile writes them pass; whatever bytes follow are accepted or refused,
    # never a crash.
    body = b""
    for key, value in records:
        item = f" {key.replace('=', '') or 'k'}={value}\n".encode()
        n = len(item) + 1
        while len(str(n)) + len(item) != n:
            n = len(str(n)) + len(item)
        body += str(n).encode() + item
    _check_pax_records(body, "m")
    reason = ""
    try:
        _check_pax_records(body + tail, "m")
    except TarScanError as exc:
        reason = exc.reason
    assert not reason or "pax record at byte" in reason
