"""Every Xid / SXid case two peer daemons assert, run through moptd's kernel parsers.

The lines are those of leptonai/gpud's and NVIDIA/NVSentinel's tests, copied verbatim
into tests/fixtures/kernel-peers/ (SOURCE.md names file, commit and every adaptation).
Each case holds the matches a careful reading of the line expects: the code and PCI
address as printed; for NVLink5 (Xid 144-150) the unit, the line's own severity word,
the link (``Link -1``: no particular link) and the intrinfo / error-status words; for Xid
154 the recovery action it changes from and to; for an SXid whether the line says Fatal.
Where gpud asserts a field (kmsg_extended_test.go) the expectation is the same value.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.kernel.attribution import records_to_events
from moptd.kernel.logparse import parse_kernel_log, parse_line
from moptd.kernel.patterns import KernelMatcher, Match, parse_xid

PEERS = Path(__file__).parent / "fixtures" / "kernel-peers"


def _cases(name: str) -> list[dict[str, Any]]:
    with (PEERS / name).open() as f:
        return [json.loads(line) for line in f if line.strip()]


CASES = _cases("gpud-cases.jsonl") + _cases("nvsentinel-cases.jsonl")


def _matches(text: str) -> list[Match]:
    """A case's text as a fresh log: each line through the format parser, then matched."""
    m = KernelMatcher()
    out: list[Match] = []
    for rec in parse_kernel_log(text):
        out.extend(m.feed(rec.text))
    return out + m.flush()


def test_the_peer_tables_are_all_there():
    # 127 gpud lines (xid/, sxid/, nvlink/ tests) + 33 NVSentinel lines (csv_test.go,
    # sxid_handler_test.go, gpufallen_handler_test.go); most give a match, the rest are
    # the peers' negative cases
    assert len(CASES) == 160
    assert sum(1 for c in CASES if c["expect"]) == 149


@pytest.mark.parametrize("case", CASES, ids=[f"{c['source'].split()[-1]}" for c in CASES])
def test_peer_case(case: dict[str, Any]):
    got = _matches(case["line"])
    assert [m.stream for m in got] == [e["stream"] for e in case["expect"]], case["line"]
    for m, want in zip(got, case["expect"], strict=True):
        for key, value in want.items():
            if key == "stream":
                continue
            assert m.fields.get(key, "<absent>") == value, (key, case["line"])
        if m.stream == "kernel.xid" and "nvlink_unit" not in want:
            assert "nvlink_unit" not in m.fields  # no NVLink5 tail read into other lines
        if m.stream == "kernel.xid" and "recovery_action" not in want:
            assert "recovery_action" not in m.fields


def test_nvlink5_columns_padded_by_the_driver():
    # gpud kmsg_test.go TestMatch: the driver's own padding between unit, severity and XC
    f = parse_xid(
        "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 "
        "Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    )
    assert f is not None
    assert (f["severity"], f["nvlink_unit"], f["link"], f["intrinfo"]) == (
        "fatal",
        "NETIR_LINK_EVT",
        1,
        "0x021425c6",
    )
    assert (f["nvlink_xc"], f["error_status"], f["link_scope"]) == (0, "0x00000000", "one_link")


def test_link_minus_one_names_no_link():
    # gpud kmsg_extended_test.go: "Link -1" is an error of no particular link
    f = parse_xid(
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 "
        "0x00000000 0x00000000 0x00000000 0x00000000)"
    )
    assert f is not None
    assert f["link"] is None
    assert f["link_scope"] == "no_particular_link"
    assert (f["nvlink_unit"], f["severity"]) == ("NETIR", "fatal")


def test_xid154_back_to_none_is_readable():
    # NVSentinel csv_test.go "XID 154 recovery action returned to None"
    f = parse_xid(
        "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset "
        "Required) to 0x0 (None)"
    )
    assert f is not None
    assert (f["recovery_action"], f["recovery_action_code"]) == ("None", 0)
    assert (f["previous_recovery_action"], f["previous_recovery_action_code"]) == (
        "GPU Reset Required",
        1,
    )


def test_sxid_follow_up_lines_belong_to_their_sxid():
    # NVIDIA/nvtrust#124: a real NVSwitch burst, header + Severity + Data per report. The
    # paste starts inside a report (its first Data line's header is not in it): that line
    # stands for its SXid once.
    events = records_to_events(parse_kernel_log((PEERS / "nvtrust-124-sxid.dmesg").read_text()))
    sxids = [e for e in events if e.stream == "kernel.sxid"]
    details = [e for e in events if e.stream == "kernel.sxid_detail"]
    assert len(events) == 8
    assert [(e.fields["code"], e.fields["link"], e.fields["fatal"]) for e in sxids] == [
        (22013, None, None),  # the Data line of a report whose header came before the paste
        (22013, 44, False),
        (22013, 45, False),
        (22013, 46, False),
    ]
    assert {e.fields["pci_bus_id"] for e in events} == {"0000:04:00.0"}
    assert [e.fields.get("engine_instance") for e in details] == [44, None, 45, None]
    assert [e.fields.get("severity_level") for e in details] == [0, None, 0, None]
    assert details[1].fields["data"][:2] == ["0x0000002c", "0x0000002c"]


def test_fatal_sxid_is_recognisable():
    # gpud sxid/kmsg_test.go; NVSentinel sxid_handler_test.go
    [m] = _matches(
        "[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 "
        "LTSSM Fault Up"
    )
    assert (m.stream, m.fields["fatal"], m.fields["severity"], m.fields["link"]) == (
        "kernel.sxid",
        True,
        "fatal",
        30,
    )
    # a Severity line without its header: NVSWITCH_ERROR_SEVERITY_FATAL is 1
    [m] = _matches(
        "[38889.018130] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 12033, Severity 1 Engine "
        "instance 00 Sub-engine instance 00"
    )
    assert (m.stream, m.fields["fatal"], m.fields["severity_level"]) == ("kernel.sxid", True, 1)


def test_post_rx_detect_failures():
    # gpud nvlink/post_rx_detect_failure_test.go: six lines of one incident
    lines = [
        c["line"] for c in CASES if c["expect"] and "nvlink_rx_detect" in c["expect"][0]["stream"]
    ]
    assert len(lines) == 9
    events = records_to_events(parse_kernel_log("\n".join(lines)))
    assert {e.stream for e in events} == {"kernel.nvlink_rx_detect_failure"}
    assert {e.subject for e in events} == {"node"}  # the line names no GPU
    assert {e.fields["function"] for e in events} == {
        "knvlinkDiscoverPostRxDetLinks_GH100",
        "knvlinkUpdatePostRxDetectLinkMask_IMPL",
        "knvlinkDiscoverPostRxDetLinks_GB100_REV2",
    }


# --- dmesg forms of the peers' test data -----------------------------------------------


def test_dmesg_decode_iso_keeps_time_level_and_facility():
    # gpud components/memory/testdata/dmesg.decode.iso.log (dmesg --decode --time-format iso)
    recs = parse_kernel_log((PEERS / "gpud-memory-dmesg.decode.iso.log").read_text())
    assert len(recs) == 24
    assert {r.fmt for r in recs} == {"dmesg-iso"}
    assert {(r.facility, r.level) for r in recs} == {(0, 4)}  # kern, warn
    assert recs[0].t == pytest.approx(1737434504.283302)  # 2025-01-21T04:41:44,283302+00:00
    assert recs[-1].t == pytest.approx(1737449250.287197)  # 2025-01-21T08:47:30,287197+00:00
    assert recs[0].text.startswith("NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>'")
    events = records_to_events(recs)
    xids = [e for e in events if e.stream == "kernel.xid"]
    assert [e.fields["code"] for e in xids] == [13] * 16 + [43]
    assert xids[0].t == pytest.approx(1737434504.283302)
    assert xids[-1].fields["process"] == "pt_main_thread"


@pytest.mark.parametrize(
    ("line", "fmt", "t", "level", "text"),
    [
        # gpud nccl/kmsg_matcher_test.go
        (
            "kern  :err   : 2025-02-10T16:28:06,502716+00:00 segfault at 7f797fe00000 ip "
            "00007f7c7ac69996 sp 00007f7c12fd7c30 error 4 in libnccl.so.2",
            "dmesg-iso",
            1739204886.502716,
            3,
            "segfault at 7f797fe00000 ip 00007f7c7ac69996 sp 00007f7c12fd7c30 error 4 in "
            "libnccl.so.2",
        ),
        # gpud os/kmsg_matcher_test.go: --decode without a time
        (
            "kern  :warn  : VFS: file-max limit 1000000 reached",
            "dmesg",
            None,
            4,
            "VFS: file-max limit 1000000 reached",
        ),
        # gpud nccl/testdata/dmesg.decode.iso.log, first line
        (
            (PEERS / "gpud-nccl-dmesg.decode.iso.log").read_text().splitlines()[0],
            "dmesg-iso",
            1737434504.28506,
            4,
            "pt_main_thread[2536443]: segfault at 7f797fe00000 ip 00007f7c7ac69996 sp "
            "00007f7c12fd7c30 error 4 in libnccl.so.2[7f7c7ac00000+d3d3000]",
        ),
    ],
)
def test_dmesg_decode_forms(line, fmt, t, level, text):
    rec = parse_line(line)
    assert rec is not None
    assert (rec.fmt, rec.level, rec.facility, rec.text) == (fmt, level, 0, text)
    assert rec.t == (None if t is None else pytest.approx(t))


def test_dmesg_T_xid119_file_of_gpud():
    # gpud xid/testdata/dmesg-with-xid-119.log; gpud asserts five Xid 119 on 0000:9b:00
    recs = parse_kernel_log((PEERS / "gpud-dmesg-with-xid-119.log").read_text())
    xids = [e for e in records_to_events(recs) if e.stream == "kernel.xid"]
    assert [(e.fields["code"], e.fields["pci_bus_id"]) for e in xids] == [(119, "0000:9b:00.0")] * 5
    assert {r.fmt for r in recs} == {"dmesg-T"}


# --- bad input ----------------------------------------------------------------------------

_pieces = st.sampled_from(
    [
        "NVRM: Xid (PCI:0018:01:00): 149, ",
        "pid=1, name=x, ",
        "NETIR_LINK_EVT",
        "TLW_RX/TLW_RX_PIPE0",
        "/",
        "  Fatal   ",
        " Nonfatal ",
        "XC0 ",
        "i0 ",
        "Link -1 ",
        "Link 08 ",
        "(0x004505c6 ",
        "0x00000000 ",
        "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 12033, ",
        "Severity 1 Engine instance 00 Sub-engine instance 00",
        "Data {0x50610002, 0x10100030}",
        "Fatal, Link 30 ",
        "NVRM: knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's postRxDetLinkMask failed!",
        "kern  :warn  : ",
        "2025-01-21T04:41:44,283302+00:00 ",
        "[Sun Feb 23 16:24:18 2025] ",
        "\n",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_pieces, st.text(max_size=8)), max_size=40).map("".join))
def test_peer_forms_never_crash(text: str):
    for line in text.split("\n"):
        parse_line(line)
        parse_xid(line)
    records_to_events(parse_kernel_log(text))


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0018:01:00): 149, " + "A" * 20_000,
        "NVRM: Xid (PCI:0018:01:00): 149, " + "A/" * 8_000 + " Fatal",
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR Fatal" + " " * 16_000 + "XC0",
        "NVRM: Xid (PCI:0000:01:00): 154, recovery action changed from 0x0 (" + "(" * 16_000,
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 1, Data {" + "0x0, " * 4_000,
        "kern  :warn  : " + "kern  :warn  : " * 1_000,
        "2025-01-21T04:41:44," + "1" * 16_000,
    ],
)
def test_pathological_lines_cost_little(line: str):
    # a regex that backtracks on these takes seconds to minutes; linear ones take ~1 ms
    start = time.process_time()
    for _ in range(5):
        records_to_events(parse_kernel_log(line))
    assert time.process_time() - start < 2.0
