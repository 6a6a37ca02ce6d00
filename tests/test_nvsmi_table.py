"""The default nvidia-smi table: real pastes of driver branches 325 to 610 read into the
same GPU batch a -q dump gives, for the fields the table holds (tests/fixtures/nvsmi-paste,
SOURCE.md). Expected values are read off the pasted text."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.gpu.nvsmi import NvsmiDump, dump_to_batch, parse_dump, read_dump, sniff, summary
from moptd.gpu.nvsmi_table import looks_like_table, parse_table

PASTE = Path(__file__).parent / "fixtures" / "nvsmi-paste"
H200 = Path(__file__).parent / "fixtures" / "h200"
MIB = 1024 * 1024


def _read(name: str) -> NvsmiDump:
    dump = read_dump(PASTE / name)
    assert dump.kind == "nvidia-smi-table"
    assert dump.problems == []
    return dump


@pytest.mark.parametrize(
    ("name", "driver", "cuda", "gpus"),
    [
        ("table-325-gtx680.txt", "325.15", "", 2),
        ("table-375-gtx460-p12.txt", "375.20", "", 2),
        ("table-390-gtx1080ti-x8-processes.txt", "390.25", "", 8),
        ("table-450-titan-xp.txt", "450.57", "11.0", 1),
        ("table-470-a10g.txt", "470.256.02", "11.4", 1),
        ("table-525-geforce-laptop.txt", "525.60.13", "12.0", 1),
        ("table-550-rtx4070.txt", "550.40.07", "12.4", 1),
        ("table-550-tesla-p4-ecc-off.txt", "550.135", "12.4", 1),
        ("table-570-l4.txt", "570.133.20", "12.8", 1),
        ("table-580-a100x2.txt", "580.126.09", "13.0", 2),
        ("table-580-h200-idle.txt", "580.159.04", "13.0", 1),
        ("table-580-t4-exclusive.txt", "580.126.09", "13.0", 1),
        ("table-610-rtx5090-kmd.txt", "610.57.04", "13.3", 2),
    ],
)
def test_every_layout_gives_versions_and_gpus(name: str, driver: str, cuda: str, gpus: int) -> None:
    dump = _read(name)
    assert (dump.driver_version, dump.cuda_version, len(dump.gpus)) == (driver, cuda, gpus)
    assert [g.static.index for g in dump.gpus] == list(range(gpus))
    assert dump.timestamp is not None  # every paste kept nvidia-smi's clock line


def test_r535_layout_h200() -> None:
    g = _read("table-580-h200-load.txt").gpus[0]
    s, f, slow = g.static, g.fast, g.slow
    assert (s.name, s.pci_bus_id, s.driver_version) == ("NVIDIA H200", "0000:00:06.0", "580.159.04")
    assert (s.persistence_mode, s.compute_mode, s.mig_mode) == (1.0, 0.0, 0.0)
    assert (s.ecc_enabled, slow.ecc_volatile_uncorrected) == (1.0, 0.0)
    assert s.power_limit == 700.0
    assert (f.temperature, f.pstate, f.power, f.util) == (42.0, 0.0, 127.0, 0.07)
    assert (f.memory_used, f.memory_total) == (0.0, 143771 * MIB)
    assert slow.processes == ()  # "No running processes found"


def test_fields_the_table_lacks_stay_unknown() -> None:
    g = _read("table-580-h200-load.txt").gpus[0]
    assert g.static.uuid == ""
    assert g.static.serial == ""
    assert g.fast.sm_clock is None
    assert g.fast.clock_event_reasons is None
    assert g.slow.pcie_link_width is None
    assert g.slow.ecc_volatile_corrected is None
    signals = {s.signal for s in dump_to_batch(_read("table-580-h200-load.txt")).samples}
    assert "gpu.sm_clock" not in signals
    assert "gpu.pcie_link_width" not in signals


def test_table_gives_the_signals_of_the_q_dump_for_its_fields() -> None:
    """Same host and driver: the table's samples are the -q dump's samples for the same
    fields (values that move between the two captures aside: temperature, power, util)."""
    table = dump_to_batch(_read("table-580-h200-idle.txt"))
    q = dump_to_batch(read_dump(H200 / "nvsmi_idle.txt"))
    q_by_key = {(s.signal, s.subject, s.labels): s.value for s in q.samples}
    q_signals = {s.signal for s in q.samples}
    moving = {"gpu.temperature", "gpu.power", "gpu.util"}
    for s in table.samples:
        assert s.signal in q_signals, s.signal
        if s.signal in moving or s.signal == "gpu.info":
            continue
        assert q_by_key.get((s.signal, s.subject, s.labels)) == s.value, s


def test_old_layouts() -> None:
    old = _read("table-325-gtx680.txt").gpus[1]
    assert (old.static.name, old.static.pci_bus_id) == ("GeForce GTX 680", "0000:04:00.0")
    assert (old.fast.memory_used, old.fast.memory_total) == (9 * MIB, 4095 * MIB)  # "MB"
    # "N/A" for perf, power, cap, util, ECC: unknown, not zero
    assert old.fast.pstate is None
    assert old.fast.power is None
    assert old.fast.util is None
    assert old.static.power_limit is None
    assert old.static.ecc_enabled is None
    assert old.static.mig_mode is None  # no MIG row before R450


def test_two_digit_perf_state_and_short_bus_id() -> None:
    g = _read("table-375-gtx460-p12.txt").gpus[1]
    assert (g.fast.pstate, g.static.pci_bus_id) == (12.0, "0000:02:00.0")
    assert (g.fast.memory_used, g.fast.util, g.fast.power) == (74 * MIB, None, None)


def test_r390_processes_by_gpu() -> None:
    gpus = _read("table-390-gtx1080ti-x8-processes.txt").gpus
    assert [len(g.slow.processes) for g in gpus] == [1, 1, 1, 2, 4, 1, 2, 1]
    matlab = gpus[3].slow.processes[0]
    assert (matlab.pid, matlab.type, matlab.used_memory) == (4755, "C", 389 * MIB)
    assert matlab.name == "...ware/MATLAB/matlab94/bin/glnxa64/MATLAB"
    assert gpus[7].fast.power == 249.0
    assert gpus[7].static.power_limit == 250.0
    assert gpus[0].static.name == "GeForce GTX 108..."  # as nvidia-smi cut it


def test_ecc_off_na_and_compute_modes() -> None:
    p4 = _read("table-550-tesla-p4-ecc-off.txt").gpus[0]
    assert (p4.static.ecc_enabled, p4.slow.ecc_volatile_uncorrected) == (0.0, None)  # "Off"
    rtx = _read("table-550-rtx4070.txt").gpus[0]
    assert (rtx.static.ecc_enabled, rtx.slow.ecc_volatile_uncorrected) == (None, None)  # N/A
    t4 = _read("table-580-t4-exclusive.txt").gpus[0]
    assert (t4.static.compute_mode, t4.fast.util) == (3.0, 1.0)  # "E. Process", 100%
    a100 = _read("table-580-a100x2.txt").gpus[1]
    assert (a100.static.pci_bus_id, a100.static.mig_mode) == ("0000:10:1d.0", 0.0)
    laptop = _read("table-525-geforce-laptop.txt").gpus[0]
    assert (laptop.fast.power, laptop.static.power_limit) == (18.0, None)  # "18W /  N/A"


def test_r610_kmd_banner() -> None:
    dump = _read("table-610-rtx5090-kmd.txt")
    assert [g.static.power_limit for g in dump.gpus] == [575.0, 600.0]
    assert dump.gpus[1].fast.memory_used == 30347 * MIB


def test_table_is_told_from_other_text() -> None:
    assert looks_like_table((PASTE / "table-450-titan-xp.txt").read_text())
    assert not looks_like_table((H200 / "nvsmi_idle.txt").read_text())
    assert parse_dump((H200 / "nvsmi_idle.txt").read_text()).kind == "nvidia-smi-q"


_TABLE = (PASTE / "table-390-gtx1080ti-x8-processes.txt").read_text()


@settings(max_examples=200, deadline=None)
@given(
    cut=st.integers(0, len(_TABLE)),
    noise=st.text(max_size=200),
    at=st.integers(0, len(_TABLE)),
)
def test_parse_table_never_crashes_on_damaged_pastes(cut: int, noise: str, at: int) -> None:
    text = _TABLE[:cut]
    text = text[:at] + noise + text[at:]
    dump = parse_table(text)
    assert len(dump.gpus) <= 8 + text.count("|")
    dump_to_batch(dump)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("| +-=0123456789NA/%CWMiBPOnfD.:\n")), max_size=600))
def test_parse_table_never_crashes_on_table_like_text(text: str) -> None:
    dump = parse_table("| NVIDIA-SMI 1 Driver Version: 2 |\n" + text)
    dump_to_batch(dump)


def test_bounded_cost_on_a_huge_paste() -> None:
    text = (
        _TABLE
        + "|    0      1032      C   python                                     10781MiB |\n"
        * 200_000
    )
    dump = parse_table(text)
    # only the first MAX_TABLE_LINES lines are read
    assert sum(len(g.slow.processes) for g in dump.gpus) < 20_000


def test_summary_says_what_was_read() -> None:
    assert summary(_read("table-390-gtx1080ti-x8-processes.txt")) == (
        "nvidia-smi: 8 × GeForce GTX 108..., driver 390.25"
    )
    assert summary(read_dump(H200 / "nvsmi_idle.txt")) == (
        "nvidia-smi -q: 1 × NVIDIA H200, driver 580.159.04"
    )
    assert summary(read_dump(PASTE / "fail-version-mismatch-570.txt")) == (
        "nvidia-smi failure: Failed to initialize NVML: Driver/library version mismatch"
    )


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        *((p, "nvidia-smi-table") for p in sorted(PASTE.glob("table-*.txt"))),
        *((p, "nvidia-smi-failure") for p in sorted(PASTE.glob("fail-*.txt"))),
        (H200 / "nvsmi_idle.txt", "nvidia-smi-q"),
        (H200 / "nvsmi_idle.xml", "nvidia-smi-q-xml"),
        (H200 / "dmesg.txt", None),
        (H200 / "oom_plain.txt", None),
        (H200 / "proc_modules", None),
    ],
)
def test_sniff_tells_the_kind_by_content(path: Path, kind: str | None) -> None:
    text = path.read_text()
    assert sniff(text) == kind
    if kind is not None:
        assert parse_dump(text).kind == kind


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=500))
def test_sniff_never_raises(text: str) -> None:
    assert sniff(text) in (None, *KINDS)


KINDS = ("nvidia-smi-table", "nvidia-smi-failure", "nvidia-smi-q", "nvidia-smi-q-xml")


def test_a_file_with_a_q_dump_and_a_table_is_read_for_the_q_dump() -> None:
    both = (H200 / "nvsmi_table_idle.txt").read_text() + (H200 / "nvsmi_idle.txt").read_text()
    dump = parse_dump(both)
    assert dump.kind == sniff(both) == "nvidia-smi-q"
    assert dump.gpus[0].static.uuid  # the -q dump's fields, which the table lacks
