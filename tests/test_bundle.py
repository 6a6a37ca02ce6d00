"""Bundle reading: missing files are unknown evidence, malformed ones exit 2 with file:line."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moptd.bundle import BundleError, read_bundle
from moptd.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "bundles" / "h200-matmul-power-cap"


def test_h200_bundle_timeline() -> None:
    tl = read_bundle(H200)
    assert sorted(tl.missing) == ["container/daemon.json", "kernel/dkms_status.txt", "serving/"]
    steps = tl.steps()
    assert len(steps) == 92  # 90 NVML samples + 2 nvidia-smi dumps
    assert steps[0] == pytest.approx(1795969286.0)
    sources = {s for _, s, _ in tl.iter_observations()}
    assert sources == {"nvml", "samples", "host", "driver"}
    assert tl.events == [] or all(e.t >= steps[0] for e in tl.events)


def test_empty_bundle_is_all_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bundle.yaml").write_text("format: moptd-bundle/v1\n")
    import json

    assert main(["replay", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["findings"] == []
    assert out["missing_evidence"] == [
        "container/daemon.json",
        "gpu/nvidia-smi",
        "host/dev_nodes.txt",
        "host/df.txt",
        "host/meminfo",
        "host/swappiness",
        "kernel/dkms_status.txt",
        "kernel/dmesg.txt",
        "kernel/driver_version",
        "kernel/proc_modules",
        "kernel/tainted",
        "kernel/uname_r",
        "serving/",
    ]


def test_tar_gz_bundle(tmp_path: Path) -> None:
    tgz = tmp_path / "b.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(FIXTURES / "scenarios" / "row-remap-pending-a10", arcname="row-remap")
    tl = read_bundle(tgz)
    # the nvidia-smi dump, and the driver collector's reading of the version it shows
    assert [s for _, s, _ in tl.iter_observations()] == ["nvml", "driver"]
    driver = list(tl.iter_observations())[1][2]
    assert [s.signal for s in driver.samples] == ["driver.user_space_version"]


@pytest.mark.parametrize(
    ("rel", "text", "message"),
    [
        ("bundle.yaml", "format: [\n", "bundle.yaml:2: YAML: expected the node content"),
        (
            "bundle.yaml",
            "format: moptd-bundle/v9\n",
            "bundle.yaml:1: format 'moptd-bundle/v9' is not moptd-bundle/v1",
        ),
        (
            "bundle.yaml",
            "host: x\ncaptured_at: yesterday\n",
            "bundle.yaml:2: captured_at 'yesterday' is not RFC 3339",
        ),
        (
            "host/meminfo",
            "hello\n",
            "host/meminfo:1: no MemTotal line: not a copy of /proc/meminfo",
        ),
        ("host/swappiness", "sixty\n", "host/swappiness:1: not a number: 'sixty'"),
        (
            "gpu/samples.jsonl",
            '{"t": 1, "util": 5}\n{"t": 2, "util": "x"}\n',
            "gpu/samples.jsonl:2: util: a number expected",
        ),
        ("gpu/samples.jsonl", "{}\nnot json\n", "gpu/samples.jsonl:1: t: Unix seconds expected"),
        ("container/daemon.json", '{"runtimes": \n', "container/daemon.json:2: not valid JSON"),
        ("kernel/driver_version", "hello\n", "kernel/driver_version:1: no 'NVRM version' line"),
        ("kernel/proc_modules", "hello\n", "kernel/proc_modules:1: not a copy of /proc/modules"),
        ("host/swappiness", "\u00b2\n", "host/swappiness:1: not a number"),
    ],
)
def test_malformed_file_exits_3_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rel: str, text: str, message: str
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(FIXTURES / "scenarios" / "row-remap-pending-a10", bundle)
    (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
    (bundle / rel).write_text(text)
    assert main(["replay", str(bundle)]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"moptd replay: {bundle}/{message}"), err


def test_unreadable_nvidia_smi_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = tmp_path / "b"
    (bundle / "gpu" / "nvidia-smi").mkdir(parents=True)
    (bundle / "gpu" / "nvidia-smi" / "001.xml").write_text("<nvidia_smi_log><gpu>")
    assert main(["replay", str(bundle)]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"moptd replay: {bundle}/gpu/nvidia-smi/001.xml:"), err


def test_a_file_of_no_known_kind_is_named_not_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a raw file is read by its content (issue 17); one that holds no kind moptd reads is
    # named, with the reason, and the exit status says an input could not be used
    f = tmp_path / "x.txt"
    f.write_text("hi")
    assert main(["replay", str(f)]) == 3
    assert f"{f}: not used: not a kind moptd reads" in capsys.readouterr().err


# --- property-based: the readers never fail other than with BundleError ----------------

_files = st.sampled_from(
    [
        "host/meminfo",
        "host/df.txt",
        "host/swappiness",
        "gpu/samples.jsonl",
        "bundle.yaml",
        "kernel/dmesg.txt",
        "kernel/proc_modules",
        "kernel/driver_version",
        "host/dev_nodes.txt",
        "container/daemon.json",
        "container/cdi/nvidia.yaml",
        "gpu/nvidia-smi/001.txt",
    ]
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rel=_files, text=st.text(max_size=300))
def test_readers_never_crash(tmp_path: Path, rel: str, text: str) -> None:
    bundle = tmp_path / "prop"
    shutil.rmtree(bundle, ignore_errors=True)
    (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
    (bundle / rel).write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        tl = read_bundle(bundle)
    except BundleError as e:
        problem = e
    else:
        assert all(isinstance(t, float) for t, _, _ in tl.iter_observations())
        return
    assert problem.line >= 0
    assert problem.message


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {
                "t": st.floats(1e9, 2e9),
                "util": st.integers(0, 100),
                "clock_event_reasons": st.integers(0, 511),
            }
        ),
        min_size=1,
        max_size=20,
    )
)
def test_samples_jsonl_roundtrip(tmp_path: Path, rows: list[dict[str, float]]) -> None:
    import json

    bundle = tmp_path / "rows"
    (bundle / "gpu").mkdir(parents=True, exist_ok=True)
    (bundle / "gpu" / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tl = read_bundle(bundle)
    utils = [
        s.value for _, _, b in tl.iter_observations() for s in b.samples if s.signal == "gpu.util"
    ]
    assert sorted(utils) == pytest.approx(sorted(r["util"] / 100 for r in rows))
