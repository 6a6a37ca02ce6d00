"""Keep every process of a test run off the host's own moptd.

A developer may have `moptd run` going on its defaults (the README's Quick start) while the
tests run. A test that falls back to a default socket, state dir or port then talks to that
daemon, or opens its database, and fails or, worse, passes on its answers. Every test names
its own; this audit hook finds one that does not.

tests/conftest.py installs it in the test process and puts this directory first on
PYTHONPATH, so every Python subprocess that inherits the environment loads it as
`sitecustomize` too (then the one it shadows, if any). A process appends what it reached to
the file named by MOPTD_TEST_GUARD_LOG; conftest fails the test that was running. Standard
library only: a vLLM venv without moptd loads it as well.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import ipaddress
import json
import os
import sys
from typing import Any

ENV_LOG = "MOPTD_TEST_GUARD_LOG"
ENV_PLACES = "MOPTD_TEST_GUARD_PLACES"  # JSON: the default directories, absolute
ENV_PORT = "MOPTD_TEST_GUARD_PORT"  # the exporter's default port, on loopback


def _under(path: Any, places: tuple[str, ...]) -> bool:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or not path.startswith("/"):
        return False
    return any(path == p or path.startswith(p + "/") for p in places)


def _loopback_port(address: Any, port: int) -> bool:
    if not (isinstance(address, tuple) and len(address) >= 2 and address[1] == port):
        return False
    if address[0] in ("", "localhost"):
        return True
    try:
        ip = ipaddress.ip_address(address[0])
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def install(places: tuple[str, ...], port: int, log: str) -> None:
    def report(what: str) -> None:
        line = f"{what} by pid {os.getpid()} ({' '.join(sys.argv)[:200]})\n"
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        try:
            if event in ("socket.connect", "socket.bind"):
                if _under(args[1], places) or _loopback_port(args[1], port):
                    report(f"{event} {args[1]!r}")
            elif event in ("open", "sqlite3.connect") and _under(args[0], places):
                report(f"{event} {args[0]!r}")
        except OSError:  # a guard never breaks the process it watches (nor its log)
            pass

    sys.addaudithook(hook)


def _install_from_environment() -> None:
    log = os.environ.get(ENV_LOG)
    if not log:
        return
    try:
        places = tuple(json.loads(os.environ[ENV_PLACES]))
        port = int(os.environ[ENV_PORT])
    except (KeyError, ValueError):
        return
    install(places, port, log)


def _load_the_shadowed_one() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    _install_from_environment()
    _load_the_shadowed_one()
