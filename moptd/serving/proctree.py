"""CPU time of the processes in one process group (the managed server's session)."""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = float(os.sysconf("SC_CLK_TCK"))


def parse_stat(text: str) -> tuple[str, int, int, float] | None:
    """/proc/PID/stat -> (comm, ppid, pgrp, cpu seconds); None when it does not parse."""
    head, sep, rest = text.rpartition(")")
    if not sep or "(" not in head:
        return None
    comm = head.split("(", 1)[1]
    f = rest.split()
    try:
        return comm, int(f[1]), int(f[2]), (int(f[11]) + int(f[12])) / CLK_TCK
    except (IndexError, ValueError):
        return None


def group_cpu(procfs: Path, pgid: int) -> dict[int, tuple[str, float]]:
    """pid -> (comm, cpu seconds) for every process whose process group is ``pgid``."""
    out: dict[int, tuple[str, float]] = {}
    try:
        entries = os.listdir(procfs)
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        try:
            text = (procfs / name / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        st = parse_stat(text)
        if st is not None and st[2] == pgid:
            out[int(name)] = (st[0], st[3])
    return out


class BusiestCpu:
    """The busiest process's CPU use between two calls, as a share of one core."""

    def __init__(self) -> None:
        self._prev: dict[int, float] = {}
        self._prev_t: float | None = None

    def update(self, now: float, cpu: dict[int, tuple[str, float]]) -> float | None:
        result: float | None = None
        if self._prev_t is not None and now > self._prev_t:
            dt = now - self._prev_t
            shares = [
                (secs - self._prev[pid]) / dt
                for pid, (_, secs) in cpu.items()
                if pid in self._prev and secs >= self._prev[pid]
            ]
            result = max(shares, default=None)
        self._prev = {pid: secs for pid, (_, secs) in cpu.items()}
        self._prev_t = now
        return result
