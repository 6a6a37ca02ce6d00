"""Kernel-log pastes in the formats people hand over (tests/fixtures/kernel-paste/SOURCE.md):
journalctl --no-hostname, localised month names, journalctl -o short-monotonic."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.kernel.logparse import _MONTHS, MAX_TEXT, _short_time, parse_kernel_log, parse_line

PASTES = Path(__file__).parent / "fixtures" / "kernel-paste"
LOCALES = Path("/usr/share/i18n/locales")


def _utc(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_journalctl_no_hostname_lines_are_kernel_records():
    # bugzilla.kernel.org #207219: journalctl --no-hostname -k | grep -n (its "954:" prefixes)
    recs = parse_kernel_log((PASTES / "no-hostname.journal").read_text(), year=2020)
    assert len(recs) == 6
    assert {r.fmt for r in recs} == {"syslog"}
    assert recs[0].text == "usb 1-1.3: Product: USB2.0 Camera"
    assert recs[0].t == _utc(2020, 4, 12, 0, 10, 37)
    assert recs[-1].text == "usb 1-1.3: can't set config #247, error -32"
    assert recs[-1].t == _utc(2020, 4, 12, 0, 29, 30)


def test_line_numbers_of_the_paste_tool_are_taken_off():
    # NVIDIA/open-gpu-kernel-modules#976: a syslog shown with cat -n style numbers
    recs = parse_kernel_log((PASTES / "cat-n-numbered.syslog").read_text(), year=2025)
    assert len(recs) == 8
    assert {r.fmt for r in recs} == {"syslog"}
    assert {r.t for r in recs} == {_utc(2025, 11, 26, 22, 38, 10)}
    assert recs[0].text.startswith("NVRM: memdescPrintMemdesc: Has additional IOMMU mapping")
    # grep's context separator is no record; raw kmsg and ISO stamps keep their digits
    assert parse_kernel_log("--\n") == []
    [kmsg] = parse_kernel_log("6,1234,5678901,-;NVRM: x")
    assert (kmsg.fmt, kmsg.seq) == ("kmsg", 1234)


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


def test_french_months_are_read_as_short_stamps():
    # NixOS/nixpkgs#163298 ("mars"), dglt1/optimus-switch#11 ("nov."): systemd-modules-load's
    # lines, no kernel records (they used to be read as plain ones)
    text = (PASTES / "fr-month.journal").read_text()
    assert parse_kernel_log(text, year=2022) == []
    # their stamps, as a kernel line's would be dated
    stamps = [" ".join(line.split()[:3]) for line in text.splitlines()]
    assert _short_time(stamps[3], 2019) == _utc(2019, 11, 10, 13, 34, 3)  # "nov. 10 13:34:03"
    assert _short_time(stamps[0], 2022) == _utc(2022, 3, 8, 10, 15, 3)  # "mars 08 10:15:03"


def test_zh_locale_journal_of_other_programs_is_no_kernel_log():
    # NVIDIA/gpu-operator#610: journalctl under zh_CN ("11月 15 ..."): systemd and
    # nv-fabricmanager lines, none the kernel's (they used to be read as plain records)
    assert parse_kernel_log((PASTES / "zh-month.journal").read_text(), year=2023) == []


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


def test_dmesg_human_minutes_and_deltas():
    # NVIDIA/gds-nvidia-fs#34: dmesg -H ("[Jan18 08:23]", then "[  +0.000031]" deltas)
    path = PASTES / "bundles/nvidia-fs-reltime-dmesg/kernel/dmesg.txt"
    recs = parse_kernel_log(path.read_text(), year=2024)
    assert len(recs) == 12
    assert {r.fmt for r in recs} == {"dmesg-H"}
    assert recs[0].text.startswith("nvidia_fs: module using GPL-only symbols")
    assert recs[0].t == _utc(2024, 1, 18, 8, 23)
    deltas = [float(line.split("+")[1].split("]")[0]) for line in path.read_text().splitlines()[1:]]
    assert recs[-1].t == pytest.approx(_utc(2024, 1, 18, 8, 23) + sum(deltas))
    # a delta with no minute before it has no time
    [rec] = parse_kernel_log(path.read_text().splitlines()[1])
    assert (rec.fmt, rec.t) == ("dmesg-H", None)


def _abmon(locale_file: Path) -> list[str]:
    text = locale_file.read_text(encoding="utf-8", errors="replace")
    m = re.search(r"^abmon\s+((?:\"[^\"]*\";?\s*/?\s*)+)", text, re.MULTILINE)
    assert m is not None, locale_file
    names = re.findall(r"\"([^\"]*)\"", m.group(1))
    return [
        re.sub(r"<U([0-9A-Fa-f]{4})>", lambda u: chr(int(u.group(1), 16)), n).strip() for n in names
    ]


@pytest.mark.parametrize(
    "locale",
    [
        "de_DE",
        "es_ES",
        "it_IT",
        "pt_PT",
        "pt_BR",
        "nl_NL",
        "sv_SE",
        "da_DK",
        "pl_PL",
        "fr_FR",
        "nb_NO",
        "zh_CN",
        "ja_JP",
        "ko_KR",
    ],
)
def test_month_table_is_glibcs(locale):
    # the table's source: glibc localedata LC_TIME abmon of each locale it names
    path = LOCALES / locale
    if not path.exists():
        pytest.skip(f"{path} is not installed here")
    names = _abmon(path)
    assert len(names) == 12
    for number, name in enumerate(names, start=1):
        assert _MONTHS[name.lower().rstrip(".")] == number, (locale, name)


_parts = st.sampled_from(
    [
        "Nov 29 16:21:26 ",
        "nov 29 16:21:26 ",
        "Mär  6 17:59:27 ",
        "mar 06 15:10:43 ",
        "11月 15 14:15:47 ",
        "3월 05 01:02:03 ",
        "2025-01-21T04:41:44+0000 ",
        "[    1.343565] ",
        "archlinux ",
        "kernel: ",
        "kernel:",
        "943-",
        "   3315 ",
        "--",
        "gdm3[7055]: ",
        "NVRM: Xid (PCI:0000:01:00): 79, ",
        "modprobe: ERROR: ",
        "NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)",
        "NVRM: has the version 595.84, but this kernel module has",
        "NVRM: the version 595.80.  Please make sure that this",
        "NVRM: Open nvidia.ko is only ready for use on Data Center GPUs.",
        "NVRM: GPU 0000:04:00.0: RmInitAdapter failed! (0x63:0x0:1905)",
        "nvidia-uvm: Unknown symbol ",
        "[Jan18 08:23] ",
        "[  +0.000031] ",
        "[+",
        "{",
        "\n}",
        "\t}\n",
        '"MESSAGE" : ',
        '"_TRANSPORT" : "kernel", ',
        '"__REALTIME_TIMESTAMP" : "1549067421724300", ',
        "[ 116, 104, 7 ]",
        "[[[[",
        "\n",
        " ",
        ":",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_parts, st.text(max_size=12))).map("".join), st.integers(1, 9999))
def test_any_journal_like_text_parses_without_error(text, year):
    from moptd.kernel.attribution import records_to_events

    recs = parse_kernel_log(text, boot_time=1.0, year=year)
    for rec in recs:
        assert len(rec.text) <= MAX_TEXT
        assert rec.t is None or rec.t == rec.t  # never NaN
    for ev in records_to_events(recs, {"0000:04:00.0": 0}):
        assert ev.stream.startswith("kernel.")


# --- whole pastes through replay: bundles/<name>/ (expected.yaml: must / must_not) ---------

BUNDLES = sorted(p for p in (PASTES / "bundles").iterdir() if (p / "expected.yaml").exists())
FIXTURES = Path(__file__).parent / "fixtures"


def _hits(findings: list[dict[str, object]], want: dict[str, object]) -> list[dict[str, object]]:
    out = []
    for f in findings:
        if f["code"] != want["code"]:
            continue
        if "subject" in want and f["subject"] != want["subject"]:
            continue
        if "pci_bus_id" in want and f.get("pci_bus_id") != want["pci_bus_id"]:
            continue
        out.append(f)
    return out


def _replay(bundle: Path) -> list[dict[str, object]]:
    from moptd.bundle import read_bundle
    from moptd.diagnose.loader import default_rules_dir
    from moptd.diagnose.replay import replay

    return replay(bundle, [default_rules_dir()], read_bundle).findings


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_paste_bundle(bundle: Path) -> None:
    import yaml

    expected = yaml.safe_load((bundle / "expected.yaml").read_text())
    findings = _replay(bundle)
    for want in expected.get("must") or []:
        assert _hits(findings, want), (want, findings)
    for bad in expected.get("must_not") or []:
        assert _hits(findings, bad) == [], (bad, findings)


def _kernel_bundle(tmp_path: Path, dmesg: Path) -> Path:
    (tmp_path / "kernel").mkdir()
    (tmp_path / "bundle.yaml").write_text("format: moptd-bundle/v1\nhost: h\n")
    (tmp_path / "kernel" / "dmesg.txt").write_bytes(dmesg.read_bytes())
    return tmp_path


def test_fatal_sxid_paste_is_an_nvswitch_fatal_error(tmp_path):
    # leptonai/gpud sxid README (tests/fixtures/kernel-drill/SOURCE.md)
    findings = _replay(_kernel_bundle(tmp_path, FIXTURES / "kernel-drill/sxid-fatal.log"))
    [f] = _hits(findings, {"code": "NVSWITCH_FATAL_ERROR"})
    assert "20034" in str(f["summary"])
    assert "nvidia-nvswitch1" in str(f["summary"])


def test_non_fatal_sxids_are_no_nvswitch_fatal_error(tmp_path):
    # NVIDIA/nvtrust#124 (tests/fixtures/kernel-peers/SOURCE.md): SXid 22013, Non-fatal
    findings = _replay(_kernel_bundle(tmp_path, FIXTURES / "kernel-peers/nvtrust-124-sxid.dmesg"))
    assert _hits(findings, {"code": "NVSWITCH_FATAL_ERROR"}) == []


def test_rminitadapter_paste_is_one_gpus_init_failure(tmp_path):
    # NVIDIA/gpu-operator#1146 (tests/fixtures/kernel-drill/SOURCE.md), syslog format
    findings = _replay(_kernel_bundle(tmp_path, FIXTURES / "kernel-drill/rminitadapter.log"))
    assert _hits(findings, {"code": "GPU_INIT_FAILED", "pci_bus_id": "0000:0a:00.0"})
    assert _hits(findings, {"code": "DRIVER_NOT_LOADED"}) == []


def test_journalctl_json_pretty_entries():
    # parse-nl/SystemdJournal2Gelf SystemdJournal2Gelf_test.go: TestUnmarshalEntry and
    # TestUnmarshalUnprintableEntry (a MESSAGE that is not UTF-8 comes as a byte array)
    recs = parse_kernel_log((PASTES / "journal-json-pretty.json").read_text())
    assert [(r.fmt, r.line) for r in recs] == [("json", 1), ("json", 13)]
    first, binary = recs
    assert first.text.startswith("Linux version 4.20.6-arch1-1-ARCH (builduser@heftig-32156)")
    assert first.t == pytest.approx(1549067421.7243)
    assert (first.level, first.facility) == (5, 0)
    assert binary.text == "this is a binary value \a"
    assert binary.t is None


def test_journalctl_json_one_entry_per_line():
    # the same entries as journalctl -o json prints them: one object per line
    entries = (PASTES / "journal-json-pretty.json").read_text().split("\n{")
    lines = [json.dumps(json.loads(e if e.startswith("{") else "{" + e)) for e in entries]
    recs = parse_kernel_log("\n".join(lines))
    assert [r.text for r in recs] == [
        "Linux version 4.20.6-arch1-1-ARCH (builduser@heftig-32156) (gcc version 8.2.1 "
        "20181127 (GCC)) #1 SMP PREEMPT Thu Jan 31 08:22:01 UTC 2019",
        "this is a binary value \a",
    ]
    # another program's entry is no kernel record; a brace that opens no object stays a line
    user = json.loads(lines[0]) | {"_TRANSPORT": "journal", "SYSLOG_IDENTIFIER": "gdm3"}
    assert parse_kernel_log(json.dumps(user)) == []
    assert [r.text for r in parse_kernel_log("{\nnot json\n}")] == ["{", "not json", "}"]


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 5000), st.sampled_from(["[", "{", '{"a":']))
def test_deep_or_long_json_is_bounded(depth, piece):
    text = "{\n" + piece * depth + "\n}\n" + ("{" + '"MESSAGE": ' + "[" * depth)
    for rec in parse_kernel_log(text):
        assert len(rec.text) <= MAX_TEXT


@pytest.mark.parametrize(
    ("bundle", "bus"),
    [
        # NVIDIA/open-gpu-kernel-modules#230: a GeForce, not a Data Center GPU
        ("open-module-geforce", "0000:04:00.0"),
        # NVIDIA/open-gpu-kernel-modules#322: a V100, no GSP
        ("open-module-no-gsp-v100", "0000:af:00.0"),
    ],
)
def test_open_module_declining_a_gpu_is_no_hardware_fault(bundle, bus):
    # the GPU is fine, the open flavour does not drive it
    findings = _replay(PASTES / "bundles" / bundle)
    [f] = _hits(findings, {"code": "GPU_INIT_FAILED", "pci_bus_id": bus})
    assert f["path"][-1].endswith("open-module-unsupported")
    assert not any(str(a).startswith(("replace_hardware", "reboot_node")) for a in f["actions"])


@pytest.mark.parametrize(
    ("paste", "client", "pid", "versions"),
    [
        # Frogging-Family/nvidia-all#394 (dmesg, indented continuation lines)
        ("api-mismatch-client-named.dmesg", "kwin_wayland", 1005, ("595.84", "595.80")),
        # NVIDIA/open-gpu-kernel-modules#829 (journal)
        ("api-mismatch-client-named.journal", "nvidia-powerd", 849, ("570.133.07", "575.51.02")),
    ],
)
def test_api_mismatch_naming_the_client_over_three_lines(paste, client, pid, versions):
    from moptd.kernel.attribution import records_to_events

    recs = parse_kernel_log((PASTES / paste).read_text(), year=2025)
    [ev] = [e for e in records_to_events(recs) if e.stream == "kernel.api_mismatch"]
    assert (ev.fields["client"], ev.fields["pid"]) == (client, pid)
    assert (ev.fields["client_version"], ev.fields["kernel_version"]) == versions


# --- the sniffer takes these formats for what they are -------------------------------------

RAW_PASTES = sorted(
    p for p in (Path(__file__).parent / "fixtures" / "kernel-paste").iterdir()
    if p.is_file() and p.name != "SOURCE.md"
)


@pytest.mark.parametrize("paste", RAW_PASTES, ids=lambda p: p.name)
def test_a_raw_paste_in_a_format_the_reader_knows_is_not_taken_for_prose(paste: Path) -> None:
    """Pasted as a raw file, every line the kernel-log reader dates (or the modprobe reader
    finds a failure in) lands in a section replay reads, not in 'prose'."""
    from moptd.bundle.classify import split
    from moptd.collectors.driver import parse_modprobe_output
    from moptd.kernel.logparse import parse_kernel_log

    text = paste.read_text(errors="replace")
    for s in split(text):
        if s.kind != "prose":
            continue
        dated = [r for r in parse_kernel_log(s.text) if r.fmt != "plain"]
        assert dated == [], (s.first, s.last, dated[:2])
        assert parse_modprobe_output(s.text) == [], (s.first, s.last)
