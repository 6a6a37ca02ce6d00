"""WSL2 (docs/wsl.md): detection from the kernel release and /dev/dxg, the Windows driver's
library mount, a Linux driver installed in the guest; NVML's N/A fields never read as faults.
Captures from public issues: tests/fixtures/wsl/SOURCE.md."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.bundle import read_bundle
from moptd.bundle.errors import BundleError
from moptd.collector import CollectorContext
from moptd.collectors import host
from moptd.collectors.host import HostCollector
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.replay import replay_timeline
from moptd.diagnose.timeline import Timeline
from moptd.gpu.nvsmi_table import parse_table
from moptd.proc import wsl

WSL = Path(__file__).parent / "fixtures" / "wsl"
H200 = Path(__file__).parent / "fixtures" / "h200"
INCIDENT = Path(__file__).parent / "fixtures" / "incidents" / "wsl2-tcc-gpus-no-devices-kernel-5-15"


def text(name: str) -> str:
    return (WSL / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "release", "generation"),
    [
        ("uname-a-wsl2-5.10.43.3.txt", "5.10.43.3-microsoft-standard-WSL2", 2),
        ("proc-version-wsl2-5.4.72.txt", "5.4.72-microsoft-standard-WSL2", 2),
        ("proc-version-wsl2-4.19.104.txt", "4.19.104-microsoft-standard", 2),
        ("uname-r-wsl2-4.19.81.txt", "4.19.81-microsoft-standard", 2),
        ("kernel-version-wsl2-5.15.167.4.txt", "5.15.167.4-microsoft-standard-WSL2", 2),
        ("uname-a-wsl1-17763.txt", "4.4.0-17763-Microsoft", 1),
        ("uname-r-wsl1-18362.txt", "4.4.0-18362-Microsoft", 1),
    ],
)
def test_the_kernel_release_tells_wsl2(name: str, release: str, generation: int) -> None:
    got = wsl.release_of(text(name))
    assert got == release
    assert wsl.wsl_generation(got) == generation


def test_a_bare_metal_release_is_no_wsl() -> None:
    # the uname -r files of the recorded bare-metal hosts and incidents in tests/fixtures
    releases = [
        wsl.release_of(f.read_text(encoding="utf-8"))
        for f in sorted(Path(__file__).parent.glob("fixtures/**/uname_r"))
    ]
    bare = [r for r in releases if "microsoft" not in r.lower()]
    assert len(bare) >= 2
    assert [wsl.wsl_generation(r) for r in bare] == [0] * len(bare)


def selected(name: str) -> list[str]:
    """The file names nvidia-container-cli's 'selecting /path' lines name."""
    return re.findall(r"selecting \S*/([^/\s]+)\s*$", text(name), re.M)


def test_guest_driver_libraries_are_told_from_the_windows_stubs() -> None:
    assert wsl.guest_driver_libraries(selected("nvidia-container-cli-guest-driver-470.txt")) == [
        "libnvidia-tls.so.470.57.02",
        "libnvoptix.so.470.57.02",
    ]
    assert wsl.guest_driver_libraries(selected("nvidia-container-cli-guest-driver-460.txt")) == [
        "libnvidia-opencl.so.460.91.03",
        "libnvidia-ptxjitcompiler.so.460.91.03",
    ]
    stubs = re.findall(r"/usr/lib/wsl/lib/(\S+)$", text("ls-usr-lib-wsl-lib-libcuda.txt"), re.M)
    assert stubs == ["libcuda.so", "libcuda.so.1", "libcuda.so.1.1"]
    assert wsl.guest_driver_libraries(stubs) == []
    assert wsl.has_cuda_stub(stubs)
    assert wsl.driver_version_of("libnvoptix.so.470.57.02") == "470.57.02"


def _root(tmp_path: Path, release_file: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "sys/kernel").mkdir(parents=True)
    shutil.copy(H200 / "meminfo", proc / "meminfo")
    shutil.copy(Path("/proc/stat"), proc / "stat")
    (proc / "sys/kernel/osrelease").write_text(wsl.release_of(text(release_file)) + "\n")
    return proc


def _lay(directory: Path, names: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for n in names:
        (directory / n).touch()
    return directory


def _collect(tmp_path: Path, proc: Path, recorded: bool = False) -> dict[str, float]:
    # a recording names the directories it holds (moptd.bundle.sources); the live host
    # reads the configured ones
    options: dict[str, object] = {}
    if not recorded:
        options = {
            "wsl_lib_dir": str(tmp_path / "wsl-lib"),
            "guest_lib_dirs": [str(tmp_path / "x86_64-linux-gnu"), str(tmp_path / "nowhere")],
        }
    ctx = CollectorContext(
        procfs=proc, devfs=tmp_path / "dev", state_dir=tmp_path, recorded=recorded, options=options
    )
    c = HostCollector(ctx)
    try:
        b = c.read()
    finally:
        c.close()
    return {s.signal: s.value for s in b.samples if s.signal.startswith("node.wsl")}


def test_a_wsl2_guest_with_a_linux_driver_in_it(tmp_path: Path) -> None:
    proc = _root(tmp_path, "uname-a-wsl2-5.10.43.3.txt")
    stubs = re.findall(r"/usr/lib/wsl/lib/(\S+)$", text("ls-usr-lib-wsl-lib-libcuda.txt"), re.M)
    _lay(tmp_path / "wsl-lib", stubs)
    _lay(tmp_path / "x86_64-linux-gnu", selected("nvidia-container-cli-guest-driver-470.txt"))
    assert _collect(tmp_path, proc) == {
        "node.wsl2": 1.0,
        "node.wsl_lib_present": 1.0,
        "node.wsl_guest_driver_libs": 2.0,
    }


def test_a_clean_wsl2_guest_and_one_without_the_mount(tmp_path: Path) -> None:
    proc = _root(tmp_path, "kernel-version-wsl2-5.15.167.4.txt")
    assert _collect(tmp_path, proc) == {
        "node.wsl2": 1.0,
        "node.wsl_lib_present": 0.0,  # no /usr/lib/wsl/lib at all
        "node.wsl_guest_driver_libs": 0.0,
    }
    stubs = re.findall(r"/usr/lib/wsl/lib/(\S+)$", text("ls-usr-lib-wsl-lib-libcuda.txt"), re.M)
    _lay(tmp_path / "wsl-lib", stubs)
    assert _collect(tmp_path, proc)["node.wsl_lib_present"] == 1.0


def test_dxg_alone_says_wsl2(tmp_path: Path) -> None:
    proc = _root(tmp_path, "uname-r-wsl1-18362.txt")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "dxg").touch()
    assert _collect(tmp_path, proc)["node.wsl2"] == 1.0


def test_wsl1_and_a_recording(tmp_path: Path) -> None:
    proc = _root(tmp_path, "uname-a-wsl1-17763.txt")
    assert _collect(tmp_path, proc) == {"node.wsl2": 0.0}
    proc2 = _root(tmp_path / "b", "uname-a-wsl2-5.10.43.3.txt")
    _lay(tmp_path / "b" / "x86_64-linux-gnu", selected("nvidia-container-cli-guest-driver-470.txt"))
    # a recording that names no directory: those signals stay absent, whatever the
    # replaying machine's own /usr/lib/wsl/lib holds
    assert _collect(tmp_path, proc2, recorded=True) == {"node.wsl2": 1.0}


def test_the_guest_directories_are_listed_once_a_minute(tmp_path: Path) -> None:
    proc = _root(tmp_path, "uname-a-wsl2-5.10.43.3.txt")
    ctx = CollectorContext(
        procfs=proc,
        devfs=tmp_path / "dev",
        state_dir=tmp_path,
        options={"wsl_lib_dir": str(tmp_path / "l"), "guest_lib_dirs": [str(tmp_path / "g")]},
    )
    c = HostCollector(ctx)
    try:
        first = {s.signal: s.value for s in c.read().samples}
        _lay(tmp_path / "g", selected("nvidia-container-cli-guest-driver-460.txt"))
        cached = {s.signal: s.value for s in c.read().samples}
        c._guest_libs = (time.monotonic() - c.GUEST_LIBS_INTERVAL, 0)
        fresh = {s.signal: s.value for s in c.read().samples}
    finally:
        c.close()
    assert first["node.wsl_guest_driver_libs"] == 0.0
    assert cached["node.wsl_guest_driver_libs"] == 0.0
    assert fresh["node.wsl_guest_driver_libs"] == 2.0


@pytest.mark.parametrize("recorded", [False, True])
def test_the_kernel_is_read_again_once_a_minute_live_and_every_run_in_a_replay(
    tmp_path: Path, recorded: bool
) -> None:
    proc = _root(tmp_path, "uname-a-wsl1-17763.txt")
    c = HostCollector(CollectorContext(procfs=proc, state_dir=tmp_path, recorded=recorded))

    def seen() -> tuple[str, float]:
        samples = c.read().samples
        kernel = [s for s in samples if s.signal == "node.kernel_release"]
        (release,) = (dict(s.labels)["release"] for s in kernel)
        (wsl2,) = (s.value for s in samples if s.signal == "node.wsl2")
        return release, wsl2

    try:
        first = seen()
        # the host booted the WSL2 kernel (the same files a bundle's next step would hold)
        release = wsl.release_of(text("uname-a-wsl2-5.10.43.3.txt"))
        (proc / "sys/kernel/osrelease").write_text(release + "\n")
        next_run = seen()
        assert c._facts is not None
        c._facts = c._facts._replace(read_at=time.monotonic() - host.FACTS_INTERVAL)
        a_minute_on = seen()
    finally:
        c.close()
    assert first == ("4.4.0-17763-Microsoft", 0.0)
    assert a_minute_on == ("5.10.43.3-microsoft-standard-WSL2", 1.0)
    assert next_run == (a_minute_on if recorded else first)


@pytest.mark.parametrize("name", ["nvidia-smi-wsl-510.06.txt", "nvidia-smi-wsl-555.99.txt"])
def test_what_wsl_does_not_report_reads_as_absent_not_zero(name: str) -> None:
    dump = parse_table(text(name))
    assert dump.problems == []
    (gpu,) = dump.gpus
    assert (gpu.fast.memory_total or 0.0) > 0
    assert gpu.slow.ecc_volatile_uncorrected is None  # "Volatile Uncorr. ECC  N/A"
    if name == "nvidia-smi-wsl-510.06.txt":
        assert gpu.fast.util is None  # GPU-Util N/A
        assert gpu.static.power_limit is None  # "3W /  N/A"


def test_a_wsl2_bundle_raises_no_bare_metal_driver_code() -> None:
    timeline = read_bundle(INCIDENT)
    wsl2 = [
        s.value
        for _, _, batch in timeline.iter_observations()
        for s in batch.samples
        if s.signal == "node.wsl2"
    ]
    assert set(wsl2) == {1.0}
    loaded = load_rules([default_rules_dir()])
    report = replay_timeline(timeline, loaded.ruleset)
    codes = {str(f["code"]) for f in report.findings}
    assert not codes & {"GPU_LOST", "DRIVER_NOT_LOADED", "DEVICE_NODE_PROBLEM"}


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_no_text_crashes_the_parsers(s: str) -> None:
    release = wsl.release_of(s)
    assert wsl.wsl_generation(release) in (0, 1, 2)
    assert wsl.guest_driver_libraries(s.split()) == sorted(wsl.guest_driver_libraries(s.split()))
    for name in wsl.listed_names(s, wsl.GUEST_LIB_DIRS):
        assert name
        assert "/" not in name


def test_a_long_name_costs_little() -> None:
    names = ["libnvidia-" + "a" * 100_000 + ".so.535.1", "libcuda.so." + "9" * 100_000]
    start = time.perf_counter()
    wsl.guest_driver_libraries(names)
    wsl.release_of("Linux version " + "x" * 200_000)
    wsl.listed_names("-rwxrwxrwx 1 " + "a " * 50_000 + "/", wsl.GUEST_LIB_DIRS)
    wsl.listed_names("/usr/lib/x86_64-linux-gnu/" * 20_000, wsl.GUEST_LIB_DIRS)
    assert time.perf_counter() - start < 0.5


def _bundle(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "bundle"
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body, encoding="utf-8")
    (root / "bundle.yaml").write_text(
        'format: moptd-bundle/v1\nhost: t\ncaptured_at: "2022-07-07T00:00:00Z"\n'
    )
    return root


def _node_signals(timeline: Timeline) -> dict[str, float]:
    return {
        s.signal: s.value
        for _, _, batch in timeline.iter_observations()
        for s in batch.samples
        if s.signal.startswith("node.wsl")
    }


def test_a_bundle_replays_the_wsl_listings(tmp_path: Path) -> None:
    root = _bundle(
        tmp_path,
        {
            "kernel/uname_r": text("uname-a-wsl2-5.10.43.3.txt"),
            "host/wsl_lib.txt": text("ls-usr-lib-wsl-lib-libcuda.txt"),
            "host/guest_libs.txt": text("nvidia-container-cli-guest-driver-460.txt"),
        },
    )
    assert _node_signals(read_bundle(root)) == {
        "node.wsl2": 1.0,
        "node.wsl_lib_present": 1.0,
        "node.wsl_guest_driver_libs": 2.0,
    }


def test_a_bundle_without_the_listings_leaves_them_unknown(tmp_path: Path) -> None:
    root = _bundle(tmp_path, {"kernel/uname_r": text("uname-r-wsl2-4.19.81.txt")})
    assert _node_signals(read_bundle(root)) == {"node.wsl2": 1.0}


def test_a_listing_that_names_no_library_is_refused(tmp_path: Path) -> None:
    root = _bundle(
        tmp_path,
        {
            "kernel/uname_r": text("uname-r-wsl2-4.19.81.txt"),
            "host/guest_libs.txt": text("proc-version-wsl2-5.4.72.txt"),
        },
    )
    with pytest.raises(BundleError, match=r"guest_libs\.txt:1: names no file of /usr/lib/x86_64"):
        read_bundle(root)
