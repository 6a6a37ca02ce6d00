"""Pasted host command output where a bundle expects a file: lsmod for /proc/modules,
ls -l /dev/nvidia*, /proc/driver/nvidia/version, dkms status (tests/fixtures/host-paste,
SOURCE.md). Each is read by the driver collector as it reads the live files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.bundle import BundleError, read_bundle
from moptd.bundle.sources import (
    check_dev_nodes,
    check_dkms_status,
    host_paste_place,
    kernel_release_text,
    modules_text,
)
from moptd.collectors.driver import parse_module_version, parse_proc_modules
from moptd.observations import Batch

PASTE = Path(__file__).parent / "fixtures" / "host-paste"


def _driver(tmp_path: Path, files: dict[str, str]) -> Batch:
    bundle = tmp_path / "b"
    for rel, name in files.items():
        (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PASTE / name, bundle / rel)
    tl = read_bundle(bundle)
    [batch] = [b for _, s, b in tl.observations if s == "driver"]
    return batch


def _values(batch: Batch, signal: str, label: str) -> dict[str, float]:
    out = {}
    for s in batch.samples:
        if s.signal == signal:
            out[dict(s.labels)[label]] = float(s.value)
    return out


def test_lsmod_grep_is_read_as_proc_modules(tmp_path: Path) -> None:
    batch = _driver(tmp_path, {"kernel/proc_modules": "lsmod-grep-nvidia-uvm-missing.txt"})
    loaded = _values(batch, "driver.module_loaded", "module")
    assert loaded == {
        "nvidia": 1.0,
        "nvidia_uvm": 0.0,  # the RHEL 8 host of the paste had not loaded it
        "nvidia_modeset": 1.0,
        "nvidia_drm": 1.0,
        "nvidia_peermem": 0.0,
    }


def test_lsmod_of_an_nvswitch_host(tmp_path: Path) -> None:
    batch = _driver(tmp_path, {"kernel/proc_modules": "lsmod-grep-nvidia-dgx.txt"})
    loaded = _values(batch, "driver.module_loaded", "module")
    assert loaded["nvidia"] == loaded["nvidia_uvm"] == 1.0
    assert loaded["nvidia_peermem"] == 0.0  # nv_peer_mem is the older, separate module


def test_proc_modules_still_reads_the_same() -> None:
    text = (PASTE / "proc-modules-h200.txt").read_text()
    assert parse_proc_modules(modules_text(text, "f")) == parse_proc_modules(text)
    assert parse_proc_modules(text) == {"nvidia", "nvidia_uvm"}


def test_a_line_that_is_no_module_names_its_line(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    (bundle / "kernel").mkdir(parents=True)
    lines = (PASTE / "lsmod-grep-nvidia-dgx.txt").read_text().splitlines()
    lines.insert(2, "modprobe: FATAL: Module nvidia not found.")
    (bundle / "kernel" / "proc_modules").write_text("\n".join(lines) + "\n")
    with pytest.raises(BundleError) as e:
        read_bundle(bundle)
    assert e.value.line == 3
    assert e.value.message.startswith("not a copy of /proc/modules or the output of lsmod")


@pytest.mark.parametrize(
    ("name", "version", "flavor"),
    [
        ("driver-version-580-open.txt", "580.159.04", "open"),
        ("driver-version-565-open.txt", "565.57.01", "open"),
        ("driver-version-525-open-arch.txt", "525.60.11", "open"),
        ("driver-version-384-proprietary.txt", "384.98", "proprietary"),
        ("driver-version-jetson-aarch64.txt", "35.3.1", "open"),
    ],
)
def test_driver_version_variants(tmp_path: Path, name: str, version: str, flavor: str) -> None:
    assert parse_module_version((PASTE / name).read_text()) == (version, flavor)
    batch = _driver(tmp_path, {"kernel/driver_version": name})
    [s] = [s for s in batch.samples if s.signal == "driver.kernel_module_version"]
    assert dict(s.labels) == {"version": version, "flavor": flavor}


def test_ls_l_dev_nodes(tmp_path: Path) -> None:
    batch = _driver(
        tmp_path,
        {
            "host/dev_nodes.txt": "dev-nodes-h200.txt",
            "kernel/proc_modules": "proc-modules-h200.txt",
        },
    )
    present = _values(batch, "driver.dev_node_present", "node")
    # the nvidia-caps directory and its "total 0" are not nodes
    assert present == {"nvidia0": 1.0, "nvidia-uvm": 1.0, "nvidia-uvm-tools": 1.0, "nvidiactl": 1.0}
    assert _values(batch, "driver.dev_node_mode", "node")["nvidiactl"] == 0o666


def test_names_only_listing_is_refused_with_a_hint(tmp_path: Path) -> None:
    text = (PASTE / "ls-1-dev-nvidia-dgx.txt").read_text()
    with pytest.raises(BundleError) as e:
        check_dev_nodes(text, "host/dev_nodes.txt")
    assert e.value.line == 2
    assert "ls -l /dev/nvidia*" in e.value.message


@pytest.mark.parametrize(
    ("name", "kernel", "match"),
    [
        ("dkms-status-new-535.txt", "6.5.0-060500rc5-generic", 1.0),
        ("dkms-status-old-multikernel.txt", "4.17.12-200.fc28.x86_64", 1.0),
        ("dkms-status-old-multikernel.txt", "4.18.5-200.fc28.x86_64", 0.0),
        ("dkms-status-original-module.txt", "4.17.14-202.fc28.x86_64", 1.0),
        ("dkms-status-error.txt", "4.17.14-202.fc28.x86_64", None),  # dkms itself failed
    ],
)
def test_dkms_status_variants(tmp_path: Path, name: str, kernel: str, match: float | None) -> None:
    bundle = tmp_path / "b"
    (bundle / "kernel").mkdir(parents=True)
    shutil.copy(PASTE / name, bundle / "kernel" / "dkms_status.txt")
    (bundle / "kernel" / "uname_r").write_text(kernel + "\n")  # the kernel the test asks about
    tl = read_bundle(bundle)
    got = [
        float(s.value)
        for _, src, b in tl.observations
        if src == "driver"
        for s in b.samples
        if s.signal == "driver.dkms_kernel_match"
    ]
    assert got == ([] if match is None else [match])


def test_dkms_file_with_other_text_names_its_line() -> None:
    text = (PASTE / "dkms-status-new-535.txt").read_text() + "Segmentation fault\n"
    with pytest.raises(BundleError) as e:
        check_dkms_status(text, "kernel/dkms_status.txt")
    assert e.value.line == 4


# --- property-based: no input crashes a check; cost stays bounded --------------------


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_checks_raise_only_bundle_errors(text: str) -> None:
    for check in (modules_text, check_dev_nodes, check_dkms_status):
        try:
            check(text, "f")
        except BundleError as e:
            problem: BundleError | None = e
        else:
            problem = None
        assert problem is None or problem.line >= 0


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["lsmod-grep-nvidia-dgx.txt", "lsmod-grep-nvidia-uvm-missing.txt"]),
    st.integers(1, 50),
)
def test_modules_text_keeps_every_module_line(name: str, repeat: int) -> None:
    text = (PASTE / name).read_text() * repeat
    kept = modules_text(text, "f").splitlines()
    assert len(kept) == len([line for line in text.splitlines() if line.strip()])


def test_bounded_cost_on_a_long_dev_nodes_paste() -> None:
    text = (PASTE / "dev-nodes-h200.txt").read_text() * 20_000
    check_dev_nodes(text, "f")


_PLACES = {
    "dev-nodes-h200.txt": "host/dev_nodes.txt",
    "ls-1-dev-nvidia-dgx.txt": "host/dev_nodes.txt",  # its check then says what to paste
    "proc-modules-h200.txt": "kernel/proc_modules",
    "lsmod-grep-nvidia-dgx.txt": "kernel/proc_modules",
    "lsmod-grep-nvidia-uvm-missing.txt": "kernel/proc_modules",
    "lsmod-grep-nvidia-empty.txt": "kernel/proc_modules",
    "dkms-status-error.txt": "kernel/dkms_status.txt",
    "dkms-status-new-535.txt": "kernel/dkms_status.txt",
    "dkms-status-old-multikernel.txt": "kernel/dkms_status.txt",
    "dkms-status-original-module.txt": "kernel/dkms_status.txt",
    "uname-r-h200.txt": "kernel/uname_r",
    "uname-a-fedora.txt": "kernel/uname_r",
    "uname-a-void-prompt.txt": "kernel/uname_r",
}


@pytest.mark.parametrize("name", sorted(p.name for p in PASTE.glob("*.txt")))
def test_each_paste_is_placed_by_content(name: str) -> None:
    expected = _PLACES.get(name, "kernel/driver_version" if "driver-version" in name else None)
    assert host_paste_place((PASTE / name).read_text()) == expected


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    "other",
    [
        "h200/dmesg.txt",
        "h200/kmsg_raw.txt",
        "h200/meminfo",
        "h200/df.txt",
        "h200/swappiness",
        "h200/tainted",
        "h200/nvsmi_idle.txt",
        "h200/nvsmi_table_idle.txt",
        "h200/oom_fragmentation.txt",
        "host-paste/SOURCE.md",
        "bundles/vllm-log-oom-plain/serving/main/log.txt",
        "bundles/vllm-log-healthy/serving/main/log.txt",
    ],
)
def test_other_files_are_no_host_paste(other: str) -> None:
    assert host_paste_place((FIXTURES / other).read_text()) is None


@pytest.mark.parametrize(
    ("name", "release"),
    [
        ("uname-r-h200.txt", "6.18.44-fc-v657-gpu"),
        ("uname-a-fedora.txt", "6.12.15-200.fc41.x86_64"),
        ("uname-a-void-prompt.txt", "4.7.2_1"),
    ],
)
def test_uname_r_or_uname_a_gives_the_running_kernel(
    tmp_path: Path, name: str, release: str
) -> None:
    assert kernel_release_text((PASTE / name).read_text(), "f") == release + "\n"
    # in a bundle beside a dkms status of another host: read, and not its kernels
    bundle = tmp_path / "b"
    (bundle / "kernel").mkdir(parents=True)
    shutil.copy(PASTE / name, bundle / "kernel" / "uname_r")
    shutil.copy(PASTE / "dkms-status-old-multikernel.txt", bundle / "kernel" / "dkms_status.txt")
    tl = read_bundle(bundle)
    match = [
        s.value
        for _, src, b in tl.observations
        if src == "driver"
        for s in b.samples
        if s.signal == "driver.dkms_kernel_match"
    ]
    assert match == [0.0]


def test_uname_file_with_other_text_names_its_line() -> None:
    text = (PASTE / "lsmod-grep-nvidia-dgx.txt").read_text()
    with pytest.raises(BundleError) as e:
        kernel_release_text(text, "kernel/uname_r")
    assert e.value.line == 1


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_host_paste_place_never_raises(text: str) -> None:
    assert host_paste_place(text) in (
        None,
        "kernel/proc_modules",
        "kernel/driver_version",
        "kernel/dkms_status.txt",
        "kernel/uname_r",
        "host/dev_nodes.txt",
    )
