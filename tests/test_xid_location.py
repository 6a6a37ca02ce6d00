"""Where an Xid 13 or 31 hit (GPC, TPC, SM; the MMU fault's engine and client), parsed from
public lines (tests/fixtures/xid-location/SOURCE.md) and from any numbers the driver may
print."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moptd.kernel.patterns import parse_xid

FIXTURES = Path(__file__).parent / "fixtures"
CASES = [
    json.loads(line)
    for line in (FIXTURES / "xid-location" / "cases.jsonl").read_text().splitlines()
    if line.strip()
]
LOCATION_KEYS = (
    "gpc", "tpc", "sm", "location", "mmu_engine", "mmu_client", "mmu_fault_type",
    "mmu_access_type",
)


@pytest.mark.parametrize("case", CASES, ids=[f"{c['source']}-{i}" for i, c in enumerate(CASES)])
def test_public_lines(case: dict) -> None:
    fields = parse_xid(case["line"])
    assert fields is not None
    got = {k: fields[k] for k in LOCATION_KEYS if k in fields}
    want = {k: v for k, v in case["expect"].items() if k in LOCATION_KEYS}
    assert got == want
    for key in ("pid", "process"):
        if key in case["expect"]:
            assert fields[key] == case["expect"][key]


def test_gpud_memory_dmesg_every_sm_exception_has_its_place() -> None:
    text = (FIXTURES / "kernel-peers" / "gpud-memory-dmesg.decode.iso.log").read_text()
    seen = 0
    for line in text.splitlines():
        fields = parse_xid(line)
        if fields is None or fields["code"] != 13:
            continue
        m = re.search(r"\(GPC (\d+), TPC (\d+), SM (\d+)\)", line)
        if m is None:
            assert "location" not in fields, line
            continue
        seen += 1
        g, t, s = (int(x) for x in m.groups())
        assert (fields["gpc"], fields["tpc"], fields["sm"]) == (g, t, s)
        assert fields["location"] == f"GPC {g}, TPC {t}, SM {s}"
    assert seen == 10


def test_other_xids_carry_no_location() -> None:
    # gpud's Xid 74 example quotes an MMU fault; only 13 and 31 are read for a place
    line = (
        "NVRM: Xid (PCI:0000:04:00): 74, pid=1234, name=python3, Channel 0x23, MMU Fault: "
        "ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7fc123456000. Fault is of type FAULT_PTE "
        "ACCESS_TYPE_VIRT_READ"
    )
    fields = parse_xid(line)
    assert fields is not None
    assert "location" not in fields


_NUM = st.integers(min_value=0, max_value=9999)
_WORD = st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True)


@given(
    gpc=_NUM,
    tpc=st.none() | _NUM,
    sm=st.none() | _NUM,
    kind=st.sampled_from(["Warp", "Global", "TEX"]),
    tail=st.text(max_size=40),
)
def test_any_sm_location(gpc: int, tpc: int | None, sm: int | None, kind: str, tail: str) -> None:
    where = f"GPC {gpc}" + (f", TPC {tpc}" if tpc is not None else "")
    where += f", SM {sm}" if sm is not None and tpc is not None else ""
    line = f"NVRM: Xid (PCI:0000:01:00): 13, Graphics SM {kind} Exception on ({where}): {tail}"
    fields = parse_xid(line)
    assert fields is not None
    assert fields["gpc"] == gpc
    assert fields["location"] == where
    assert fields.get("tpc") == tpc
    assert fields.get("sm") == (sm if tpc is not None else None)


@given(
    engine=_WORD,
    gpc=st.none() | st.integers(min_value=0, max_value=999),
    client=_WORD,
    addr=st.from_regex(r"0x[0-9a-f]{1,4}_[0-9a-f]{8}", fullmatch=True),
    ftype=_WORD,
    access=st.none() | _WORD,
)
def test_any_mmu_fault(
    engine: str, gpc: int | None, client: str, addr: str, ftype: str, access: str | None
) -> None:
    at = f"{engine} GPC{gpc} {client}" if gpc is not None else f"{engine} {client}"
    line = (
        f"NVRM: Xid (PCI:0000:01:00): 31, pid=7, name=x, Ch 00000008, intr 00000000. "
        f"MMU Fault: ENGINE {at} faulted @ {addr}. Fault is of type {ftype}"
        + (f" ACCESS_TYPE_{access}" if access else "")
    )
    fields = parse_xid(line)
    assert fields is not None
    assert fields["location"] == at
    assert fields["mmu_engine"] == engine
    assert fields["mmu_client"] == client
    assert fields.get("gpc") == gpc
    assert fields["mmu_fault_type"] == ftype
    assert fields.get("mmu_access_type") == (f"ACCESS_TYPE_{access}" if access else None)


@given(st.text(max_size=300))
def test_any_text_never_raises(text: str) -> None:
    for code in (13, 31):
        fields = parse_xid(f"NVRM: Xid (PCI:0000:01:00): {code}, {text}")
        assert fields is not None
        if "location" in fields:
            assert isinstance(fields["location"], str)
            assert fields["location"]
