"""systemd notifications (READY, WATCHDOG, STOPPING) without requiring systemd-python.

The protocol is one datagram to $NOTIFY_SOCKET; an abstract socket name starts with '@'.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """Half the watchdog period systemd asked for, or None when there is no watchdog."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None
