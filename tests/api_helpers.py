"""Helpers for tests that talk to a real daemon: a unique Xid 79 line, polling, SSE."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moptd.cli import client


def kmsg_writable() -> bool:
    return os.access("/dev/kmsg", os.R_OK | os.W_OK)


def write_xid79() -> tuple[str, str]:
    """Write an Xid 79 for a PCI address no real GPU has (a random PCI domain, so runs that
    share the host's kernel log do not see each other's lines); (kernel bus, normalised)."""
    domain = random.randint(0x1000, 0xFFFE)
    bus = random.randint(0x01, 0xFE)
    kernel = f"{domain:04x}:{bus:02x}:00"
    line = f"<3>NVRM: Xid (PCI:{kernel}): 79, pid=4242, name=python3, GPU has fallen off the bus."
    with open("/dev/kmsg", "w") as fh:
        fh.write(line + "\n")
    return kernel, f"{kernel}.0"


def get(sock: Path, path: str, timeout: float = 5.0) -> tuple[int, Any]:
    return client.request(sock, "GET", path, timeout)


def wait_for(fn: Callable[[], Any], timeout: float = 10.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        time.sleep(step)


def wait_socket(sock: Path, proc: subprocess.Popen[bytes] | None, timeout: float = 30.0) -> None:
    # 30 s, as DaemonProcess.wait_metrics: under the two CI lanes a daemon that opens its
    # socket in about a second on a quiet VM once took more than 10 (lane run N).
    def up() -> bool:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"moptd exited with {proc.returncode}")
        # a plain connect first: the client leaves a socket unclosed when connect fails
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(sock))
            except OSError:
                return False
        return get(sock, "/v1/health", 5.0)[0] == 200

    wait_for(up, timeout)


def sse_events(
    sock: Path, until: Callable[[dict[str, Any]], bool], timeout: float
) -> list[dict[str, Any]]:
    """Read transition events from /v1/events over the Unix socket until one satisfies
    `until` (or the time is up)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(sock))
    s.sendall(b"GET /v1/events HTTP/1.1\r\nHost: localhost\r\n\r\n")
    buf = b""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while not any(until(e) for e in out) and time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                for line in block.split(b"\n"):
                    # chunked encoding puts a size line before each block; skip it
                    if line.startswith(b"data: "):
                        out.append(json.loads(line[6:]))
    finally:
        s.close()
    return out


def explain(config: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", "explain", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "120", "TZ": "UTC"},
    )
