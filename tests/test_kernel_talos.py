"""talosctl dmesg lines ("NODE: kern:     err: [RFC3339]: msg") and the lone SXid follow-up.

The lines are those of tests/fixtures/incidents/talos-a100x8-xid62-lone-sxid-severity1
(NVIDIA/open-gpu-kernel-modules#446, a real Talos node; SOURCE.md there).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.bundle.classify import split
from moptd.kernel.logparse import parse_kernel_log, parse_line
from moptd.kernel.patterns import KernelMatcher

LOG = (
    Path(__file__).parent
    / "fixtures/incidents/talos-a100x8-xid62-lone-sxid-severity1/kernel/dmesg.txt"
).read_text(encoding="utf-8")


def test_talos_lines_keep_level_time_and_message():
    recs = parse_kernel_log(LOG)
    assert [r.fmt for r in recs] == ["talos"] * 7
    assert [r.level for r in recs] == [4, 3, 4, 3, 4, 4, 4]  # warning, err (padded)
    assert recs[1].text.startswith("nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007, Severity 1")
    assert recs[0].t is not None
    assert abs(recs[0].t - 1776893120.458998) < 1e-3


def test_lone_severity_follow_up_stands_for_the_sxid_and_says_so():
    m = KernelMatcher()
    got = [x for r in parse_kernel_log(LOG) for x in m.feed(r.text)]
    sxid = [x for x in got if x.stream == "kernel.sxid"]
    assert len(sxid) == 1  # the Data line is its detail, not a second SXid
    assert sxid[0].fields["fatal"] is True
    assert sxid[0].fields["headerless"] is True
    assert [x.stream for x in got].count("kernel.xid") == 3


def test_a_header_is_not_headerless():
    m = KernelMatcher()
    got = m.feed(
        "[6781753.404587] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 "
        "LTSSM Fault Up"
    )
    assert "headerless" not in got[0].fields


def test_a_talos_paste_is_read_as_a_kernel_log():
    assert [s.kind for s in split(LOG)] == ["kernel-log"]


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=40),
    st.sampled_from(["kern", "user", "bogus"]),
    st.sampled_from(["err", "warning", "info", "xyz"]),
    st.text(max_size=80),
)
def test_talos_shaped_lines_never_raise(node: str, fac: str, lvl: str, msg: str):
    line = f"{node}: {fac}: {lvl}: [2026-04-22T21:25:20.466440686Z]: {msg}"
    rec = parse_line(line)
    if rec is not None and rec.fmt == "talos":
        assert rec.level is not None
        assert rec.facility is not None
