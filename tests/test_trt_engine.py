"""TensorRT-LLM engine directories (real config.json files from public repositories) against a
host: the parser, the comparison, the serving gate and doctor's check, and the plan
deserialisation lines of the serving log (real lines from public issues)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.serving import gates
from moptd.serving.logparse import parse_line
from moptd.serving.spec import parse_managed
from moptd.serving.trt_engine import (
    EngineConfigError,
    HostGpu,
    built_for_compute,
    cluster_key_product,
    compare,
    parse_engine_config,
    read_engine_dir,
    release,
)

FIXTURES = Path(__file__).parent / "fixtures" / "trt-engine"
LLAMA = FIXTURES / "llama2-7b-fp16-rtx-a6000-0.13.0"
QWEN = FIXTURES / "qwen2-0.5b-bf16-l4-0.17.0"
LOGS = FIXTURES / "logs"

A6000 = HostGpu(0, "NVIDIA RTX A6000", "8.6")
A40 = HostGpu(0, "NVIDIA A40", "8.6")
L4 = HostGpu(0, "NVIDIA L4", "8.9")
H100 = HostGpu(0, "NVIDIA H100 80GB HBM3", "9.0")


def engine_dir(tmp_path: Path, source: Path, ranks: int = 1) -> Path:
    """A copy of a real config.json with empty rank files beside it (no plan is stored)."""
    d = tmp_path / source.name
    d.mkdir()
    shutil.copy(source / "config.json", d / "config.json")
    for r in range(ranks):
        (d / f"rank{r}.engine").write_bytes(b"")
    return d


def test_reads_a_tensorrt_llm_0_13_engine_config() -> None:
    b = read_engine_dir(LLAMA)
    assert (b.layout, b.trtllm_version, b.architecture, b.dtype) == (
        "build_config",
        "0.13.0",
        "LlamaForCausalLM",
        "float16",
    )
    assert (b.tp_size, b.pp_size, b.cp_size, b.world_size, b.gpus_per_node) == (1, 1, 1, 1, 8)
    assert (b.max_batch_size, b.max_input_len, b.max_seq_len, b.max_num_tokens) == (
        256,
        1024,
        4096,
        8192,
    )
    assert b.quant_algo is None
    assert b.kv_cache_quant_algo is None
    assert b.built_on == "NVIDIA-RTX-A6000"
    assert b.plugins["gpt_attention_plugin"] == "auto"
    assert b.plugins["paged_kv_cache"] == "enable"
    assert "gemm_plugin" not in b.plugins  # null: off
    assert b.rank_engines == ()  # the fixture stores no plan
    assert b.missing_ranks == [0]


def test_reads_a_tensorrt_llm_0_17_engine_config() -> None:
    b = read_engine_dir(QWEN)
    assert (b.trtllm_version, b.architecture, b.dtype, b.built_on) == (
        "0.17.0.post1",
        "Qwen2ForCausalLM",
        "bfloat16",
        "L4",
    )
    assert b.plugins["gemm_plugin"] == "bfloat16"
    assert (b.max_batch_size, b.max_seq_len) == (16, 32768)
    assert "built on L4" in b.summary()


def test_cluster_keys_name_the_build_gpu() -> None:
    assert cluster_key_product("A100-SXM-80GB") == "A100"
    assert cluster_key_product("H100-PCIe") == "H100"
    assert cluster_key_product("NVIDIA-RTX-A6000") == "RTX-A6000"
    assert built_for_compute(read_engine_dir(QWEN)) == "8.9"
    assert built_for_compute(read_engine_dir(LLAMA)) == "8.6"


def test_releases_compare_without_post_releases() -> None:
    assert release("0.17.0.post1") == release("0.17.0")
    assert release("v0.13.0") == release("0.13.0")
    assert release("0.9.0.dev2024030500") != release("0.9.0")
    assert release("0.13.0") != release("0.17.0")


def test_the_host_the_engine_was_built_for_passes(tmp_path: Path) -> None:
    b = read_engine_dir(engine_dir(tmp_path, LLAMA))
    assert compare(b, {"tensorrt-llm": "0.13.0", "tensorrt": "10.4.0"}, [A6000]) == []


def test_another_tensorrt_llm_release_is_incompatible(tmp_path: Path) -> None:
    b = read_engine_dir(engine_dir(tmp_path, QWEN))
    (d,) = compare(b, {"tensorrt-llm": "0.13.0", "tensorrt": "10.4.0"}, [L4])
    assert (d.what, d.engine, d.host, d.critical) == (
        "trtllm_version",
        "0.17.0.post1",
        "0.13.0",
        True,
    )
    assert "TensorRT 10.4.0" in d.reason


def test_an_engine_built_on_an_l4_does_not_load_on_an_h100(tmp_path: Path) -> None:
    b = read_engine_dir(engine_dir(tmp_path, QWEN))
    (d,) = compare(b, None, [H100])
    assert (d.what, d.engine, d.host, d.critical) == ("compute_capability", "8.9", "9.0", True)
    assert "GPU 0 is NVIDIA H100 80GB HBM3 (compute 9.0)" in d.reason


def test_another_model_of_the_same_capability_only_warns(tmp_path: Path) -> None:
    b = read_engine_dir(engine_dir(tmp_path, LLAMA))
    (d,) = compare(b, None, [A40])
    assert (d.what, d.critical) == ("gpu_model", False)


def test_too_few_gpus_and_missing_rank_files(tmp_path: Path) -> None:
    b = read_engine_dir(engine_dir(tmp_path, LLAMA, ranks=0))
    diffs = {d.what: d for d in compare(b, None, [])}
    assert "needs 1 GPUs here, 0 visible" in diffs["gpu_count"].reason
    assert diffs["rank_engines"].reason == "missing rank0.engine"


def test_the_gate_refuses_an_engine_of_another_release(tmp_path: Path) -> None:
    d = engine_dir(tmp_path, QWEN)
    (r,) = gates.check_trt_engine(d, {"tensorrt-llm": "0.13.0"}, [L4])
    assert (r.check, r.ok, r.code) == ("trt_engine", False, "TRT_ENGINE_INCOMPATIBLE")
    assert r.reason.startswith(f"{d}: engine built by TensorRT-LLM 0.17.0.post1")
    assert "this environment has 0.13.0" in r.reason


def test_the_gate_passes_a_fitting_engine_and_says_what_it_did_not_compare(
    tmp_path: Path,
) -> None:
    (r,) = gates.check_trt_engine(engine_dir(tmp_path, QWEN), None, [L4])
    assert r.ok
    assert r.code == ""
    assert "TensorRT-LLM 0.17.0.post1" in r.reason
    assert "not compared: TensorRT-LLM version" in r.reason


def test_the_gate_names_a_broken_config(tmp_path: Path) -> None:
    d = tmp_path / "engine"
    d.mkdir()
    (r,) = gates.check_trt_engine(d, None, None)
    assert not r.ok
    assert r.code == ""
    assert "config.json: missing" in r.reason
    (d / "config.json").write_text('{"version": "0.13.0",\n "pretrained_config": [}')
    (r,) = gates.check_trt_engine(d, None, None)
    assert f"{d / 'config.json'}:2: not JSON" in r.reason


def test_run_gates_refuses_the_managed_engine(tmp_path: Path) -> None:
    d = engine_dir(tmp_path, LLAMA)
    m = parse_managed(
        {
            "name": "trt",
            "engine": "trtllm",
            "command": f"trtllm-serve {d} --port 8001",
            "device": "cpu",
            "port": 1,
            "engine_dir": str(d),
        }
    )
    assert m is not None
    assert m.engine_dir == d
    failed = [r for r in gates.run_gates(m, {"tensorrt-llm": "0.17.0"}) if not r.ok]
    assert [r.code for r in failed if r.check == "trt_engine"] == ["TRT_ENGINE_INCOMPATIBLE"]


def test_the_engine_dir_comes_from_the_command_line_too() -> None:
    m = parse_managed(
        {
            "name": "t",
            "command": "python3 run.py --engine_dir /srv/engines/llama --max_output_len 8",
        }
    )
    assert m is not None
    assert m.engine_dir == Path("/srv/engines/llama")


def test_cuda_visible_devices_selects_and_orders_gpus() -> None:
    gpus = [
        ("GPU-aaaa", HostGpu(0, "NVIDIA L4", "8.9")),
        ("GPU-bbbb", HostGpu(1, "NVIDIA H100", "9.0")),
    ]
    assert gates.select_visible(gpus, None) == [g for _, g in gpus]
    assert gates.select_visible(gpus, "1,0") == [gpus[1][1], gpus[0][1]]
    assert gates.select_visible(gpus, "GPU-bb") == [gpus[1][1]]
    assert gates.select_visible(gpus, "0,7,1") == [gpus[0][1]]  # stops at a bad entry
    assert gates.select_visible(gpus, "") == []


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[]", ""),
        ('{"model": "x"}', "pretrained_config"),
        (
            '{"pretrained_config": {"mapping": {"tp_size": "2"}}}',
            "pretrained_config.mapping.tp_size",
        ),
        ('{"pretrained_config": {"mapping": {"tp_size": 0}}}', "pretrained_config.mapping.tp_size"),
        ('{"build_config": {"max_batch_size": 1.5}}', "build_config.max_batch_size"),
        ('{"builder_config": {"tensor_parallel": true}}', "builder_config.tensor_parallel"),
        ('{"version": 13, "build_config": {}}', "version"),
    ],
)
def test_bad_configs_name_the_key(text: str, key: str) -> None:
    with pytest.raises(EngineConfigError) as err:
        parse_engine_config(text, "/e/config.json")
    assert err.value.key == key
    assert str(err.value).startswith("/e/config.json")


def test_a_deeply_nested_config_is_an_error_not_a_crash() -> None:
    with pytest.raises(EngineConfigError):
        parse_engine_config("[" * 100_000 + "]" * 100_000)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
_KEYS = st.sampled_from(
    ["version", "pretrained_config", "build_config", "builder_config", "plugin_config", "mapping"]
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_parses_or_is_named(text: str) -> None:
    try:
        parse_engine_config(text)
    except EngineConfigError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, _JSON | st.dictionaries(_KEYS | st.text(max_size=6), _JSON)))
def test_any_engine_shaped_json_parses_or_is_named(doc: dict[str, object]) -> None:
    try:
        b = parse_engine_config(json.dumps(doc))
    except EngineConfigError:
        return
    assert b.world_size >= 1
    compare(b, {"tensorrt-llm": "0.13.0"}, [H100])


# --- the log lines -------------------------------------------------------------------


def _records(name: str) -> list[dict[str, object]]:
    out = []
    for line in (LOGS / name).read_text().splitlines():
        rec = parse_line(line)
        if rec is not None and rec.stream == "serving.cuda_error":
            out.append(rec.fields)
    return out


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # tensorrtllm_backend#190: a Triton 23.10 runtime (TensorRT tag 226), a 0.6.1 engine (228)
        ("tensorrtllm-backend-190.txt", [("trt_engine_version", "228", "226")]),
        (
            "tensorrtllm-backend-299.txt",
            [("trt_engine_version", "228", "226")],
        ),
        (
            "yolov5-tensorrt-7.txt",
            [("trt_engine_version", "", ""), ("trt_deserialize_failed", "", "")],
        ),
        # "failed to deserialize engine" is the application's own wording, not TensorRT's
        ("insightface-2882.txt", [("trt_engine_device", "8.6", "8.9")]),
        (
            "cosyvoice-1600.txt",
            [("trt_engine_device", "8.9", "9.0"), ("trt_deserialize_failed", "", "")],
        ),
        ("tensorrt-llm-452.txt", [("trt_plugin_missing", "Gemmtensorrt_llm", "")]),
        (
            "mmdeploy-2747.txt",
            [("trt_plugin_missing", "", ""), ("trt_deserialize_failed", "", "")],
        ),
        (
            "tensorrt-1384.txt",
            [("trt_not_a_plan", "", ""), ("trt_deserialize_failed", "", "")],
        ),
        (
            "tensorrt-2195.txt",
            [("trt_engine_version", "96", "0"), ("trt_deserialize_failed", "", "")],
        ),
    ],
)
def test_plan_deserialisation_lines(name: str, expected: list[tuple[str, str, str]]) -> None:
    got = [(str(f["kind"]), str(f["built"]), str(f["runtime"])) for f in _records(name)]
    assert got == expected


def test_tritons_ptxas_without_the_gpu_arch_is_a_missing_arch() -> None:
    assert _records("triton-8539.txt") == [
        {"kind": "ptxas_arch_unknown", "built": "", "runtime": "sm_121a"}
    ]


def test_tensorflows_ptxas_warning_falls_back_and_is_no_failure() -> None:
    assert _records("tensorflow-serving-1821.txt") == []


def test_pytorch_arch_warning_names_the_gpu_capability() -> None:
    paste = Path(__file__).parent / "fixtures" / "serving-paste" / "vllm-arch-unsupported"
    recs = [parse_line(line) for line in (paste / "log.txt").read_text().splitlines()]
    fields = [r.fields for r in recs if r is not None and r.stream == "serving.cuda_error"]
    assert fields[0] == {"kind": "arch_not_in_build", "built": "", "runtime": "sm_120"}


def test_doctor_reports_the_engine_check(tmp_path: Path) -> None:
    from moptd.cli.doctor_trt import trt_engine_checks

    d = engine_dir(tmp_path, QWEN)
    m = parse_managed(
        {"name": "t", "command": "trtllm-serve x", "device": "cpu", "engine_dir": str(d)}
    )
    (c,) = trt_engine_checks(m, {"tensorrt-llm": "0.13.0"})
    assert (c.status, c.code) == ("critical", "TRT_ENGINE_INCOMPATIBLE")
    assert c.name == f"serving trt_engine {d}"
    (c,) = trt_engine_checks(m, {"tensorrt-llm": "0.17.0.post1"})
    assert c.status == "ok"
    assert trt_engine_checks(parse_managed({"name": "t", "command": "vllm serve m"})) == []


_FRAGMENTS = st.sampled_from(
    [
        "expecting library version ",
        "expecting compute ",
        " got compute ",
        " got ",
        "Current Version: ",
        ", Serialized Engine Version: ",
        "Version tag does not match",
        "engine plan file is generated on an incompatible device",
        "could not find plugin: ",
        " version",
        "Value 'sm_",
        "' is not defined for option 'gpu-name'",
        "fallback to the NVIDIA driver",
        "Failed to deserialize cuda engine",
        "Magic tag does not match",
        "8.9",
        "226",
        "1" * 300,
        " ",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_FRAGMENTS | st.text(max_size=6), max_size=12))
def test_any_mix_of_plan_fragments_parses(parts: list[str]) -> None:
    rec = parse_line("".join(parts))
    if rec is not None and rec.stream == "serving.cuda_error":
        assert all(isinstance(rec.fields[k], str) for k in ("kind", "built", "runtime"))
        assert all(len(str(rec.fields[k])) <= 128 for k in ("built", "runtime"))


def test_a_long_line_of_fragments_is_bounded() -> None:
    import time

    line = ("expecting compute 8.9 got compute " * 2000) + ("Value 'sm_" * 2000)
    start = time.perf_counter()
    for _ in range(10):
        parse_line(line)
    assert time.perf_counter() - start < 1.0


async def test_the_supervisor_refuses_to_start_an_engine_of_another_release(
    tmp_path: Path,
) -> None:
    import asyncio
    import functools

    from moptd.observations import Event
    from moptd.serving.supervisor import Supervisor

    d = engine_dir(tmp_path, QWEN)
    marker = tmp_path / "ran"
    m = parse_managed(
        {
            "name": "trt",
            "engine": "trtllm",
            "command": ["sh", "-c", f"touch {marker}"],
            "device": "cpu",
            "port": 1,
            "engine_dir": str(d),
            "backoff_initial": 0.05,
        }
    )
    assert m is not None
    events: list[Event] = []
    # as the daemon wires it: the serving environment's versions read beforehand
    run = functools.partial(gates.run_gates, versions={"tensorrt-llm": "0.13.0"})
    sup = Supervisor(m, events.extend, tmp_path / "state", gates=run)
    await sup.start()
    try:
        for _ in range(200):
            if any(e.stream == "serving.gate" for e in events):
                break
            await asyncio.sleep(0.02)
        gate = next(
            e for e in events if e.stream == "serving.gate" and e.fields["check"] == "trt_engine"
        )
        assert gate.fields["code"] == "TRT_ENGINE_INCOMPATIBLE"
        assert "engine built by TensorRT-LLM 0.17.0.post1" in str(gate.fields["reason"])
        assert sup.state == "gated"
        assert not marker.exists()
    finally:
        await sup.stop()
        sup.close()


def test_trtllm_serve_of_an_engine_directory_is_checked(tmp_path: Path) -> None:
    d = engine_dir(tmp_path, LLAMA)
    m = parse_managed({"name": "t", "command": f"trtllm-serve {d} --port 8000", "device": "cpu"})
    assert m is not None
    assert gates.engine_dir_of(m) == d
    hf = tmp_path / "hf-model"  # trtllm-serve also serves a checkpoint: no engine there
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    m = parse_managed({"name": "t", "command": f"trtllm-serve {hf}", "device": "cpu"})
    assert m is not None
    assert gates.engine_dir_of(m) is None
