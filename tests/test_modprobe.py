"""modprobe / insmod / systemd-modules-load output (a bundle's kernel/modprobe.txt): the
parser, the driver collector's samples, and the bundle check. The lines are the pastes
under tests/fixtures/kernel-paste/bundles/ (SOURCE.md there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from moptd.bundle.errors import BundleError
from moptd.bundle.sources import _check_modprobe
from moptd.collectors.driver import (
    MODPROBE_MODULES,
    ModprobeFailure,
    modprobe_batch,
    modprobe_module,
    parse_modprobe_output,
)
from moptd.kernel.patterns import module_name
from moptd.observations import Batch

BUNDLES = Path(__file__).parent / "fixtures" / "kernel-paste" / "bundles"


def _read(name: str) -> str:
    return (BUNDLES / name / "kernel" / "modprobe.txt").read_text()


def _brief(failures: list[ModprobeFailure]) -> list[tuple[str, str, str]]:
    return [(f.module, f.error, f.tool) for f in failures]


@pytest.mark.parametrize(
    ("bundle", "expected"),
    [
        # canonical/nvidia-graphics-drivers#61: the shell prompt line is skipped
        ("secure-boot-modprobe-535", [("nvidia", "key_rejected", "modprobe")]),
        # acidanthera/bugtracker#2237: journal prefix; nvidia-settings' line is no modprobe's
        ("secure-boot-gdm3-journal", [("nvidia", "key_rejected", "modprobe")] * 6),
        # module-init-tools' form, Ubuntu's nvidia-current name for nvidia.ko
        ("no-such-device-nvidia-current", [("nvidia", "no_such_device", "modprobe")]),
        # Ubuntu's nvidia_331_updates_uvm is nvidia_uvm; "Module ... not found"
        (
            "uvm-alias-no-such-device",
            [("nvidia_uvm", "not_found", "modprobe"), ("nvidia_uvm", "no_such_device", "modprobe")],
        ),
        ("other-module-key-unavailable", [("mt7650u_sta", "key_unavailable", "modprobe")]),
        # kmod's "could not open moddep file" lines are no insert failures; ENOSYS is "other"
        ("wsl-nvidia-367", [("nvidia", "other", "modprobe")]),
    ],
)
def test_pasted_modprobe_output(bundle, expected):
    assert _brief(parse_modprobe_output(_read(bundle))) == expected


OTHER_TOOLS = (BUNDLES.parent / "modprobe-other-tools.txt").read_text().splitlines()


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, ("ch34x", "key_rejected", "insmod")),  # insmod names the file
        (1, ("gasket", "key_rejected", "systemd-modules-load")),  # in the journal
        (2, ("8723de", "key_unavailable", "systemd-modules-load")),  # without "module"
        (3, ("fl2000", "unknown_symbol", "insmod")),
    ],
)
def test_other_tools_forms(n, expected):
    # juliagoda/CH341SER#47, google/gasket-driver#11, smlinux/rtl8723de#7, klogg/fl2000_drm#35
    assert _brief(parse_modprobe_output(OTHER_TOOLS[n])) == [expected]


def test_module_names_as_proc_modules_spells_them():
    assert module_name("nvidia-fs") == "nvidia_fs"
    assert module_name("nvidia-uvm") == "nvidia_uvm"
    assert module_name("nvidia-nvlink") == "nvidia"  # printed by nvidia.ko itself
    assert module_name("nvidia-nvswitch3") == "nvidia"


def _samples(b: Batch) -> dict[tuple[str, str], float]:
    return {(s.signal, dict(s.labels)["module"]): float(s.value) for s in b.samples}


def test_samples_say_failed_and_refused_for_every_module():
    b = Batch()
    modprobe_batch(b, parse_modprobe_output(_read("secure-boot-modprobe-535")))
    got = _samples(b)
    assert got[("driver.modprobe_failed", "nvidia")] == 1.0
    assert got[("driver.modprobe_refused", "nvidia")] == 1.0
    for module in MODPROBE_MODULES[1:]:
        assert got[("driver.modprobe_failed", module)] == 0.0
        assert got[("driver.modprobe_refused", module)] == 0.0
    [error] = [s for s in b.samples if s.signal == "driver.modprobe_error"]
    assert dict(error.labels) == {
        "module": "nvidia",
        "error": "key_rejected",
        "message": "Key was rejected by service",
    }


def test_another_vendors_module_gives_only_zeros():
    b = Batch()
    modprobe_batch(b, parse_modprobe_output(_read("other-module-key-unavailable")))
    assert set(_samples(b).values()) == {0.0}
    assert not any(s.signal == "driver.modprobe_error" for s in b.samples)


def test_a_file_without_modprobe_output_is_an_error_naming_it():
    with pytest.raises(BundleError) as e:
        _check_modprobe(
            "[    5.0] usb 1-1: new high-speed USB device number 2\n", "b/kernel/modprobe.txt"
        )
    assert "b/kernel/modprobe.txt" in str(e.value)
    _check_modprobe(_read("wsl-nvidia-367"), "x")  # no raise


_pieces = st.sampled_from(
    [
        "modprobe: ",
        "insmod: ",
        "ERROR: ",
        "FATAL: ",
        "could not insert ",
        "module ",
        "'nvidia'",
        "'nvidia_331_updates_uvm'",
        "Error inserting ",
        "nvidia_current ",
        "(/lib/modules/x/nvidia.ko)",
        "Failed to insert module ",
        ": ",
        "Key was rejected by service",
        "No such device",
        "Module nvidia-uvm not found",
        "'",
        "\n",
        " ",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_pieces, st.text(max_size=16))).map("".join))
def test_any_text_parses_without_error(text):
    failures = parse_modprobe_output(text)
    assert len(failures) <= text.count("\n") + 1
    b = Batch()
    modprobe_batch(b, failures)
    assert len({s.labels for s in b.samples if s.signal == "driver.modprobe_failed"}) <= (
        len(MODPROBE_MODULES) + 32
    )


@settings(max_examples=20, deadline=None)
@given(st.text(min_size=1, max_size=8), st.integers(1000, 200_000))
def test_long_lines_are_bounded(piece, times):
    line = "modprobe: ERROR: could not insert '" + piece * times
    for f in parse_modprobe_output(line + "': No such device"):
        assert len(f.message) <= 256
        assert len(f.module) <= 255


# The single pattern driver.py used before it found the words first (cubic over a run of
# blanks, so it is fed short lines only): the split match must read every line as it did.
_ONE_PATTERN = re.compile(
    r"(?P<tool>modprobe|insmod|systemd-modules-load)?(?:\[\d+\])?:?\s*(?:ERROR|FATAL)?:?\s*"
    r"(?:could not insert (?:module )?'?(?P<kmod>[^'\s:]{1,255})'?"
    r"|Error inserting (?P<mit>\S{1,255})(?: \([^)]{0,512}\))?"
    r"|Failed to insert (?:module )?'(?P<sd>[^']{1,255})')"
    r": (?P<error>[^\n]{1,256}?)\s*$"
)
_line_pieces = st.sampled_from(
    [
        "modprobe", "insmod", "systemd-modules-load", "[42]", ":", " ", "\t", "ERROR",
        "FATAL", "could not insert ", "Error inserting ", "Failed to insert ", "module ",
        "'", "nvidia", "(x)", ": ", "Operation not permitted", "gdm3[7055]",
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_line_pieces, st.text(max_size=4)), max_size=14).map("".join))
@example("modprobe: could not insert 'a' x insmod: Error inserting b: c")  # the second one
@example("x: FATAL:  \t could not insert 'nvidia': Operation not permitted")
def test_the_split_match_reads_each_line_as_the_one_pattern_did(line):
    line = line.replace("\n", " ").replace("\r", " ")
    (got,) = parse_modprobe_output(line) or [None]
    m = _ONE_PATTERN.search(line) if "nsert" in line else None
    if m is None:
        assert got is None or got.error == "not_found"
        return
    assert got is not None
    name = m.group("kmod") or m.group("mit") or m.group("sd") or ""
    assert got.message == m.group("error").strip()
    assert got.module == modprobe_module(name)
    tool = m.group("tool") or ("systemd-modules-load" if m.group("sd") else "modprobe")
    assert got.tool == tool


def test_a_line_of_blanks_after_the_words_is_read_in_linear_time():
    # 4,000 blanks after "could not insert" took the one pattern 110 s; now one pass
    line = "modprobe: ERROR: could not insert '" + " " * 4000 + "': No such device"
    assert parse_modprobe_output(line) == []
