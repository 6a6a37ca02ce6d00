"""Host collector and the /proc parsers it shares with bundle replay."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moptd.collector import CollectorContext
from moptd.collectors.host import HostCollector
from moptd.proc import procfs
from tests.conftest import FIXTURES


def test_meminfo_of_the_h200_host():
    mem = procfs.parse_meminfo((FIXTURES / "h200/meminfo").read_text())
    assert mem["MemTotal"] > 100 * 2**30
    assert mem["MemAvailable"] <= mem["MemTotal"]
    assert "HugePages_Total" in mem  # a count, not kB


def test_df_of_the_h200_host():
    rows = procfs.parse_df((FIXTURES / "h200/df.txt").read_text())
    root = next(r for r in rows if r["mount"] == "/")
    assert root["size"] == 264212084 * 1024
    assert root["available"] == 67092104 * 1024


def test_swappiness_file():
    assert procfs.parse_int((FIXTURES / "h200/swappiness").read_text()) == 60


def test_cpu_times():
    text = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n"
    assert procfs.parse_cpu_times(text) == (150.0, 1000.0)
    assert procfs.parse_cpu_times("garbage") is None


@given(st.text(max_size=2000))
def test_parsers_never_raise_on_garbage(text):
    procfs.parse_meminfo(text)
    procfs.parse_keyvalue_ints(text)
    procfs.parse_cpu_times(text)
    procfs.parse_btime(text)
    procfs.parse_loadavg(text)
    procfs.parse_int(text)
    procfs.parse_df(text)


_KEYS = ["MemTotal", "MemAvailable", "SwapFree", "pswpin", "pswpout", "nr_free_pages"]
_line = st.tuples(
    st.sampled_from(["", "", " ", "x"]),  # a key inside a longer word is not that key
    st.sampled_from([*_KEYS, "Other", "pswpin:", ""]),
    st.sampled_from([":", "", " ", "\t"]),
    st.sampled_from([" ", "  ", "\t", ""]),
    st.one_of(st.integers(-5, 2**50).map(str), st.sampled_from(["", "x", "1.5", "١"])),
    st.sampled_from(["", " kB", " kB ", " 7"]),
).map("".join)


# Keys that are parts of others or of a line's value, and ones no line can hold; line
# breaks other than "\n" (str.splitlines cuts at them too; the keyed read then reads all).
_ASKED = [*_KEYS, "Mem", "pswp", "1", "", "in\nx"]
_BREAK = st.sampled_from(["\n", "\n", "\n", "\r\n", "\r", "\x0c", "\u2028"])


@given(
    st.lists(st.tuples(_line, _BREAK).map("".join), max_size=30).map("".join),
    st.sets(st.sampled_from(_ASKED)),
)
def test_reading_only_some_keys_gives_the_same_values_as_reading_all(text, keys):
    def only(d: dict[str, int]) -> dict[str, int]:
        return {k: v for k, v in d.items() if k in keys}

    assert procfs.parse_meminfo(text, keys) == only(procfs.parse_meminfo(text))
    assert procfs.parse_keyvalue_ints(text, keys) == only(procfs.parse_keyvalue_ints(text))


def test_the_real_proc_files_read_selectively():
    for name, parse in (("meminfo", procfs.parse_meminfo), ("vmstat", procfs.parse_keyvalue_ints)):
        text = Path("/proc", name).read_text()
        full = parse(text)
        keys = set(list(full)[:3])
        assert parse(text, keys) == {k: full[k] for k in keys}


async def test_collector_on_this_host(tmp_path):
    c = HostCollector(CollectorContext(state_dir=tmp_path,
                                       global_options={"watch_paths": ("/", "/nonexistent")}))
    b1 = await c.collect()
    await asyncio.sleep(0.2)  # let the CPU jiffy counters move
    b2 = await c.collect()
    got = {(s.signal, s.labels): s.value for s in b2.samples}
    assert got[("node.memory_total", ())] > 0
    assert got[("node.cpu_count", ())] == os.cpu_count()
    assert 0.0 <= got[("node.cpu_util", ())] <= 1.0
    assert ("node.disk_available", (("path", "/"),)) in got
    assert ("node.disk_available", (("path", str(tmp_path)),)) in got
    assert not any(lab == (("path", "/nonexistent"),) for _, lab in got)
    assert not any(s.signal == "node.cpu_util" for s in b1.samples), "needs two readings"
    await c.stop()


async def test_collector_on_a_recorded_procfs(tmp_path):
    proc = tmp_path / "proc"
    (proc / "sys/vm").mkdir(parents=True)
    shutil.copy(FIXTURES / "h200/meminfo", proc / "meminfo")
    shutil.copy(FIXTURES / "h200/swappiness", proc / "sys/vm/swappiness")
    (proc / "stat").write_text("cpu  1 0 1 10 0 0 0 0 0 0\nbtime 1795969000\n")
    (proc / "vmstat").write_text("pswpin 3\npswpout 4\n")
    (proc / "loadavg").write_text("0.50 0.40 0.30 1/100 42\n")
    c = HostCollector(CollectorContext(procfs=proc, state_dir=tmp_path))
    b = await c.collect()
    got = {s.signal: s.value for s in b.samples if not s.labels}
    mem = procfs.parse_meminfo((FIXTURES / "h200/meminfo").read_text())
    assert got["node.memory_total"] == mem["MemTotal"]
    assert got["node.swappiness"] == 60
    assert got["node.swap_in"] == 3 * os.sysconf("SC_PAGE_SIZE")
    assert got["node.load5"] == 0.40
    assert got["node.boot_time"] == 1795969000
    # rewritten in place, as the kernel's files are: the next run reads the new text
    (proc / "stat").write_text("cpu  4 0 2 13 0 0 0 0 0 0\nbtime 1795969000\n")
    (proc / "vmstat").write_text("pswpin 5\npswpout 4\n")
    b = await c.collect()
    got = {s.signal: s.value for s in b.samples if not s.labels}
    assert got["node.cpu_util"] == pytest.approx(4 / 7)
    assert got["node.swap_in"] == 5 * os.sysconf("SC_PAGE_SIZE")
    await c.stop()
