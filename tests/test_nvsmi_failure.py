"""nvidia-smi's own failure messages are evidence: real pasted messages
(tests/fixtures/nvsmi-paste, SOURCE.md) become NVML's outcome, and the rules diagnose
them as they do the same failure on a live host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.bundle import BundleError, read_bundle
from moptd.cli import main
from moptd.gpu.nvsmi import dump_to_batch, read_dump
from moptd.gpu.nvsmi_failure import parse_failures

PASTE = Path(__file__).parent / "fixtures" / "nvsmi-paste"


@pytest.mark.parametrize(
    ("name", "kind", "code", "bus", "library"),
    [
        ("fail-couldnt-communicate.txt", "driver_not_loaded", 9, "", ""),
        ("fail-couldnt-communicate-wrapped.txt", "driver_not_loaded", 9, "", ""),
        ("fail-version-mismatch-570.txt", "init_failed", 18, "", "570.124"),
        ("fail-version-mismatch-550.txt", "init_failed", 18, "", "550.144"),
        ("fail-version-mismatch-460.txt", "init_failed", 18, "", ""),
        ("fail-version-mismatch-capital.txt", "init_failed", 18, "", ""),
        ("fail-device-handle-unknown.txt", "device_handle", 999, "0000:0b:00.0", ""),
        ("fail-device-handle-nospace.txt", "device_handle", 999, "0000:07:00.0", ""),
        ("fail-gpu-is-lost.txt", "device_handle", 15, "0000:02:00.0", ""),
        ("fail-no-devices.txt", "no_devices", 0, "", ""),
    ],
)
def test_each_message_is_read(name: str, kind: str, code: int, bus: str, library: str) -> None:
    dump = read_dump(PASTE / name)
    assert dump.kind == "nvidia-smi-failure"
    assert dump.gpus == []
    [failure] = dump.failures
    got = (failure.kind, failure.nvml_error, failure.pci_bus_id, failure.library_version)
    assert got == (kind, code, bus, library)


def test_device_handle_failure_is_the_nvml_collectors_lost_gpu() -> None:
    batch = dump_to_batch(read_dump(PASTE / "fail-device-handle-unknown.txt"))
    values = {(s.signal, s.subject): s.value for s in batch.samples}
    # NVML_ERROR_UNKNOWN from a device query is GpuLost in moptd.gpu.backend
    assert values[("gpu.lost", "gpu:0000:0b:00.0")] == 1.0
    assert values[("gpu.nvml_error", "gpu:0000:0b:00.0")] == 999.0
    assert values[("gpu.nvml_init_error", "node")] == 0.0  # nvmlInit itself succeeded


def test_a_known_index_names_the_gpu() -> None:
    batch = dump_to_batch(read_dump(PASTE / "fail-gpu-is-lost.txt"), {"0000:02:00.0": 1})
    assert ("gpu.lost", "gpu:1") in {(s.signal, s.subject) for s in batch.samples}


def _replay(tmp_path: Path, capsys: pytest.CaptureFixture[str], *names: str) -> list[dict]:
    bundle = tmp_path / "b"
    (bundle / "gpu" / "nvidia-smi").mkdir(parents=True)
    (bundle / "bundle.yaml").write_text("format: moptd-bundle/v1\n")
    for i, name in enumerate(names):
        shutil.copy(PASTE / name, bundle / "gpu" / "nvidia-smi" / f"{i:03}.txt")
    main(["replay", str(bundle), "--json"])
    findings: list[dict] = json.loads(capsys.readouterr().out)["findings"]
    return findings


@pytest.mark.parametrize(
    ("name", "code", "subject"),
    [
        ("fail-couldnt-communicate.txt", "DRIVER_NOT_LOADED", "node"),
        ("fail-couldnt-communicate-wrapped.txt", "DRIVER_NOT_LOADED", "node"),
        ("fail-version-mismatch-570.txt", "DRIVER_VERSION_MISMATCH", "node"),
        ("fail-version-mismatch-capital.txt", "DRIVER_VERSION_MISMATCH", "node"),
        ("fail-device-handle-unknown.txt", "GPU_LOST", "gpu:0000:0b:00.0"),
        ("fail-gpu-is-lost.txt", "GPU_LOST", "gpu:0000:02:00.0"),
    ],
)
def test_replay_diagnoses_the_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, code: str, subject: str
) -> None:
    findings = _replay(tmp_path, capsys, name)
    assert [(f["code"], f["subject"]) for f in findings] == [(code, subject)]


def test_gpu_lost_finding_names_the_pci_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [finding] = _replay(tmp_path, capsys, "fail-gpu-is-lost.txt")
    assert finding["pci_bus_id"] == "0000:02:00.0"


def test_no_devices_alone_names_no_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _replay(tmp_path, capsys, "fail-no-devices.txt") == []


def test_a_table_then_a_lost_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A GPU the earlier dump named by index keeps its index when it is lost later."""
    bundle = tmp_path / "b"
    (bundle / "gpu" / "nvidia-smi").mkdir(parents=True)
    shutil.copy(PASTE / "table-580-h200-idle.txt", bundle / "gpu" / "nvidia-smi" / "001.txt")
    lost = "Unable to determine the device handle for GPU 0000:00:06.0: Unknown Error\n"
    (bundle / "gpu" / "nvidia-smi" / "002.txt").write_text(lost)
    tl = read_bundle(bundle)
    last = [b for _, s, b in tl.observations if s == "nvml"][-1]
    assert ("gpu.lost", "gpu:0") in {(s.signal, s.subject) for s in last.samples}


def test_text_that_is_no_nvidia_smi_output_is_still_an_error(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    (bundle / "gpu" / "nvidia-smi").mkdir(parents=True)
    (bundle / "gpu" / "nvidia-smi" / "001.txt").write_text("bash: nvidia-smi: command not found\n")
    with pytest.raises(BundleError) as e:
        read_bundle(bundle)
    assert "not nvidia-smi output" in e.value.message


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_parse_failures_never_crashes(text: str) -> None:
    for f in parse_failures(text):
        assert f.line >= 1
        assert f.nvml_error >= 0


_MESSAGES = [p.read_text() for p in sorted(PASTE.glob("fail-*.txt"))]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_MESSAGES), st.text(max_size=100), st.text(max_size=100))
def test_a_message_inside_other_text_is_still_found(msg: str, before: str, after: str) -> None:
    text = before + "\n" + msg + "\n" + after
    assert len(parse_failures(text)) >= 1


def test_bounded_cost_on_long_lines() -> None:
    line = "Unable to determine the device handle for GPU " + "0" * 1_000_000
    assert parse_failures(line * 3) == []


def test_an_untimed_message_before_a_timed_dump_is_placed(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    (bundle / "gpu" / "nvidia-smi").mkdir(parents=True)
    shutil.copy(PASTE / "fail-couldnt-communicate.txt", bundle / "gpu" / "nvidia-smi" / "001.txt")
    shutil.copy(PASTE / "table-580-h200-idle.txt", bundle / "gpu" / "nvidia-smi" / "002.txt")
    tl = read_bundle(bundle)
    times = [t for t, s, _ in tl.observations if s == "nvml"]
    assert times == [1795969286.0, 1795969286.0]  # placed at the first timed evidence


HOST = Path(__file__).parent / "fixtures" / "host-paste"


@pytest.mark.parametrize(
    ("modules", "expected"),
    [
        # mattshma/bigdata#133: nvidia-smi could not communicate and lsmod shows no nvidia
        ("lsmod-grep-nvidia-empty.txt", [("DRIVER_NOT_LOADED", "node")]),
        # the module is loaded: "couldn't communicate" is then no missing module
        ("lsmod-grep-nvidia-dgx.txt", []),
    ],
)
def test_couldnt_communicate_with_lsmod(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    modules: str,
    expected: list[tuple[str, str]],
) -> None:
    bundle = tmp_path / "b"
    (bundle / "gpu" / "nvidia-smi").mkdir(parents=True)
    (bundle / "kernel").mkdir()
    shutil.copy(PASTE / "fail-couldnt-communicate.txt", bundle / "gpu" / "nvidia-smi" / "001.txt")
    shutil.copy(HOST / modules, bundle / "kernel" / "proc_modules")
    main(["replay", str(bundle), "--json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["code"], f["subject"]) for f in findings] == expected
