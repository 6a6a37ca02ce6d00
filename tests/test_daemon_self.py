"""The daemon's own footprint, read from the real /proc/self."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
from hypothesis import given
from hypothesis import strategies as st

from moptd.collectors.daemon_self import (
    CLOCK_TICKS,
    parse_stat_cpu_ticks,
    parse_status_numbers,
    read_self,
)


def test_figures_match_what_psutil_reads():
    me = psutil.Process()
    b = read_self(Path("/proc/self"))
    got = {s.signal: s.value for s in b.samples}
    assert abs(got["daemon.resident_memory"] - me.memory_info().rss) < 16 * 2**20
    assert got["daemon.threads"] == me.num_threads()
    # listdir of /proc/self/fd opens one descriptor of its own while it reads
    assert abs(got["daemon.open_fds"] - me.num_fds()) <= 1
    times = me.cpu_times()
    assert abs(got["daemon.cpu_seconds"] - (times.user + times.system)) <= 2 / CLOCK_TICKS + 0.05


async def test_tasks_are_counted_on_the_loop(tmp_path: Path):
    from moptd.collector import CollectorContext
    from moptd.collectors.daemon_self import DaemonSelfCollector

    c = DaemonSelfCollector(CollectorContext(state_dir=tmp_path))
    sleepers = [asyncio.create_task(asyncio.sleep(10)) for _ in range(5)]
    try:
        b = await c.collect()
    finally:
        for t in sleepers:
            t.cancel()
    tasks = next(s.value for s in b.samples if s.signal == "daemon.tasks")
    assert tasks >= 6  # the five sleepers and the test itself


def test_command_names_with_spaces_and_parentheses():
    assert parse_stat_cpu_ticks("42 (a) b) (c) S 1 2 3 4 5 6 7 8 9 10 111 222 0 0") == 333
    assert parse_stat_cpu_ticks("42 no parenthesis") is None
    assert parse_stat_cpu_ticks("42 (x) S 1 2") is None


@given(st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=30),
       st.integers(0, 2**40), st.integers(0, 2**40))
def test_stat_parser_never_trips_on_the_command_name(comm, utime, stime):
    fields = ["S", *["0"] * 10, str(utime), str(stime), "0", "0"]
    assert parse_stat_cpu_ticks(f"7 ({comm}) {' '.join(fields)}") == utime + stime


@given(st.text(max_size=300))
def test_status_parser_never_raises(text):
    for line in parse_status_numbers(text).splitlines():
        _key, value = line.rsplit(" ", 1)
        assert value.isdigit()


def test_status_lines_keep_their_number():
    text = "Name:\tmoptd\nVmRSS:\t   51234 kB\nThreads:\t7\nSigQ:\t0/63\n"
    assert parse_status_numbers(text) == "VmRSS 51234\nThreads 7"


async def test_gc_time_comes_from_the_real_collector(tmp_path: Path):
    import gc

    from moptd.collector import CollectorContext
    from moptd.collectors.daemon_self import DaemonSelfCollector

    c = DaemonSelfCollector(CollectorContext(state_dir=tmp_path))
    await c.start()
    try:
        assert c.gc_clock in gc.callbacks
        junk = [[i] for i in range(200_000)]  # a full collection has these to walk
        gc.collect()
        del junk
        b = await c.collect()
    finally:
        await c.stop()
    assert c.gc_clock not in gc.callbacks
    got = {s.signal: s.value for s in b.samples}
    assert got["daemon.gc_seconds"] > 0
