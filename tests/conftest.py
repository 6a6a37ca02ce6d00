"""Shared test helpers, and the guard that keeps every test off the host's own moptd."""

from __future__ import annotations

import ipaddress
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moptd.config import default_api_socket, default_state_dir

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def require_tool(name: str) -> str:
    """The tool's path; skip (or fail in CI, where MOPTD_REQUIRE_TOOLS=1) when absent."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("MOPTD_REQUIRE_TOOLS"):
            pytest.fail(f"{name} is required in CI but not installed")
        pytest.skip(f"{name} not installed")
    return path


# --- the host's own moptd is out of bounds ---------------------------------------------
# A user who follows the README starts `moptd run` on the defaults, then runs the tests: a
# test that falls back to a default then talks to that daemon (or writes its database) and
# fails, or worse, passes on its answers. Every test names its own socket, state dir and
# port; this audit hook catches one that does not, in this process (subprocesses are the
# test's own to configure). The defaults are read once, before any test moves HOME.
DEFAULT_PORT = 9477
_DEFAULT_PLACES = tuple(
    {str(default_api_socket().parent), str(default_state_dir()), "/run/moptd", "/var/lib/moptd"}
)
_reached: list[str] = []


def _under_default(path: Any) -> bool:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or not path.startswith("/"):
        return False
    return any(path == p or path.startswith(p + "/") for p in _DEFAULT_PLACES)


def _loopback_default_port(address: Any) -> bool:
    if not (isinstance(address, tuple) and len(address) >= 2 and address[1] == DEFAULT_PORT):
        return False
    host = address[0]
    if host in ("", "localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in ("socket.connect", "socket.bind"):
        address = args[1]
        if _under_default(address) or _loopback_default_port(address):
            _reached.append(f"{event} {address!r}")
    elif event == "open" and _under_default(args[0]):
        _reached.append(f"open {args[0]!r}")
    elif event == "sqlite3.connect" and _under_default(args[0]):
        _reached.append(f"sqlite3.connect {args[0]!r}")


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _keep_off_the_hosts_moptd() -> Iterator[None]:
    _reached.clear()
    yield
    if _reached:
        found, _reached[:] = list(_reached), []
        pytest.fail(
            "this test reached the host's own moptd (its default socket, state dir or port "
            f"{DEFAULT_PORT}); name a socket, state dir and port of the test's own: "
            + "; ".join(found[:5]),
            pytrace=False,
        )
