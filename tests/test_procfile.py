"""Kept-open /proc descriptors, on the real /proc of this machine."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from moptd.collectors.daemon_self import parse_stat_cpu_ticks
from moptd.proc.files import OpenFiles


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_kept_descriptor_reads_what_the_kernel_says_now():
    files = OpenFiles()
    try:
        path = Path(f"/proc/{os.getpid()}/stat")
        before = parse_stat_cpu_ticks(files.read(path))
        _burn(0.1)
        after = parse_stat_cpu_ticks(files.read(path))
        assert before is not None
        assert after is not None
        assert after > before
    finally:
        files.close()


def test_text_matches_a_fresh_open():
    files = OpenFiles()
    try:
        for name in ("meminfo", "vmstat", "loadavg", "sys/vm/swappiness"):
            got = files.read(Path("/proc", name))
            assert got.splitlines()[0].split()[0] == Path("/proc", name).read_text().split()[0]
    finally:
        files.close()


def test_a_file_larger_than_one_read_comes_whole(tmp_path):
    big = tmp_path / "big"
    text = "".join(f"key{i} {i}\n" for i in range(40_000))  # about 450 kB
    big.write_text(text)
    files = OpenFiles()
    try:
        assert files.read(big) == text
        big.write_text("short 1\n")  # rewritten in place: the same inode
        assert files.read(big) == "short 1\n"
    finally:
        files.close()


def test_a_failing_read_closes_the_descriptor_and_the_next_read_opens_again(tmp_path):
    files = OpenFiles()
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(IsADirectoryError):
        files.read(tmp_path)  # opens, but a directory cannot be read
    assert len(os.listdir("/proc/self/fd")) == fds
    with pytest.raises(FileNotFoundError):
        files.read(tmp_path / "absent")
    (tmp_path / "later").write_text("1\n")
    assert files.read(tmp_path / "later") == "1\n"
    files.close()
    assert len(os.listdir("/proc/self/fd")) == fds
