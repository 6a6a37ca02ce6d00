"""versions.json in bundles: `moptd record` writes it, replay reads it (its observations
reach the rules, as doctor's do), `moptd replay --diff A B` compares two bundles."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moptd.bundle import read_bundle
from moptd.located import LocatedError
from moptd.record.writer import Recorder, RecordOptions
from moptd.serving.version_lock import VersionsRecord, read_record, stack_for
from tests.test_versions_rules import driver_of

FIX = Path(__file__).parent / "fixtures"
SP = FIX / "site-packages"
A10G_535 = FIX / "incidents" / "a10g-pcie-x8-of-x16-aws"


def moptd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", *args], capture_output=True, text=True, timeout=300
    )


def test_record_writes_versions_json(tmp_path: Path) -> None:
    opts = RecordOptions(
        duration=0.0,
        interval=1.0,
        kmsg=tmp_path / "no-kmsg",
        site_packages=[SP / "vllm-0.4.0-cu121"],
    )
    result = Recorder(opts).record(tmp_path / "bundle")
    assert "versions.json" in result.files
    doc = read_record(tmp_path / "bundle" / "versions.json")
    (stack,) = doc["serving"]
    assert stack["name"] == "configured"
    assert stack["torch"] == {"version": "2.1.2+cu121", "cuda": "12.1"}
    assert stack["cuda_runtime"] == {"version": "12.1", "source": "nvidia-cuda-runtime-cu12"}
    assert stack["distributions"]["vllm"] == "0.4.0.post1"
    tl = read_bundle(tmp_path / "bundle")
    assert tl.meta["versions"] == doc
    sources = {src for _, src, _ in tl.observations}
    assert "versions" in sources


def _bundle(tmp_path: Path, name: str, base: Path, capture: str, stack: Path) -> Path:
    out = tmp_path / name
    shutil.copytree(base, out)
    for doc in ("SOURCE.md", "expected.yaml"):
        (out / doc).unlink(missing_ok=True)
    if capture:
        dumps = out / "gpu" / "nvidia-smi"
        shutil.rmtree(dumps)
        dumps.mkdir(parents=True)
        shutil.copy(FIX / capture, dumps / "001.txt")
    record = VersionsRecord(driver_of(capture or _dump_of(base)), [stack_for("vllm", [stack])])
    (out / "versions.json").write_text(json.dumps(record.to_json()))
    return out


def _dump_of(base: Path) -> str:
    return str((base / "gpu" / "nvidia-smi" / "001.txt").relative_to(FIX))


def test_replay_reads_versions_and_the_rules_see_them(tmp_path: Path) -> None:
    old = _bundle(
        tmp_path, "old", A10G_535, "nvsmi-paste/table-470-a10g.txt", SP / "vllm-0.4.0-cu121"
    )
    out = moptd("replay", str(old), "--json")
    doc = json.loads(out.stdout)
    assert doc["versions"]["driver"]["version"] == "470.256.02"
    codes = {(f["code"], f["subject"]) for f in doc["findings"]}
    assert ("CUDA_DRIVER_TOO_OLD", "node") in codes
    text = moptd("replay", str(old)).stdout
    assert (
        "versions: driver 470.256.02 (CUDA 11.4); "
        "vllm: torch 2.1.2+cu121, vllm 0.4.0.post1, CUDA runtime 12.1" in text
    )


def test_a_bundle_without_versions_still_replays() -> None:
    out = moptd("replay", str(A10G_535))
    assert out.returncode in (0, 1, 2), out.stderr
    assert "versions: not recorded" in out.stdout
    assert json.loads(moptd("replay", str(A10G_535), "--json").stdout)["versions"] is None


def test_diff_shows_versions_then_findings(tmp_path: Path) -> None:
    new = _bundle(tmp_path, "new", A10G_535, "", SP / "vllm-0.4.0-cu121")
    old = _bundle(
        tmp_path, "old", A10G_535, "nvsmi-paste/table-470-a10g.txt", SP / "vllm-0.4.0-cu121"
    )
    out = moptd("replay", "--diff", str(old), str(new), "--json")
    assert out.returncode == 1, out.stderr
    diff = json.loads(out.stdout)
    changes = {c["what"]: (c["before"], c["after"]) for c in diff["versions"]["changes"]}
    assert changes["driver"] == ("470.256.02", "535.247.01")
    assert changes["driver CUDA"] == ("11.4", "12.2")
    assert "serving vllm: torch" not in changes  # the same environment on both
    closed = {(f["code"], f["subject"]) for f in diff["findings"]["closed"]}
    assert ("CUDA_DRIVER_TOO_OLD", "node") in closed
    text = moptd("replay", "--diff", str(old), str(new)).stdout
    lines = text.splitlines()
    assert lines[1] == "versions:"
    assert "  driver: 470.256.02 -> 535.247.01" in lines
    assert text.index("versions:") < text.index("findings closed")


def test_diff_of_a_bundle_with_itself_is_empty(tmp_path: Path) -> None:
    new = _bundle(tmp_path, "new", A10G_535, "", SP / "vllm-0.4.0-cu121")
    out = moptd("replay", "--diff", str(new), str(new))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "versions: the same" in out.stdout


def test_diff_without_versions_says_so() -> None:
    out = moptd("replay", "--diff", str(A10G_535), str(A10G_535))
    assert out.returncode == 0
    assert f"versions: not recorded in {A10G_535} and {A10G_535}" in out.stdout


def test_diff_needs_two_inputs() -> None:
    assert moptd("replay", "--diff", str(A10G_535)).returncode == 3


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("{", "versions.json:1: not JSON"),
        ('{"format": "x"}', "versions.json:0: format: 'x'"),
        ('{"format": "moptd-versions/v1", "gpus": [{"index": "0"}]}', "gpus[0].index"),
        (
            '{"format": "moptd-versions/v1", '
            '"serving": [{"name": "v", "distributions": {"a": 1}}]}',
            "serving[0].distributions",
        ),
    ],
)
def test_a_bad_versions_json_stops_replay_naming_it(tmp_path: Path, text: str, where: str) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(A10G_535, bad)
    (bad / "versions.json").write_text(text)
    with pytest.raises(LocatedError):
        read_record(bad / "versions.json")
    out = moptd("replay", str(bad))
    assert out.returncode == 3
    assert where in out.stderr
