"""A small synchronous client for the daemon's Unix-socket API."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any


class DaemonUnreachable(Exception):
    pass


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def request(
    socket_path: Path, method: str, path: str, timeout: float = 5.0, body: bytes | None = None
) -> tuple[int, Any]:
    conn = _UnixConnection(socket_path, timeout)
    try:
        conn.request(method, path, body=body, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise DaemonUnreachable(f"{socket_path}: {exc}") from exc
    finally:
        conn.close()
    try:
        return resp.status, json.loads(data) if data else None
    except json.JSONDecodeError as exc:
        raise DaemonUnreachable(f"{socket_path}: not a moptd API ({exc})") from exc


def get_json(socket_path: Path, path: str, timeout: float = 5.0) -> Any:
    status, body = request(socket_path, "GET", path, timeout)
    if status != 200:
        raise DaemonUnreachable(f"{socket_path}{path}: HTTP {status}")
    return body
