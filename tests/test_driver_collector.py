"""Driver collector: parsers on real captures, and a pass over a prepared /proc, /sys, /dev."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.collector import CollectorContext
from moptd.collectors.driver import (
    DkmsEntry,
    DriverCollector,
    dkms_kernel_match,
    parse_dkms_status,
    parse_gsp_versions,
    parse_module_version,
    parse_proc_modules,
    parse_secure_boot,
    user_can_open,
)
from moptd.gpu.identities import _proc_gpus
from moptd.observations import Batch

H200 = Path(__file__).parent / "fixtures/h200"


def test_module_version_from_h200():
    text = (H200 / "proc_driver_nvidia_version").read_text()
    assert parse_module_version(text) == ("580.159.04", "open")


def test_proprietary_module_version():
    text = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"
        "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n"
    )
    assert parse_module_version(text) == ("535.129.03", "proprietary")


def test_proc_modules_from_h200():
    assert parse_proc_modules((H200 / "proc_modules").read_text()) == {"nvidia", "nvidia_uvm"}


def test_gsp_version_from_h200_nvidia_smi():
    assert parse_gsp_versions((H200 / "nvsmi_idle.txt").read_text()) == {
        "0000:00:06.0": "580.159.04"
    }


def test_dkms_status_both_layouts():
    entries = parse_dkms_status(
        "nvidia/580.95.05, 6.8.0-45-generic, x86_64: installed\n"
        "nvidia, 535.54.03, 5.15.0-76-generic, x86_64: installed (WARNING! Diff between built "
        "and installed module!)\n"
        "Error! Could not locate dkms.conf file.\n"
    )
    assert entries == [
        DkmsEntry("nvidia", "580.95.05", "6.8.0-45-generic", "x86_64", "installed"),
        DkmsEntry(
            "nvidia",
            "535.54.03",
            "5.15.0-76-generic",
            "x86_64",
            "installed (WARNING! Diff between built and installed module!)",
        ),
    ]
    assert dkms_kernel_match(entries, "6.8.0-45-generic") is True
    assert dkms_kernel_match(entries, "6.8.0-50-generic") is False
    assert dkms_kernel_match([], "6.8.0-45-generic") is None


def test_secure_boot_variable():
    assert parse_secure_boot(b"\x06\x00\x00\x00\x01") is True
    assert parse_secure_boot(b"\x06\x00\x00\x00\x00") is False
    assert parse_secure_boot(b"\x06") is None


def _st(mode: int, uid: int, gid: int) -> os.stat_result:
    return os.stat_result((stat.S_IFCHR | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "owner", "group", "uid", "gids", "ok"),
    [
        (0o666, 0, 0, 1000, {1000}, True),
        (0o660, 0, 44, 1000, {1000, 44}, True),  # video group member
        (0o660, 0, 44, 1000, {1000}, False),
        (0o600, 1000, 0, 1000, {1000}, True),
        (0o644, 0, 0, 1000, {1000}, False),  # read-only is not enough for CUDA
        (0o000, 0, 0, 0, {0}, True),  # root
    ],
)
def test_user_can_open(mode, owner, group, uid, gids, ok):
    assert user_can_open(_st(mode, owner, group), uid, gids) is ok


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parsers_take_any_text(text):
    parse_module_version(text)
    parse_proc_modules(text)
    parse_gsp_versions(text)
    dkms_kernel_match(parse_dkms_status(text), "k")
    parse_secure_boot(text.encode())


def _host(tmp_path: Path) -> tuple[Path, Path, Path]:
    proc, sys, dev = tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"
    (proc / "driver/nvidia/gpus/0000:3b:00.0").mkdir(parents=True)
    (proc / "driver/nvidia/gpus/0000:1a:00.0").mkdir(parents=True)
    (proc / "driver/nvidia/gpus/0000:3b:00.0/information").write_text(
        "Model: NVIDIA H200\nGPU UUID: GPU-3b3b3b3b-0000-0000-0000-000000000000\n"
    )
    (proc / "sys/kernel").mkdir(parents=True)
    shutil.copy(H200 / "proc_modules", proc / "modules")
    shutil.copy(H200 / "proc_driver_nvidia_version", proc / "driver/nvidia/version")
    shutil.copy(H200 / "tainted", proc / "sys/kernel/tainted")
    shutil.copy(H200 / "uname_r", proc / "sys/kernel/osrelease")
    (proc / "4242").mkdir()
    (proc / "4242/comm").write_text("nvidia-persiste\n")
    efivars = sys / "firmware/efi/efivars"
    efivars.mkdir(parents=True)
    (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-e98c0e5b6a9a").write_bytes(b"\x06\0\0\0\x01")
    (sys / "kernel/security").mkdir(parents=True)
    (sys / "kernel/security/lockdown").write_text("none [integrity] confidentiality\n")
    dev.mkdir()
    for name in ("nvidia0", "nvidiactl"):  # real character devices (the null device)
        (dev / name).symlink_to("/dev/null")
    (dev / "nvidia-uvm-tools").write_text("")  # not a character device
    return proc, sys, dev


def _values(batch: Batch, signal: str) -> dict[tuple[tuple[str, str], ...], object]:
    return {s.labels: s.value for s in batch.samples if s.signal == signal}


async def test_a_pass_over_a_prepared_host(tmp_path):
    proc, sys, dev = _host(tmp_path)
    ctx = CollectorContext(
        options={"dev_dir": str(dev), "serving_user": "root", "use_tools": False},
        procfs=proc,
        sysfs=sys,
    )
    collector = DriverCollector(ctx)
    try:
        batch = await collector.collect()
    finally:
        await collector.stop()
    loaded = _values(batch, "driver.module_loaded")
    assert loaded[(("module", "nvidia"),)] == 1.0
    assert loaded[(("module", "nvidia_uvm"),)] == 1.0
    assert loaded[(("module", "nvidia_peermem"),)] == 0.0
    assert _values(batch, "driver.kernel_module_version") == {
        (("flavor", "open"), ("version", "580.159.04")): 1.0
    }
    assert _values(batch, "driver.tainted") == {(): 4096.0}
    assert _values(batch, "driver.secure_boot") == {(): 1.0}
    assert _values(batch, "driver.kernel_lockdown") == {(): 1.0}
    present = _values(batch, "driver.dev_node_present")
    assert present[(("node", "nvidia0"),)] == 1.0
    assert present[(("node", "nvidiactl"),)] == 1.0
    assert present[(("node", "nvidia-uvm"),)] == 0.0  # missing: CUDA cannot start
    assert present[(("node", "nvidia-uvm-tools"),)] == 0.0  # a plain file
    access = _values(batch, "driver.dev_node_accessible")
    assert access[(("node", "nvidia0"), ("user", "root"))] == 1.0
    assert _values(batch, "driver.dev_node_mode")[(("node", "nvidia0"),)] == float(
        stat.S_IMODE(os.stat("/dev/null").st_mode)
    )
    assert _values(batch, "driver.persistenced_running") == {(): 1.0}
    assert _values(batch, "driver.nvswitch_present") == {(): 0.0}
    assert "driver.fabricmanager_running" not in {s.signal for s in batch.samples}
    # no dkms run (use_tools false): no verdict rather than a wrong one
    assert "driver.dkms_kernel_match" not in {s.signal for s in batch.samples}


async def test_without_proc_modules_the_collector_is_unavailable(tmp_path):
    from moptd.collector import Unavailable

    collector = DriverCollector(CollectorContext(procfs=tmp_path, options={"use_tools": False}))
    with pytest.raises(Unavailable, match="modules"):
        await collector.collect()
    await collector.stop()


def test_gpu_map_from_proc_in_bus_order(tmp_path):
    proc, _, _ = _host(tmp_path)
    index, uuid = _proc_gpus(proc)
    assert index == {"0000:1a:00.0": 0, "0000:3b:00.0": 1}
    assert uuid == {"0000:3b:00.0": "GPU-3b3b3b3b-0000-0000-0000-000000000000"}
