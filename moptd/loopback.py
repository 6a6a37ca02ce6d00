"""Whether a host name or address is this host's loopback (the trust boundary of the
serving endpoints and the TCP API: docs/security.md)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
