"""Ask a container engine's daemon over its unix socket (blocking; a collector's thread).

Docker and Podman serve the Docker Engine API on a unix socket: ``GET /_ping`` answers
``OK`` when the daemon is up, ``GET /info`` describes it (its ``Runtimes`` and
``CDISpecDirs``). containerd and CRI-O serve gRPC there; that their socket accepts a
connection is the answer moptd asks of them (a socket file left by a dead daemon refuses
it). Every call is bounded in time (one deadline for connect, send and the whole reply)
and in size; a failure is an ``EngineUnreachable`` whose message says why in words.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

MAX_REPLY_BYTES = 1 << 20  # docker's /info is a few KiB; a reply past this is no engine's
_CHUNK = 65536


class EngineUnreachable(OSError):
    """No usable answer from the socket (the message says why)."""


class EngineRefused(EngineUnreachable):
    """The socket's permissions keep this process out (EACCES): whether a daemon is behind
    it is a question for ``listening``."""


def _connect(path: Path, deadline: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.connect(str(path))
    except FileNotFoundError:
        sock.close()
        raise EngineUnreachable(f"{path}: no such socket") from None
    except PermissionError:
        sock.close()
        raise EngineRefused(f"{path}: permission denied") from None
    except ConnectionRefusedError:
        sock.close()
        raise EngineUnreachable(f"{path}: connection refused (no daemon listens)") from None
    except TimeoutError:
        sock.close()
        raise EngineUnreachable(f"{path}: no answer in time") from None
    except OSError as exc:
        sock.close()
        raise EngineUnreachable(f"{path}: {exc.strerror or exc}") from None
    return sock


MAX_NET_UNIX_LINES = 200_000
_LISTENING = 0x10000  # __SO_ACCEPTCON in the Flags column


def listening(net_unix: Path, path: str) -> bool | None:
    """Does a socket bound to ``path`` listen, by /proc/net/unix (readable by anyone, so it
    answers where the socket itself refuses us)? None when the table cannot be read.

    A path is the one the daemon bound: /var/run/docker.sock and /run/docker.sock (where
    /var/run links to /run) are one socket."""
    wanted = {path, os.path.realpath(path)}
    name = os.path.basename(path)
    try:
        with net_unix.open(encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh):
                if n > MAX_NET_UNIX_LINES:
                    break
                fields = line.split(maxsplit=7)
                if len(fields) < 8 or not fields[7].rstrip("\n").endswith(name):
                    continue
                bound = fields[7].rstrip("\n")
                try:
                    flags = int(fields[3], 16)
                except ValueError:
                    continue
                if flags & _LISTENING and (bound in wanted or os.path.realpath(bound) in wanted):
                    return True
    except OSError:
        return None
    return False


MAX_PIDS = 100_000


def process_runs(procfs: Path, comm: str) -> bool | None:
    """Does a process of that name (/proc/PID/comm) run? None when /proc cannot be listed.

    Asked before a socket is: connecting to a socket systemd holds for a service that is
    not running (docker.socket, podman.socket) would start the service, and a reader must
    not start anything."""
    try:
        entries = os.scandir(procfs)
    except OSError:
        return None
    with entries:
        for n, entry in enumerate(entries):
            if n > MAX_PIDS:
                break
            if not entry.name.isdigit():
                continue
            try:
                with open(os.path.join(entry.path, "comm"), "rb") as fh:
                    if fh.read(64).rstrip(b"\n").decode("utf-8", "replace") == comm:
                        return True
            except OSError:
                continue  # gone since the listing, or hidden (hidepid)
    return False


def accepts(path: Path, timeout: float) -> None:
    """Raise EngineUnreachable unless a daemon accepts a connection on ``path``."""
    _connect(path, time.monotonic() + timeout).close()


def get(path: Path, target: str, timeout: float, max_bytes: int = MAX_REPLY_BYTES) -> bytes:
    """``GET target`` over the unix socket at ``path``: the body of a 200 reply.

    HTTP/1.0, so the daemon closes the connection after one unchunked reply."""
    deadline = time.monotonic() + timeout
    sock = _connect(path, deadline)
    try:
        request = f"GET {target} HTTP/1.0\r\nHost: localhost\r\nUser-Agent: moptd\r\n\r\n"
        sock.sendall(request.encode("ascii"))
        reply = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineUnreachable(f"{path}: GET {target}: no full reply in {timeout:g}s")
            sock.settimeout(left)
            try:
                chunk = sock.recv(_CHUNK)
            except TimeoutError:
                raise EngineUnreachable(
                    f"{path}: GET {target}: no full reply in {timeout:g}s"
                ) from None
            if not chunk:
                break
            reply += chunk
            if len(reply) > max_bytes:
                raise EngineUnreachable(f"{path}: GET {target}: reply over {max_bytes} bytes")
    except OSError as exc:
        if isinstance(exc, EngineUnreachable):
            raise
        raise EngineUnreachable(f"{path}: GET {target}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    return _body(bytes(reply), f"{path}: GET {target}")


def _body(reply: bytes, what: str) -> bytes:
    head, sep, body = reply.partition(b"\r\n\r\n")
    if not sep:
        raise EngineUnreachable(f"{what}: not an HTTP reply")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise EngineUnreachable(f"{what}: not an HTTP reply: {status_line[:80]!r}")
    if parts[1] != "200":
        raise EngineUnreachable(f"{what}: HTTP {status_line[len(parts[0]) + 1 :][:80]}")
    return body


def get_json(path: Path, target: str, timeout: float) -> Any:
    body = get(path, target, timeout)
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise EngineUnreachable(f"{path}: GET {target}: the reply is not JSON") from None
