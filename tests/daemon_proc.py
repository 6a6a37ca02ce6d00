"""Start a real `moptd run` subprocess on free loopback ports for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def newest_kmsg_seq() -> int | None:
    """The sequence number of the newest record in this host's kernel log; None when
    /dev/kmsg cannot be read here."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        last: int | None = None
        while True:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                return last
            except BrokenPipeError:
                continue  # overwritten while we read
            last = int(data.split(b",", 2)[1])
    finally:
        os.close(fd)


def seed_kernel_position(state_dir: Path) -> None:
    """Commit the kernel log's newest record as the daemon's position, as if it had
    followed this boot until now: its first start then reads only what comes next, not
    the records other tests left in this boot's ring."""
    from moptd.findings.db import FILE_NAME, FindingsDB
    from moptd.kernel.kmsg import read_boot_id

    seq = newest_kmsg_seq()
    if seq is None:
        return
    with FindingsDB(state_dir / FILE_NAME) as db:
        db.save_position("kmsg", read_boot_id(), seq).result(30)


class DaemonProcess:
    def __init__(self, tmp: Path, extra: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, kernel_from_now: bool = True,
                 wrap: tuple[str, ...] = (), host: str = "127.0.0.1") -> None:
        """kernel_from_now: a new state directory starts with the kernel log's position at
        its newest record (see seed_kernel_position); False for a true first start, which
        reads the whole boot. wrap: a command line prefix (``ip netns exec NS``) and host:
        the exporter's address there."""
        self.wrap = wrap
        self.host = host
        self.kernel_from_now = kernel_from_now
        self.port = free_port()
        self.state_dir = tmp / "state"
        self.socket = tmp / "api.sock"
        config: dict[str, Any] = {
            "state_dir": str(self.state_dir),
            "exporter": {"listen": f"{host}:{self.port}"},
            "api": {"socket": str(self.socket)},
        }
        for key, value in (extra or {}).items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key].update(value)
            else:
                config[key] = value
        self.config_path = tmp / "moptd.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = tmp / "moptd.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, *args: str) -> DaemonProcess:
        if self.kernel_from_now and not (self.state_dir / "findings.db").exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            seed_kernel_position(self.state_dir)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [*self.wrap, sys.executable, "-m", "moptd", "run", "--config", str(self.config_path),
             *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
        )
        return self

    def wait_metrics(self, timeout: float = 30.0) -> str:
        # 30 s, as the benches allow: under the two CI lanes a start that takes 1 s on a
        # quiet VM once took more than 12 (tests/test_board_history_daemon.py, 2026-12-07).
        # A start time is a bench's figure, not a test's.
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"moptd exited with {self.proc.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/metrics", timeout=2) as resp:
                    return resp.read().decode()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
            return resp.read().decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
