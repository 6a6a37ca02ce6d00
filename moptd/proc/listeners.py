"""Who holds a listening TCP port: /proc/net/tcp{,6} and the processes' socket descriptors.

Used when moptd itself cannot bind its exporter or API port, so the message names the
process in the way (and says whether it is another moptd) instead of a bare EADDRINUSE.
As a non-root user the descriptors of other users' processes are unreadable: then the
holder is unknown, and the message says so rather than guessing.
"""

from __future__ import annotations

import os
from pathlib import Path

from moptd.proc.info import ProcessInfo, process_info

_LISTEN = "0A"  # TCP_LISTEN in include/net/tcp_states.h, as /proc/net/tcp prints it


def is_moptd(p: ProcessInfo) -> bool:
    named = any(os.path.basename(a) == "moptd" for a in p.cmdline.split()[:3])
    return p.name == "moptd" or named or "-m moptd" in p.cmdline


def listening_sockets(text: str, port: int) -> dict[int, int]:
    """Socket inode -> owner uid of the LISTEN entries on `port` in a /proc/net/tcp or
    tcp6 text. Lines that do not have the kernel's layout are skipped."""
    sockets: dict[int, int] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        _, _, hexport = fields[1].rpartition(":")
        try:
            if int(hexport, 16) == port:
                sockets[int(fields[9])] = int(fields[7])
        except ValueError:
            continue
    return sockets


def listening_inodes(text: str, port: int) -> set[int]:
    """Socket inodes of the LISTEN entries on `port` in a /proc/net/tcp or tcp6 text."""
    return set(listening_sockets(text, port))


def _sockets(port: int, proc: Path) -> dict[int, int]:
    sockets: dict[int, int] = {}
    for name in ("tcp", "tcp6"):
        try:
            sockets |= listening_sockets((proc / "net" / name).read_text(), port)
        except OSError:
            continue
    return sockets


def port_holders(port: int, proc: Path = Path("/proc")) -> list[ProcessInfo]:
    """Processes with a descriptor on a socket listening on `port` (any address)."""
    inodes = set(_sockets(port, proc))
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    holders: list[ProcessInfo] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
        except OSError:
            continue  # gone, or another user's process
        for fd in fds:
            try:
                target = os.readlink(entry / "fd" / fd)
            except OSError:
                continue
            if target in wanted:
                holder = process_info(int(entry.name), proc)
                if holder is not None:  # gone meanwhile
                    holders.append(holder)
                break
    return holders


def port_held_by_unit(port: int, unit: str, proc: Path = Path("/proc")) -> bool:
    """Whether the listeners on `port` belong to the systemd `unit` (its main process or
    its children, by their cgroup), so that a busy port is the unit's own and no conflict.

    Root sees the holders' descriptors. An unprivileged moptd cannot read the descriptors
    of another user's processes (moptd-serving@ runs as moptd-serving), but /proc/net/tcp
    names each socket's owner uid and /proc/PID/cgroup is readable: then the port is the
    unit's when one uid owns its sockets and every process of that uid runs in the unit.
    Anything less certain (no listener, a second owner, a process of that uid elsewhere,
    such as another serving instance) answers False, and the conflict stays reported."""
    sockets = _sockets(port, proc)
    if not sockets or not unit:
        return False
    holders = port_holders(port, proc)
    if holders:
        return all(h.unit == unit for h in holders)
    owners = set(sockets.values())
    if len(owners) != 1:
        return False
    owner = owners.pop()
    of_owner = [p for p in _processes(proc) if p.uid == owner]
    return bool(of_owner) and all(p.unit == unit for p in of_owner)


def _processes(proc: Path) -> list[ProcessInfo]:
    out: list[ProcessInfo] = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            info = process_info(int(entry.name), proc)
            if info is not None:  # gone meanwhile
                out.append(info)
    return out


def describe_holders(port: int, proc: Path = Path("/proc")) -> str:
    """One phrase for an error message: who holds the port."""
    holders = port_holders(port, proc)
    if not holders:
        return "held by a process this user cannot see (run as root to name it: ss -ltnp)"
    parts = [f"pid {h.pid} ({h.cmdline or h.name})" for h in holders[:3]]
    text = "held by " + ", ".join(parts)
    if any(is_moptd(h) for h in holders):
        text += ": another moptd is running"
    return text
