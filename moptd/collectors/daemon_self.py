"""moptd's own footprint: resident memory, CPU time, open files, threads, asyncio tasks,
and the time Python's garbage collector has taken.

A daemon on every GPU host must show that it is not the thing that grows. These are the
figures the soak benchmark watches, exported so an operator can alert on them too.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path

from moptd.collector import Collector, CollectorContext
from moptd.observations import NODE, Batch
from moptd.proc import procfs

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_SELF = Path("/proc/self")  # always this process, whatever procfs root the host reads


class DaemonSelfCollector(Collector):
    name = "self"
    default_interval = 10.0
    default_timeout = 5.0

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.gc_clock = GcClock()

    async def start(self) -> None:
        await super().start()
        gc.callbacks.append(self.gc_clock)

    async def stop(self) -> None:
        if self.gc_clock in gc.callbacks:
            gc.callbacks.remove(self.gc_clock)
        await super().stop()

    async def collect(self) -> Batch:
        tasks = len(asyncio.all_tasks())  # on the loop: the task set is the loop's own
        batch = await self.blocking(read_self, _SELF)
        batch.add("daemon.tasks", NODE, float(tasks))
        batch.add("daemon.gc_seconds", NODE, self.gc_clock.seconds)
        return batch


class GcClock:
    """A gc callback adding up the time collections take (they stop every thread)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began


def read_self(proc: Path) -> Batch:
    b = Batch()
    status = procfs.parse_keyvalue_ints(parse_status_numbers((proc / "status").read_text()))
    if "VmRSS" in status:
        b.add("daemon.resident_memory", NODE, float(status["VmRSS"] * 1024))
    if "Threads" in status:
        b.add("daemon.threads", NODE, float(status["Threads"]))
    cpu = parse_stat_cpu_ticks((proc / "stat").read_text())
    if cpu is not None:
        b.add("daemon.cpu_seconds", NODE, cpu / CLOCK_TICKS)
    b.add("daemon.open_fds", NODE, float(len(os.listdir(proc / "fd"))))
    return b


def parse_status_numbers(text: str) -> str:
    """/proc/PID/status as "key value" lines: "VmRSS:  51234 kB" -> "VmRSS 51234"."""
    out = []
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        first = rest.split()
        if first and first[0].isdigit():
            out.append(f"{key} {first[0]}")
    return "\n".join(out)


def parse_stat_cpu_ticks(text: str) -> int | None:
    """utime + stime (fields 14 and 15) of /proc/PID/stat, in clock ticks. The command name
    (field 2) is in parentheses and may hold spaces or parentheses: split after the last ')'."""
    _, sep, rest = text.rpartition(")")
    if not sep:
        return None
    fields = rest.split()
    try:
        return int(fields[11]) + int(fields[12])  # fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None
