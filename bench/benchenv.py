"""What makes a benchmark rerunnable on a shared host: the TCP ports it may listen on, and
the PCI addresses of the kernel lines it writes (BENCHMARKS.md, "Rerunning the benches").

Ports: every bench that starts a daemon or a server takes ``--ports A-B`` (default
``DEFAULT_PORTS``) and listens only there, the lowest port of the range that is free when
it asks; a second person's rerun uses the same ports, and a firewall rule or a busy port
is named, not a random one. ``use_ports`` also points the helpers the benches borrow from
tests/ (``tests.daemon_proc.free_port``) at the range.

Kernel lines: a bench writes to /dev/kmsg only for PCI addresses in the reserved range,
PCI domains ``fe00``-``feff`` (``BENCH_PCI_DOMAINS``), bus ``fe``, device ``00``: no real
host numbers a segment that high (x86 firmware numbers segments from 0; Hyper-V's GUID
derived domains are the one exception known, and they put their GPUs on bus 00). Tests
use the fixed ``0000:fe:00`` (tests/test_kmsg_live.py and others) and bus ``fe``/``fd`` of
a random domain (tests/api_helpers.py, tests/test_incident_e2e.py, tests/test_fleet_e2e.py):
bus ``fe`` in both, so a reader of the host's ring can tell both apart from a real GPU.
"""

from __future__ import annotations

import argparse
import http.server
import random
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# below Linux's ephemeral range (32768-60999), so no outgoing connection holds one, and
# clear of moptd's own 9477
DEFAULT_PORTS = (29400, 29499)
BENCH_PCI_DOMAINS = range(0xFE00, 0xFF00)

_range: tuple[int, int] = DEFAULT_PORTS
_given: set[int] = set()


def parse_ports(spec: str) -> tuple[int, int]:
    """``A-B`` (or one port ``A``) as (A, B); an argparse error names what is wrong."""
    lo, _, hi = spec.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ports {spec!r}: want A-B, e.g. 29400-29499") from None
    if not 1024 <= a <= b <= 65535:
        raise argparse.ArgumentTypeError(f"--ports {spec!r}: want 1024 <= A <= B <= 65535")
    return a, b


def add_ports_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--ports", type=parse_ports, default=DEFAULT_PORTS, metavar="A-B",
        help=f"listen only on TCP ports A-B (default {DEFAULT_PORTS[0]}-{DEFAULT_PORTS[1]})",
    )


def use_ports(ports: tuple[int, int]) -> None:
    """Every later ``free_port()`` here, in bench/daemon_bench.py, in tests/daemon_proc.py
    (which the benches borrow) and the running script's own ``free_port`` name (bound by
    ``from ... import free_port``) gives a port of ``ports``."""
    global _range
    _range = ports
    for name in ("__main__", "daemon_bench", "tests.daemon_proc", "tests.prometheus_proc",
                 "tests.vllm.harness"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "free_port"):
            mod.free_port = free_port


def free_port() -> int:
    """The lowest port of the range that is free now and not given out before."""
    lo, hi = _range
    for port in range(lo, hi + 1):
        if port in _given:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise SystemExit(f"no free TCP port left in --ports {lo}-{hi}")


def bench_pci(k: int | None = None) -> str:
    """A kernel-style PCI address (``fe12:fe:00``) of the reserved range; ``k`` picks one,
    None a random one (runs that share the host's ring then do not see each other's)."""
    n = len(BENCH_PCI_DOMAINS)
    domain = BENCH_PCI_DOMAINS[random.randrange(n) if k is None else k % n]
    return f"{domain:04x}:fe:00"


def bench_pcis() -> Iterator[str]:
    """Fresh reserved addresses, a random start then in turn."""
    k = random.randrange(len(BENCH_PCI_DOMAINS))
    while True:
        yield bench_pci(k)
        k += 1


def write_xid79(tag: str = "") -> tuple[str, str]:
    """An Xid 79 for a reserved address (a real line's shape, from
    tests/fixtures/incidents/xid79-gpu-then-vllm-shm-stall); (kernel bus, normalised)."""
    kernel = bench_pci()
    line = (f"<3>NVRM: Xid (PCI:{kernel}): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.")
    with open("/dev/kmsg", "w") as fh:
        fh.write(line + (f" {tag}" if tag else "") + "\n")
    return kernel, f"{kernel}.0"


@contextmanager
def metrics_endpoint(page: bytes) -> Iterator[str]:
    """An engine's stand-in on a port of the range: ``page`` on /metrics, ``{}`` elsewhere
    (its health and model probes); its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page if self.path.startswith("/metrics") else b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
