"""nvidia-smi dump readers over real captures (H200 driver 580, A10 and 8xH100 on R535/550)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moptd.catalog import CATALOG
from moptd.gpu.batch import gpu_batch
from moptd.gpu.nvsmi import (
    NvsmiError,
    dump_to_batch,
    parse_dump,
    parse_text,
    parse_xml,
    read_dump,
)
from tests.conftest import FIXTURES

H200 = FIXTURES / "h200"
SCEN = FIXTURES / "scenarios"
MIB = 1024 * 1024
ALL_DUMPS = [
    H200 / "nvsmi_idle.xml",
    H200 / "nvsmi_idle.txt",
    H200 / "nvsmi_load.xml",
    H200 / "nvsmi_load.txt",
    *sorted(SCEN.glob("*/gpu/nvidia-smi/001.txt")),
]


def test_every_fixture_is_present():
    assert len(ALL_DUMPS) == 8
    for p in ALL_DUMPS:
        assert p.is_file(), p


@pytest.mark.parametrize("path", ALL_DUMPS, ids=lambda p: "/".join(p.parts[-4:]))
def test_dump_parses_without_problems_and_maps_to_catalog_signals(path: Path):
    dump = read_dump(path)
    assert dump.problems == []
    assert dump.gpus
    assert dump.driver_version
    assert dump.timestamp is not None
    batch = dump_to_batch(dump)
    for s in batch.samples:
        assert s.signal in CATALOG, s.signal
        assert CATALOG[s.signal].subject == s.subject.split(":")[0]
    for g in dump.gpus:
        assert g.static.pci_bus_id == g.static.pci_bus_id.lower()
        assert len(g.static.pci_bus_id) == len("0000:00:06.0")
        assert g.static.uuid.startswith("GPU-")


def test_h200_idle_xml_values():
    dump = read_dump(H200 / "nvsmi_idle.xml")
    assert dump.driver_version == "580.159.04"
    assert dump.cuda_version == "13.0"
    # "Sun Nov 29 16:21:26 2026" read as UTC; nvml_samples.jsonl starts 0.868 s later.
    assert dump.timestamp == 1795969286.0
    (g,) = dump.gpus
    s, f, w = g.static, g.fast, g.slow
    assert s.index == 0
    assert s.uuid == "GPU-a825b2f6-3dfa-91e3-255f-343d3b48604a"
    assert s.pci_bus_id == "0000:00:06.0"
    assert s.name == "NVIDIA H200"
    assert s.serial == "1653724066475"
    assert s.vbios == "96.00.A5.00.1A"
    assert s.sm_clock_max == 1980e6
    assert s.mem_clock_max == 3201e6
    assert (s.power_limit, s.power_limit_default) == (700.0, 700.0)
    assert (s.pcie_link_gen_max, s.pcie_link_width_max) == (5.0, 16.0)
    assert (s.ecc_enabled, s.persistence_mode, s.compute_mode, s.mig_mode) == (1, 1, 0, 0)
    assert f.memory_total == 143771 * MIB
    assert f.memory_reserved == 616 * MIB
    assert f.memory_free == 143156 * MIB
    assert f.util == 0.0
    assert f.temperature == 38.0
    assert f.power == pytest.approx(117.84)  # the average reading, as NVML's power usage
    assert f.sm_clock == 465e6
    assert f.pstate == 0.0
    assert f.clock_event_reasons == 0x1  # GpuIdle
    assert w.memory_temperature == 37.0
    assert w.bar1_total == 262144 * MIB
    assert w.pcie_link_gen == 5.0
    assert w.pcie_replays == 0.0
    assert w.recovery_action == 0.0
    assert w.remap_pending == 0.0
    assert w.retired_pages_sbe is None  # "N/A" on Hopper: a value, not an error
    assert w.energy is None  # nvidia-smi -q does not print it


def test_h200_load_counters_and_processes():
    xml = read_dump(H200 / "nvsmi_load.xml").gpus[0]
    txt = read_dump(H200 / "nvsmi_load.txt").gpus[0]
    # 40 s of bf16 matmul at the 700 W cap: the cumulative SW power cap counter.
    assert xml.slow.clock_event_time["sw_power_cap"] == pytest.approx(40.314822)
    assert txt.slow.clock_event_time["sw_power_cap"] == pytest.approx(40.314822)
    assert xml.slow.processes[0].pid == 432
    assert xml.slow.processes[0].used_memory == 2666 * MIB
    batch = dump_to_batch(read_dump(H200 / "nvsmi_load.xml"))
    procs = [s for s in batch.samples if s.signal == "process.gpu_memory"]
    assert [(p.subject, p.value, p.labels) for p in procs] == [
        ("process:432", 2666 * MIB, (("gpu", "0"),))
    ]


@pytest.mark.parametrize("moment", ["idle", "load"])
def test_xml_and_text_of_the_same_host_agree(moment: str):
    xml = read_dump(H200 / f"nvsmi_{moment}.xml")
    txt = read_dump(H200 / f"nvsmi_{moment}.txt")
    assert xml.driver_version == txt.driver_version
    assert xml.gpus[0].static == txt.gpus[0].static
    if moment == "idle":  # the two idle dumps were taken in the same second
        assert xml.gpus[0].slow == txt.gpus[0].slow


def test_hw_power_brake_on_all_eight_h100():
    dump = read_dump(SCEN / "hw-power-brake-h100x8/gpu/nvidia-smi/001.txt")
    assert [g.static.index for g in dump.gpus] == list(range(8))
    assert dump.gpus[1].static.pci_bus_id == "0000:3b:00.0"
    for g in dump.gpus:
        assert g.fast.clock_event_reasons is not None
        assert g.fast.clock_event_reasons & 0x80  # HW power brake
        assert g.fast.clock_event_reasons & 0x8  # its parent, HW slowdown
        assert not g.fast.clock_event_reasons & 0x20
    assert dump.gpus[0].slow.pcie_replays == 67.0
    batch = dump_to_batch(dump)
    active = {
        (s.subject, dict(s.labels)["reason"])
        for s in batch.samples
        if s.signal == "gpu.clock_event_active" and s.value == 1.0
    }
    assert ("gpu:7", "hw_power_brake_slowdown") in active


def test_sw_thermal_slowdown_only_on_gpu2():
    dump = read_dump(SCEN / "sw-thermal-slowdown-h100x8/gpu/nvidia-smi/001.txt")
    thermal = [g.static.index for g in dump.gpus if (g.fast.clock_event_reasons or 0) & 0x20]
    assert thermal == [2]


def test_row_remap_pending_a10():
    g = read_dump(SCEN / "row-remap-pending-a10/gpu/nvidia-smi/001.txt").gpus[0]
    assert g.slow.remap_pending == 1.0
    assert g.slow.remapped_rows_uncorrectable == 4.0
    assert g.slow.remap_failure == 0.0
    assert g.static.mig_mode is None  # A10: MIG "N/A"
    # R535: no recovery-action line; "GPU Reset Status: Reset Required: No" gives 0.
    assert g.slow.recovery_action == 0.0


def test_idle_a10_pcie_gen1_of_4():
    g = read_dump(SCEN / "healthy-idle-pcie-gen1-a10/gpu/nvidia-smi/001.txt").gpus[0]
    assert (g.slow.pcie_link_gen, g.static.pcie_link_gen_max) == (1.0, 4.0)
    assert g.fast.pstate == 8.0


def test_dump_batch_equals_the_collector_builder():
    dump = read_dump(H200 / "nvsmi_load.txt")
    g = dump.gpus[0]
    samples = dump_to_batch(dump).samples
    assert samples[:-1] == gpu_batch(g.static, g.fast, g.slow).samples
    # and NVML's start, which the NVML collector adds to every pass
    assert (samples[-1].signal, samples[-1].subject, samples[-1].value) == (
        "gpu.nvml_init_error",
        "node",
        0.0,
    )


OLD_TEXT = """
==============NVSMI LOG==============

Timestamp                                 : Mon Jan  8 10:00:00 2024
Driver Version                            : 470.82.01

Attached GPUs                             : 1
GPU 00000000:3B:00.0
    Product Name                          : Tesla V100-SXM2-32GB
    GPU UUID                              : GPU-11111111-2222-3333-4444-555555555555
    Clocks Throttle Reasons
        Idle                              : Not Active
        SW Power Cap                      : Active
        HW Slowdown                       : Not Active
    Retired Pages
        Single Bit ECC                    : 2
        Double Bit ECC                    : 1
        Pending Page Blacklist            : Yes
    ECC Errors
        Volatile
            Single Bit
                Device Memory             : 3
                Total                     : 3
            Double Bit
                Device Memory             : 1
                Total                     : 1
    Power Readings
        Power Draw                        : 55.10 W
        Power Limit                       : 300.00 W
        Default Power Limit               : 300.00 W
        Enforced Power Limit              : 250.00 W
    Processes
        Process ID                        : 4242
            Type                          : C
            Name                          : python3
            Used GPU Memory               : 1024 MiB
        Process ID                        : 4243
            Type                          : C
            Name                          : worker
            Used GPU Memory               : 2048 MiB
"""


def test_older_driver_spellings():
    """A hand-typed excerpt in the pre-R535 layout (the captures have no such driver):
    throttle-reason naming, page retirement, Single/Double Bit ECC, enforced limit."""
    dump = parse_text(OLD_TEXT, "old.txt")
    (g,) = dump.gpus
    assert g.fast.clock_event_reasons == 0x4
    assert (g.slow.retired_pages_sbe, g.slow.retired_pages_dbe) == (2.0, 1.0)
    assert g.slow.retired_pages_pending == 1.0
    assert (g.slow.ecc_volatile_corrected, g.slow.ecc_volatile_uncorrected) == (3.0, 1.0)
    assert g.static.power_limit == 250.0
    assert g.fast.power == pytest.approx(55.10)
    assert [(p.pid, p.name, p.used_memory) for p in g.slow.processes] == [
        (4242, "python3", 1024 * MIB),
        (4243, "worker", 2048 * MIB),
    ]
    assert dump.timestamp == 1704708000.0


def test_bad_value_is_skipped_and_reported_with_its_line():
    text = (H200 / "nvsmi_idle.txt").read_text()
    broken = text.replace(
        "GPU Current Temp                               : 38 C", "GPU Current Temp : hot"
    )
    assert broken != text
    dump = parse_text(broken, "x.txt")
    assert dump.gpus[0].fast.temperature is None
    (problem,) = dump.problems
    line = next(i for i, ln in enumerate(broken.splitlines(), 1) if "hot" in ln)
    assert problem.line == line
    assert problem.key == "gpu current temp"


def test_not_a_dump_raises_a_typed_error(tmp_path: Path):
    p = tmp_path / "notes.txt"
    p.write_text("hello\nworld\n")
    with pytest.raises(NvsmiError) as e:
        read_dump(p)
    assert e.value.path == p
    assert e.value.line == 1


def test_malformed_xml_names_the_line(tmp_path: Path):
    text = (H200 / "nvsmi_idle.xml").read_text()
    p = tmp_path / "cut.xml"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(NvsmiError) as e:
        read_dump(p)
    assert e.value.line > 100
    assert "malformed XML" in str(e.value)


def test_missing_file(tmp_path: Path):
    with pytest.raises(NvsmiError):
        read_dump(tmp_path / "absent.txt")


def test_wrong_root_element():
    with pytest.raises(NvsmiError, match="root element"):
        parse_xml("<?xml version='1.0'?><html/>")


_TEXT = (H200 / "nvsmi_load.txt").read_text()
_H100 = (SCEN / "hw-power-brake-h100x8/gpu/nvidia-smi/001.txt").read_text()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=2000))
def test_random_text_never_raises_anything_but_nvsmi_error(text: str):
    try:
        dump = parse_dump(text, "random.txt")
    except NvsmiError:
        return
    dump_to_batch(dump)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(_TEXT)))
def test_truncated_text_dump_never_raises(cut: int):
    try:
        dump = parse_text(_TEXT[:cut], "cut.txt")
    except NvsmiError:
        assert "Driver Version" not in _TEXT[:cut]
        return
    dump_to_batch(dump)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.text(max_size=40)), max_size=30),
)
def test_garbled_lines_never_raise(edits: list[tuple[int, str]]):
    lines = _H100.splitlines()
    for pos, junk in edits:
        lines[pos % len(lines)] = junk
    try:
        dump = parse_text("\n".join(lines), "garbled.txt")
    except NvsmiError:
        return
    dump_to_batch(dump)
    for g in dump.gpus:
        for f in dataclasses.fields(g.fast):
            v = getattr(g.fast, f.name)
            assert v is None or isinstance(v, (int, float))


_XML = (H200 / "nvsmi_load.xml").read_text()


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=len(_XML)), st.text(max_size=30))
def test_cut_or_spliced_xml_raises_only_nvsmi_error(cut: int, junk: str):
    try:
        dump = parse_dump(_XML[:cut] + junk + _XML[cut:][: len(_XML) // 3], "cut.xml")
    except NvsmiError:
        return
    dump_to_batch(dump)


XML_DUMPS = sorted(
    p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix in (".xml", ".txt")
    and "<nvidia_smi_log" in p.read_text(errors="replace")[:2000]
)


@pytest.mark.parametrize("path", XML_DUMPS, ids=lambda p: "/".join(p.parts[-4:]))
def test_xml_read_of_what_the_paths_name_is_the_whole_read(
    path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The <supported_clocks> sections are cut before parsing (half an H200 dump) and
    only the sections the reader's paths start in become nodes: every real dump reads
    the same as when the parser is given all of it and makes nodes of all of it."""
    import moptd.gpu.nvsmi as nvsmi

    text = path.read_text()
    assert "<supported_clocks>" in text
    cut = parse_xml(text, path)
    monkeypatch.setattr(nvsmi, "_without_supported_clocks", lambda body: body)
    assert parse_xml(text, path) == cut
    # nor are the sections no path starts in made into nodes: the same read with all
    monkeypatch.setattr(nvsmi, "_XML_READ", _Everything())
    assert parse_xml(text, path) == cut


class _Everything:
    def __contains__(self, item: object) -> bool:
        return True


def test_malformed_xml_after_supported_clocks_names_its_line(tmp_path: Path):
    text = (H200 / "nvsmi_idle.xml").read_text()
    lines = text.splitlines(keepends=True)
    after = max(i for i, line in enumerate(lines) if "</supported_clocks>" in line) + 3
    lines[after] = "<broken\n"
    p = tmp_path / "broken.xml"
    p.write_text("".join(lines))
    with pytest.raises(NvsmiError) as e:
        read_dump(p)
    assert e.value.line in (after + 1, after + 2)  # the tag's line, or where it ends
