"""Kernel-log pastes in the formats people hand over (tests/fixtures/kernel-paste/SOURCE.md):
journalctl --no-hostname, localised month names, journalctl -o short-monotonic."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.kernel.logparse import _MONTHS, MAX_TEXT, parse_kernel_log, parse_line

PASTES = Path(__file__).parent / "fixtures" / "kernel-paste"
LOCALES = Path("/usr/share/i18n/locales")


def _utc(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_journalctl_no_hostname_lines_are_kernel_records():
    # bugzilla.kernel.org #207219: journalctl --no-hostname -k
    recs = parse_kernel_log((PASTES / "no-hostname.journal").read_text(), year=2020)
    assert len(recs) == 6
    assert {r.fmt for r in recs} == {"syslog"}
    assert recs[0].text == "usb 1-1.3: Product: USB2.0 Camera"
    assert recs[0].t == _utc(2020, 4, 12, 0, 10, 37)
    assert recs[-1].text == "usb 1-1.3: can't set config #247, error -32"
    assert recs[-1].t == _utc(2020, 4, 12, 0, 29, 30)


def test_no_hostname_line_of_another_program_is_not_a_kernel_record():
    # acidanthera/bugtracker#2237 (journalctl, es locale), with the host field cut out as
    # --no-hostname prints it; gdm3's modprobe output is user space, read from
    # kernel/modprobe.txt, not from the kernel log
    line = (
        "mar 06 15:10:43 CS3003NS gdm3[7055]: modprobe: ERROR: could not insert 'nvidia': "
        "Key was rejected by service"
    )
    assert parse_line(line, year=2023) is None
    assert parse_line(line.replace("CS3003NS ", ""), year=2023) is None


def test_lower_case_month_names_are_dated():
    # rockowitz/ddcutil#240: journalctl --boot under a locale that prints "dec"
    recs = parse_kernel_log((PASTES / "lowercase-month.journal").read_text(), year=2020)
    assert [r.text for r in recs] == [
        "ACPI: Added _OSI(Linux-Dell-Video)",
        "pci 0000:01:00.0: Video device with shadowed ROM at [mem 0x000c0000-0x000dffff]",
        "ata1.00: supports DRM functions and may not be fully accessible",
        "ata1.00: supports DRM functions and may not be fully accessible",
        "ee1004 0-0051: 512 byte EE1004-compliant SPD EEPROM, read-only",
        "ee1004 0-0053: 512 byte EE1004-compliant SPD EEPROM, read-only",
    ]
    assert {r.t for r in recs} == {_utc(2020, 12, 17, 18, 5, 53)}


def test_short_monotonic_keeps_uptime_and_drops_the_tag():
    # systemd/systemd#24950: journalctl -o short-monotonic (two boots, user space and kernel)
    recs = parse_kernel_log((PASTES / "short-monotonic.journal").read_text(), boot_time=100.0)
    kernel = [r for r in recs if r.fmt == "monotonic"]
    assert [r.text for r in kernel] == [
        "ata_piix 0000:00:01.1: version 2.13",
        "cryptd: max_cpu_qlen set to 1000",
        "Floppy drive(s): fd0 is 2.88M AMI BIOS",
        "i8042: PNP: PS/2 Controller [PNP0303:KBD,PNP0f13:MOU] at 0x60,0x64 irq 1,12",
    ]
    assert kernel[0].uptime == pytest.approx(1.343565)
    assert kernel[0].t == pytest.approx(101.343565)
    # "[ts] usb 1-1: ..." of dmesg has the same shape: only the kernel's tag is taken
    rec = parse_line("[    5.000000] usb 1-1: new high-speed USB device number 2")
    assert rec is not None
    assert (rec.fmt, rec.text) == ("dmesg", "usb 1-1: new high-speed USB device number 2")


def _abmon(locale_file: Path) -> list[str]:
    text = locale_file.read_text(encoding="utf-8", errors="replace")
    m = re.search(r"^abmon\s+((?:\"[^\"]*\";?\s*/?\s*)+)", text, re.MULTILINE)
    assert m is not None, locale_file
    names = re.findall(r"\"([^\"]*)\"", m.group(1))
    return [re.sub(r"<U([0-9A-Fa-f]{4})>", lambda u: chr(int(u.group(1), 16)), n) for n in names]


@pytest.mark.parametrize(
    "locale", ["de_DE", "es_ES", "it_IT", "pt_PT", "pt_BR", "nl_NL", "sv_SE", "da_DK", "pl_PL"]
)
def test_month_table_is_glibcs(locale):
    # the table's source: glibc localedata LC_TIME abmon of each locale it names
    path = LOCALES / locale
    if not path.exists():
        pytest.skip(f"{path} is not installed here")
    names = _abmon(path)
    assert len(names) == 12
    for number, name in enumerate(names, start=1):
        assert _MONTHS[name.lower()] == number, (locale, name)


_parts = st.sampled_from(
    [
        "Nov 29 16:21:26 ",
        "nov 29 16:21:26 ",
        "Mär  6 17:59:27 ",
        "mar 06 15:10:43 ",
        "2025-01-21T04:41:44+0000 ",
        "[    1.343565] ",
        "archlinux ",
        "kernel: ",
        "kernel:",
        "gdm3[7055]: ",
        "NVRM: Xid (PCI:0000:01:00): 79, ",
        "modprobe: ERROR: ",
        "\n",
        " ",
        ":",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_parts, st.text(max_size=12))).map("".join), st.integers(1, 9999))
def test_any_journal_like_text_parses_without_error(text, year):
    for rec in parse_kernel_log(text, boot_time=1.0, year=year):
        assert len(rec.text) <= MAX_TEXT
        assert rec.t is None or rec.t == rec.t  # never NaN
