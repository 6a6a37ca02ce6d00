"""Kernel-log formats and message matchers, on real lines.

Each quoted line names its source (docs/reference/gpu-health-anchors.md §b3 gives the
details). Where a variant exists only as the driver's format string (MIG
``GPU-I``/``GPU-CI``), the line is that format string filled in, and says so.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.kernel.attribution import Attributor, records_to_events
from moptd.kernel.logparse import (
    MAX_TEXT,
    parse_kernel_log,
    parse_line,
    parse_raw_record,
)
from moptd.kernel.patterns import KernelMatcher, Match, parse_xid
from moptd.proc.pci import pci_key

FIXTURES = Path(__file__).parent / "fixtures"


def matches(*lines: str) -> list[Match]:
    m = KernelMatcher()
    out: list[Match] = []
    for line in lines:
        out.extend(m.feed(line))
    return out + m.flush()


def one(line: str) -> Match:
    ms = matches(line)
    assert len(ms) == 1, ms
    return ms[0]


# --- NVRM Xid variants ------------------------------------------------------------------


def test_xid_with_pid_and_name():
    # gpud components/accelerator/nvidia/error/xid/README.md
    f = parse_xid(
        "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
        "errorString CTX SWITCH TIMEOUT, Info 0x58005"
    )
    assert f is not None
    assert f["code"] == 109
    assert f["pci_bus_id"] == "0000:cb:00.0"
    assert f["pid"] == 1797828
    assert f["process"] == "pt_main_thread"
    assert f["message"] == "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
    assert f["caused_by"] is None
    assert f["gpu_instance"] is None


def test_xid_with_unknown_pid():
    # gpud README (public code): the driver's defaults when no channel is known
    f = parse_xid(
        "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp "
        "Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"
    )
    assert f is not None
    assert (f["code"], f["pid"], f["process"]) == (13, None, "")
    assert f["message"].startswith("Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0)")


def test_xid_with_pid_and_no_name():
    # stas00/ml-engineering compute/accelerator/nvidia/debug.md
    f = parse_xid(
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for "
        "remapping, reset gpu to activate."
    )
    assert f is not None
    assert (f["code"], f["pci_bus_id"], f["pid"], f["process"]) == (63, "0000:10:1c.0", 1896, "")
    assert f["message"].startswith("Row Remapper")


@pytest.mark.parametrize(
    ("line", "code", "bus", "message"),
    [
        # gpud xid/kmsg.go comment: an old driver without "PCI:"
        ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "0000:03:00.0", "Channel 00000001"),
        # pastebin xJaypMZt (very old driver)
        (
            "NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff",
            3,
            "0000:01:00.0",
            "C 00000005 SC 00000007 M 00001ffc Data ffffffff",
        ),
        # gpud kmsg.go; open-gpu-kernel-modules#1151
        (
            "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
            79,
            "0000:01:00.0",
            "GPU has fallen off the bus.",
        ),
    ],
)
def test_xid_old_and_short_forms(line, code, bus, message):
    f = parse_xid(line)
    assert f is not None
    assert (f["code"], f["pci_bus_id"], f["message"], f["pid"]) == (code, bus, message, None)


@pytest.mark.parametrize(
    ("line", "gi", "ci"),
    [
        # kernel_rc.c format "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): %d, pid=%s, ..."
        ("NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 31, pid=4242, name=python3, MMU Fault", 5, None),
        # ... "GPU-I:%02u GPU-CI:%02u" filled in
        (
            "NVRM: Xid (PCI:0000:3b:00 GPU-I:05 GPU-CI:01): 31, pid=4242, name=python3, MMU Fault",
            5,
            1,
        ),
    ],
)
def test_xid_mig_instances(line, gi, ci):
    f = parse_xid(line)
    assert f is not None
    assert (f["pci_bus_id"], f["gpu_instance"], f["compute_instance"]) == ("0000:3b:00.0", gi, ci)
    assert (f["pid"], f["process"], f["message"]) == (4242, "python3", "MMU Fault")


def test_xid_caused_by_previous():
    # NVIDIA/open-gpu-kernel-modules#1150
    f = parse_xid(
        "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by "
        "previous Xid 149"
    )
    assert f is not None
    assert (f["code"], f["caused_by"], f["process"]) == (45, 149, "python3")


@pytest.mark.parametrize(
    ("line", "bus", "code", "severity", "unit", "link"),
    [
        # gpud kmsg.go
        (
            "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 "
            "(0x004505c6 0x00000000 ...)",
            "0018:01:00.0",
            149,
            "fatal",
            "NETIR_LINK_EVT",
            8,
        ),
        # NVIDIA/NVSentinel#1357: the line says Nonfatal, whatever the code suggests
        (
            "NVRM: Xid (PCI:0000:c5:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 17 "
            "(0x04084507 0x00000004 0x00000000 ...)",
            "0000:c5:00.0",
            145,
            "nonfatal",
            "RLW_SRC_TRACK",
            17,
        ),
    ],
)
def test_xid_nvlink5_tail(line, bus, code, severity, unit, link):
    f = parse_xid(line)
    assert f is not None
    assert (f["pci_bus_id"], f["code"], f["severity"]) == (bus, code, severity)
    assert (f["nvlink_unit"], f["link"]) == (unit, link)


def test_non_xid_nvrm_lines_are_not_xids():
    # h200 dmesg: ordinary driver chatter
    assert parse_xid("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04") is None
    assert (
        matches("NVRM: Persistence mode is deprecated and will be removed in a future release.")
        == []
    )


# --- fallen off the bus ---------------------------------------------------------------


def test_fallen_off_bus_multiline_without_xid_as_three_records():
    # NVIDIA/NVSentinel#155
    ms = matches(
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        "NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    )
    assert [(m.stream, m.fields["pci_bus_id"], m.fields["pci_id"]) for m in ms] == [
        ("kernel.gpu_fallen_off_bus", "0000:b3:00.0", "10de:26b5")
    ]


def test_fallen_off_bus_multiline_in_one_record():
    rec = parse_raw_record(
        "3,900,123456,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed "
        "in this system has\\x0aNVRM: fallen off the bus and is not responding to commands."
    )
    [m] = KernelMatcher().feed(rec.text)
    assert m.stream == "kernel.gpu_fallen_off_bus"
    assert m.fields["pci_bus_id"] == "0000:b3:00.0"


@pytest.mark.parametrize(
    ("line", "bus"),
    [
        # open-gpu-kernel-modules#1151
        ("NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.", "0000:2b:00.0"),
        # pastebin xJaypMZt (older single line)
        ("NVRM: GPU at 0000:01:00.0 has fallen off the bus.", "0000:01:00.0"),
    ],
)
def test_fallen_off_bus_single_line(line, bus):
    m = one(line)
    assert (m.stream, m.fields["pci_bus_id"]) == ("kernel.gpu_fallen_off_bus", bus)


def test_gpu_uuid_line_attributes_later_xids():
    # open-gpu-kernel-modules#1151 trio
    events = records_to_events(
        parse_kernel_log(
            "[  100.1] NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1111-2222-3333-444455556666\n"
            "[  100.2] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
            "[  100.3] NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.\n"
        )
    )
    assert [e.stream for e in events] == ["kernel.xid", "kernel.gpu_fallen_off_bus"]
    assert {e.fields["uuid"] for e in events} == {"GPU-0b11d014-1111-2222-3333-444455556666"}
    assert {e.subject for e in events} == {"gpu:0000:2b:00.0"}


# --- other messages -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "code", "bus", "fatal"),
    [
        # gpud components/accelerator/nvidia/sxid/kmsg.go
        (
            "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
            "non-posted PRIV error (First)",
            12028,
            "0000:05:00.0",
            False,
        ),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
            20034,
            "0000:00:00.0",
            True,
        ),
    ],
)
def test_sxid(line, code, bus, fatal):
    m = one(line)
    assert m.stream == "kernel.sxid"
    assert (m.fields["code"], m.fields["pci_bus_id"], m.fields["fatal"]) == (code, bus, fatal)


def test_api_mismatch_over_two_lines():
    # the driver's message as printed by nvidia.ko (nv.c, "API mismatch")
    [m] = matches(
        "NVRM: API mismatch: the client has the version 535.104.05, but",
        "NVRM: this kernel module has the version 535.54.03.  Please",
        "NVRM: make sure that this kernel module and all NVIDIA driver",
    )
    assert m.stream == "kernel.api_mismatch"
    assert (m.fields["client_version"], m.fields["kernel_version"]) == ("535.104.05", "535.54.03")


def test_api_mismatch_without_second_line_is_still_reported():
    [m] = matches("NVRM: API mismatch: the client has the version 550.54.15, but")
    assert (m.fields["client_version"], m.fields["kernel_version"]) == ("550.54.15", "")


@pytest.mark.parametrize(
    ("line", "module", "reason"),
    [
        (
            "nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -2)",
            "nvidia_peermem",
            "unknown symbol ib_register_peer_memory_client",
        ),
        (
            "nvidia: disagrees about version of symbol module_layout",
            "nvidia",
            "symbol version mismatch: module_layout",
        ),
        (
            "nvidia: version magic '5.15.0-76-generic SMP mod_unload ' should be "
            "'5.15.0-78-generic SMP mod_unload '",
            "nvidia",
            "built for another kernel",
        ),
        (
            "NVRM: The NVIDIA probe routine was not called for 1 device(s).",
            "nvidia",
            "the probe routine was not called",
        ),
        ("NVRM: None of the NVIDIA devices were initialized.", "nvidia", "no device initialised"),
        (
            "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x22:0x56:742)",
            "nvidia",
            "RmInitAdapter failed (0x22:0x56:742)",
        ),
    ],
)
def test_module_load_failures(line, module, reason):
    m = one(line)
    assert m.stream == "kernel.module_load_failure"
    assert m.fields["module"] == module
    assert m.fields["reason"].startswith(reason)


@pytest.mark.parametrize(
    "line",
    [
        "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7",
        "Loading of unsigned module is rejected",
        "Loading of module with unavailable key is rejected",
    ],
)
def test_secure_boot_refusals(line):
    assert one(line).stream == "kernel.secure_boot_refused"


def test_lockdown_notice_and_taint_warning_are_not_refusals():
    # the h200 fixture's boot log: lockdown active, modules load fine
    assert (
        matches(
            "Kernel is locked down from Kernel configuration; see man kernel_lockdown.7",
            "nvidia: loading out-of-tree module taints kernel.",
            "nvidia: module verification failed: signature and/or required key missing - "
            "tainting kernel",
        )
        == []
    )


def test_oom_kill_with_container_from_memcg():
    cid = "4f3c" * 16
    [m] = matches(
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=docker-x.scope,"
        f"mems_allowed=0,oom_memcg=/system.slice/docker-{cid}.scope,"
        f"task_memcg=/system.slice/docker-{cid}.scope,task=python3,pid=81234,uid=1000",
        "Memory cgroup out of memory: Killed process 81234 (python3) total-vm:123456kB, "
        "anon-rss:65536kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:300kB oom_score_adj:0",
    )
    assert m.stream == "kernel.oom_kill"
    assert (m.fields["pid"], m.fields["process"], m.fields["scope"]) == (81234, "python3", "cgroup")
    assert m.fields["container"] == cid
    assert m.fields["rss_bytes"] == 65536 * 1024


def test_system_oom_kill():
    [m] = matches(
        "Out of memory: Killed process 4321 (vllm) total-vm:9000kB, anon-rss:8000kB, "
        "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:100kB oom_score_adj:0"
    )
    assert (m.fields["pid"], m.fields["process"], m.fields["scope"]) == (4321, "vllm", "system")
    assert m.fields["container"] == ""


@pytest.mark.parametrize(
    ("line", "bus", "severity"),
    [
        (
            "pcieport 0000:00:03.1: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
            "(Receiver ID)",
            "0000:00:03.1",
            "corrected",
        ),
        (
            "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
            "type=Transaction Layer, (Requester ID)",
            "0000:3b:00.0",
            "nonfatal",
        ),
        (
            "pcieport 0000:00:01.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
            "type=Transaction Layer, (Receiver ID)",
            "0000:00:01.0",
            "fatal",
        ),
    ],
)
def test_pcie_aer(line, bus, severity):
    m = one(line)
    assert m.stream == "kernel.pcie_aer"
    assert (m.fields["pci_bus_id"], m.fields["severity"]) == (bus, severity)


def test_aer_on_a_known_gpu_names_it():
    [ev] = records_to_events(
        parse_kernel_log(
            "[5.0] nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Corrected, type=Data "
            "Link Layer, (Receiver ID)"
        ),
        {"0000:3b:00.0": 2},
    )
    assert (ev.subject, ev.fields["gpu"]) == ("node", 2)


def test_nccl_segfault():
    # the signature gpud's nccl component matches: ".*segfault at.*in libnccl\.so.*"
    m = one(
        "pt_main_thread[2469]: segfault at 7f5fd4a00000 ip 00007f6046d6b2c8 sp 00007ffd1a6ef0e8 "
        "error 4 in libnccl.so.2[7f6046400000+1c400000] likely on CPU 3 (core 3, socket 0)"
    )
    assert m.stream == "kernel.nccl_segfault"
    assert (m.fields["pid"], m.fields["process"], m.fields["library"]) == (
        2469,
        "pt_main_thread",
        "libnccl.so.2",
    )


def test_peermem_error():
    # gpud peermem component
    m = one(
        "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, "
        "skipping further processing"
    )
    assert m.stream == "kernel.peermem_error"
    assert "invalid context" in m.fields["message"]


# --- formats ----------------------------------------------------------------------------

XID_TEXT = (
    "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)


@pytest.mark.parametrize(
    ("line", "fmt", "t", "uptime"),
    [
        (f"6,1234,5678901,-;{XID_TEXT}", "kmsg", 1000.0 + 5.678901, 5.678901),
        (f"[ 5678.901234] {XID_TEXT}", "dmesg", 1000.0 + 5678.901234, 5678.901234),
        (f"<4>[ 5678.901234] {XID_TEXT}", "dmesg", 1000.0 + 5678.901234, 5678.901234),
        (f"[Sun Nov 29 16:21:26 2026] {XID_TEXT}", "dmesg-T", 1795969286.0, None),
        (f"Nov 29 16:21:26 host kernel: {XID_TEXT}", "syslog", 1795969286.0, None),
        (f"2026-11-29T16:21:26+0000 host kernel: {XID_TEXT}", "iso", 1795969286.0, None),
        (f"2026-11-29T16:21:26.500000+00:00 host kernel: {XID_TEXT}", "iso", 1795969286.5, None),
        (f"Nov 29 16:21:26 host kernel: [ 5678.901234] {XID_TEXT}", "syslog", 1795969286.0, None),
    ],
)
def test_every_format_gives_the_same_event(line, fmt, t, uptime):
    rec = parse_line(line, boot_time=1000.0, year=2026)
    assert rec is not None
    assert (rec.fmt, rec.text) == (fmt, XID_TEXT)
    assert rec.t == pytest.approx(t)
    assert rec.uptime == (None if uptime is None else pytest.approx(uptime))
    [ev] = records_to_events([rec], {"0000:3b:00.0": 0})
    assert (ev.stream, ev.subject, ev.fields["code"]) == ("kernel.xid", "gpu:0", 79)
    assert ev.t == pytest.approx(t)


def test_syslog_octal_newlines_join_a_multiline_message():
    recs = parse_kernel_log(
        "Nov 29 16:21:26 host kernel: NVRM: The NVIDIA GPU 0000:b3:00.0#012NVRM: (PCI ID: "
        "10de:26b5) installed in this system has#012NVRM: fallen off the bus and is not "
        "responding to commands.\n",
        year=2026,
    )
    [ev] = records_to_events(recs)
    assert (ev.stream, ev.fields["pci_bus_id"]) == ("kernel.gpu_fallen_off_bus", "0000:b3:00.0")


def test_other_programs_and_journal_banners_are_skipped():
    recs = parse_kernel_log(
        "-- Boot 0123456789abcdef --\n"
        "Nov 29 16:21:26 host systemd[1]: Started moptd.\n"
        "Nov 29 16:21:27 host kernel: hello\n",
        year=2026,
    )
    assert [r.text for r in recs] == ["hello"]


def test_time_unknown_without_boot_time():
    [rec] = parse_kernel_log(f"[ 5.0] {XID_TEXT}")
    assert rec.t is None
    assert rec.uptime == 5.0
    [ev] = records_to_events([rec], default_time=42.0)
    assert ev.t == 42.0


def test_h200_dmesg_and_raw_kmsg_agree():
    dmesg = parse_kernel_log((FIXTURES / "h200/dmesg.txt").read_text(), boot_time=0.0)
    raw = parse_kernel_log((FIXTURES / "h200/kmsg_raw.txt").read_text(), boot_time=0.0)
    assert len(dmesg) == len(raw) == 358
    assert [r.text for r in dmesg] == [r.text for r in raw]
    assert [round(r.uptime or 0, 6) for r in dmesg] == [round(r.uptime or 0, 6) for r in raw]
    # continuation lines are the record's dictionary
    assert any(r.meta.get("SUBSYSTEM") == "pci_bus" for r in raw)
    assert raw[-1].seq == 357
    assert raw[-1].level == 4
    # a healthy boot: no events at all (lockdown notice, taint warning, NVRM chatter)
    assert records_to_events(raw) == []
    assert records_to_events(dmesg) == []


def test_xid119_scenario_dmesg_T():
    path = FIXTURES / "scenarios/gsp-xid119-h100-xe9680/kernel/dmesg.txt"
    events = records_to_events(parse_kernel_log(path.read_text()), {"0000:9b:00.0": 4})
    xids = [e for e in events if e.stream == "kernel.xid"]
    assert len(xids) == len(events) == 5
    assert {e.subject for e in xids} == {"gpu:4"}
    assert {e.fields["code"] for e in xids} == {119}
    assert {e.fields["uuid"] for e in xids} == {"GPU-509665ad-b600-ac93-3616-d754b23d636d"}
    assert xids[0].fields["diagnoses"] == ["GSP_FIRMWARE_ERROR", "GPU_RESET_REQUIRED"]
    assert [e.fields["process"] for e in xids][:3] == ["nvidia-smi"] * 3
    assert xids[0].t == 1740327858.0  # Sun Feb 23 16:24:18 2025, read as UTC
    # 16:24:18 .. 16:27:12 stays one burst; 16:30:13 comes after 3 min of silence
    assert [e.fields["incident"] for e in xids] == ["gpu:4/1740327858"] * 4 + ["gpu:4/1740328213"]


def test_without_a_gpu_map_the_subject_is_the_pci_address():
    [ev] = records_to_events(parse_kernel_log(f"[1.0] {XID_TEXT}"))
    assert ev.subject == "gpu:0000:3b:00.0"
    assert ev.fields["pci_bus_id"] == "0000:3b:00.0"


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("0000:3b:00", "0000:3b:00.0"),
        ("PCI:0000:3B:00", "0000:3b:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("3b:00.0", "0000:3b:00.0"),
        ("0018:01:00", "0018:01:00.0"),
    ],
)
def test_normalise_bus(raw, norm):
    assert pci_key(raw) == norm


# --- bad input ----------------------------------------------------------------------------

_kernelish = st.sampled_from(
    [
        "NVRM: Xid (PCI:",
        "NVRM: Xid (",
        "0000:3b:00",
        " GPU-I:",
        " GPU-CI:",
        "): ",
        "pid=",
        "'<unknown>'",
        ", name=",
        "caused by previous Xid ",
        "NETIR_LINK_EVT Fatal XC0 i0 Link ",
        "NVRM: The NVIDIA GPU ",
        "fallen off the bus and is not responding to commands",
        "SXid (PCI:",
        "NVRM: API mismatch: the client has the version ",
        "NVRM: this kernel module has the version ",
        "oom-kill:constraint=",
        "task_memcg=/docker/",
        "Killed process ",
        "PCIe Bus Error: severity=",
        "segfault at ",
        " in libnccl.so",
        "ERROR ",
        "6,",
        ",-;",
        "[",
        "] ",
        "#012",
        "\\x0a",
        "\n",
        " ",
        "kernel: ",
        "Nov 29 16:21:26 ",
    ]
)
_texts = st.lists(st.one_of(_kernelish, st.text(max_size=20), st.integers(0, 10**6).map(str)))


@settings(max_examples=300, deadline=None)
@given(_texts.map("".join))
def test_random_text_never_raises(text):
    recs = parse_kernel_log(text, boot_time=1.0)
    for rec in recs:
        assert len(rec.text) <= MAX_TEXT
    records_to_events(recs, {"0000:3b:00.0": 0})
    for line in text.split("\n"):
        parse_line(line)
        parse_raw_record(line)
        parse_xid(line)
        pci_key(line)


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1, max_size=50), st.integers(1, 4))
def test_oversized_lines_are_capped(piece, times):
    line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, " + piece * (MAX_TEXT * times)
    for rec in parse_kernel_log(f"[1.0] {line}\n6,1,1,-;{line}\n{line}"):
        assert len(rec.text) <= MAX_TEXT
    rec = parse_raw_record(f"6,1,1,-;{line}")
    assert len(rec.text) <= MAX_TEXT


def test_matcher_state_stays_bounded():
    attributor = Attributor()
    tracemalloc.start()
    try:
        for i in range(20_000):
            bus = f"{i % 65536:04x}:{i % 256:02x}:00"
            for text in (
                f"NVRM: GPU at PCI:{bus}: GPU-{i:08x}-0000-0000-0000-000000000000",
                f"oom-kill:constraint=CONSTRAINT_NONE,task_memcg=/,task=x,pid={i},uid=0",
                f"NVRM: Xid (PCI:{bus}): 13, pid={i}, name=x, fault",
            ):
                attributor.events(parse_raw_record(f"6,{i},{i},-;{text}"), float(i))
            if i == 2_000:
                base, _ = tracemalloc.get_traced_memory()
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    m = attributor.matcher
    assert len(m.uuid_by_bus) <= 256
    assert len(m._oom_memcg) <= 64
    assert len(attributor.incidents._open) <= attributor.incidents.max_open
    assert current - base < 2 << 20  # no growth with the number of records
