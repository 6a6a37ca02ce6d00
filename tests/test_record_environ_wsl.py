"""`moptd record` writes what replay reads: serving/NAME/environ.txt (the managed process's
CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, from /proc/PID/environ) and, on WSL2 guests,
host/wsl_lib.txt and host/guest_libs.txt. Each is recorded, then replayed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from moptd.bundle import read_bundle
from moptd.cli.cmd_record import managed_pid
from moptd.proc import wsl
from moptd.record.writer import Recorder, RecordOptions, ServingSource

FIX = Path(__file__).parent / "fixtures"
WSL = FIX / "wsl"
# The UUID of the H200 in tests/fixtures/bundles/h200-idle-healthy/gpu/nvidia-smi/001.xml
H200 = "GPU-a825b2f6-3dfa-91e3-255f-343d3b48604a"


def samples_of(bundle: Path, signal: str) -> list[tuple[str, dict[str, str], float]]:
    tl = read_bundle(bundle)
    return [
        (s.subject, dict(s.labels), float(s.value))
        for _, _, b in tl.observations
        for s in b.samples
        if s.signal == signal
    ]


@pytest.fixture
def engine() -> Iterator[subprocess.Popen[bytes]]:
    """A real process standing in for the engine, with its CUDA variables and others."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CUDA_VISIBLE_DEVICES": H200,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "HF_TOKEN": "not-for-the-bundle",
    }
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    yield proc
    proc.kill()
    proc.wait()


def test_environ_is_recorded_with_only_the_cuda_variables_and_replayed(
    tmp_path: Path, engine: subprocess.Popen[bytes]
) -> None:
    opts = RecordOptions(
        duration=0.0,
        interval=1.0,
        kmsg=tmp_path / "no-kmsg",
        serving=[ServingSource("vllm", pid=engine.pid, managed=True)],
    )
    result = Recorder(opts).record(tmp_path / "bundle")
    assert "serving/vllm/environ.txt" in result.files
    text = (tmp_path / "bundle" / "serving" / "vllm" / "environ.txt").read_text()
    assert text == f"CUDA_VISIBLE_DEVICES={H200}\nCUDA_DEVICE_ORDER=PCI_BUS_ID\n"
    assert "HF_TOKEN" not in text
    got = samples_of(tmp_path / "bundle", "serving.gpu")
    assert got == [("serving:vllm", {"gpu": H200}, 1.0)]


def test_no_pid_is_a_note_not_a_file(tmp_path: Path) -> None:
    opts = RecordOptions(
        duration=0.0,
        interval=1.0,
        kmsg=tmp_path / "no-kmsg",
        serving=[ServingSource("vllm", managed=True)],
    )
    result = Recorder(opts).record(tmp_path / "bundle")
    assert "serving/vllm/environ.txt" not in result.files
    assert any(
        n.startswith("serving/vllm/environ.txt: the managed process's PID") for n in result.notes
    )
    assert samples_of(tmp_path / "bundle", "serving.gpu") == []


def test_a_process_without_cuda_variables_says_so(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={"PATH": "/usr/bin:/bin"}
    )
    try:
        opts = RecordOptions(
            duration=0.0,
            interval=1.0,
            kmsg=tmp_path / "no-kmsg",
            serving=[ServingSource("vllm", pid=proc.pid, managed=True)],
        )
        result = Recorder(opts).record(tmp_path / "bundle")
    finally:
        proc.kill()
        proc.wait()
    assert "serving/vllm/environ.txt" not in result.files
    assert any("sets none of CUDA_VISIBLE_DEVICES" in n for n in result.notes)


def test_no_daemon_answering_gives_no_pid(tmp_path: Path) -> None:
    assert managed_pid(tmp_path / "no.sock", "vllm") is None


def _wsl_host(tmp_path: Path, lib_names: list[str], guest_names: list[str]) -> RecordOptions:
    """A WSL2 guest's files from public captures: the kernel release of
    uname-r-wsl2-4.19.81.txt, /usr/lib/wsl/lib holding the files ls-usr-lib-wsl-lib-libcuda.txt
    lists, a guest library directory holding what nvidia-container-cli selected there."""
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "osrelease").write_text(
        (WSL / "uname-r-wsl2-4.19.81.txt").read_text()
    )
    lib = tmp_path / "wsl-lib"
    if lib_names:
        lib.mkdir()
        for name in lib_names:
            (lib / name).touch()
    guest = tmp_path / "x86_64-linux-gnu"
    guest.mkdir()
    for name in guest_names:
        (guest / name).touch()
    return RecordOptions(
        duration=0.0,
        interval=1.0,
        procfs=proc,
        kmsg=tmp_path / "no-kmsg",
        wsl_lib_dir=lib,
        guest_lib_dirs=(guest,),
    )


def _names_in(capture: str, directory: str) -> list[str]:
    return wsl.listed_names((WSL / capture).read_text(), (directory,))


def test_a_wsl2_guest_records_its_library_listings_and_replays_them(tmp_path: Path) -> None:
    stub = _names_in("ls-usr-lib-wsl-lib-libcuda.txt", wsl.WSL_LIB_DIR)
    guest = _names_in("nvidia-container-cli-guest-driver-470.txt", "/usr/lib/x86_64-linux-gnu")
    assert "libcuda.so.1" in stub
    assert len(guest) == 2
    result = Recorder(_wsl_host(tmp_path, stub, guest)).record(tmp_path / "bundle")
    assert {"host/wsl_lib.txt", "host/guest_libs.txt", "kernel/uname_r"} <= set(result.files)
    bundle = tmp_path / "bundle"
    assert (bundle / "kernel" / "uname_r").read_text().strip() == "4.19.81-microsoft-standard"
    got = {
        signal: samples_of(bundle, signal)
        for signal in ("node.wsl2", "node.wsl_lib_present", "node.wsl_guest_driver_libs")
    }
    assert got["node.wsl2"] == [("node", {}, 1.0)]
    assert got["node.wsl_lib_present"] == [("node", {}, 1.0)]
    # libnvoptix.so.470.57.02 and libnvidia-tls.so.470.57.02: a Linux driver in the guest
    assert got["node.wsl_guest_driver_libs"] == [("node", {}, 2.0)]


def test_a_missing_wsl_lib_mount_is_recorded_as_missing(tmp_path: Path) -> None:
    result = Recorder(_wsl_host(tmp_path, [], [])).record(tmp_path / "bundle")
    assert "host/wsl_lib.txt" in result.files
    assert "host/guest_libs.txt" not in result.files  # an empty directory names nothing
    assert any(n.startswith("host/guest_libs.txt: ") for n in result.notes)
    text = (tmp_path / "bundle" / "host" / "wsl_lib.txt").read_text()
    assert "No such file or directory" in text  # ls's own message
    assert samples_of(tmp_path / "bundle", "node.wsl_lib_present") == [("node", {}, 0.0)]


def test_an_empty_wsl_lib_mount_reads_as_no_stub(tmp_path: Path) -> None:
    opts = _wsl_host(tmp_path, [], [])
    opts.wsl_lib_dir.mkdir()
    Recorder(opts).record(tmp_path / "bundle")
    assert samples_of(tmp_path / "bundle", "node.wsl_lib_present") == [("node", {}, 0.0)]


def test_no_wsl_files_off_wsl(tmp_path: Path) -> None:
    opts = _wsl_host(tmp_path, ["libcuda.so.1"], [])
    # the kernel release of an H200 host (tests/fixtures/bundles/h200-matmul-power-cap)
    release = FIX / "bundles" / "h200-matmul-power-cap" / "kernel" / "uname_r"
    (opts.procfs / "sys" / "kernel" / "osrelease").write_text(release.read_text())
    result = Recorder(opts).record(tmp_path / "bundle")
    assert not {"host/wsl_lib.txt", "host/guest_libs.txt"} & set(result.files)


def test_record_asks_the_running_daemon_for_the_managed_process(tmp_path: Path) -> None:
    from tests.api_helpers import get, wait_socket
    from tests.daemon_proc import DaemonProcess, free_port

    managed = {
        "name": "llm",
        "device": "cpu",
        "port": free_port(),
        "command": [sys.executable, "-c", "import time; time.sleep(120)"],
        "env": {"CUDA_VISIBLE_DEVICES": H200, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
    }
    d = DaemonProcess(tmp_path, {"collectors": {"serving": {"managed": managed}}}).start()
    try:
        wait_socket(d.socket, d.proc)
        pid = None
        for _ in range(100):
            _, body = get(d.socket, "/v1/serving")
            pid = (body or {}).get("managed", {}).get("pid")
            if pid:
                break
            time.sleep(0.1)
        assert pid, d.log()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "moptd",
                "record",
                "--duration",
                "0s",
                "--quiet",
                "--out",
                str(tmp_path / "bundle"),
                "--config",
                str(d.config_path),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        d.stop()
    assert out.returncode == 0, out.stderr
    environ = tmp_path / "bundle" / "serving" / "llm" / "environ.txt"
    assert environ.read_text() == f"CUDA_VISIBLE_DEVICES={H200}\nCUDA_DEVICE_ORDER=PCI_BUS_ID\n"
    assert samples_of(tmp_path / "bundle", "serving.gpu") == [("serving:llm", {"gpu": H200}, 1.0)]
