"""Replay of a bundle's serving/<name>/ directory, built from the real vLLM CPU captures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from moptd.diagnose.engine import evaluate
from moptd.diagnose.loader import load_rules
from moptd.serving.bundle import FILES, ServingBundleError, read_serving_dir
from moptd.store import SignalStore
from tests.conftest import FIXTURES, REPO

VLLM = FIXTURES / "vllm-cpu"
T0 = 1795969828.0  # the captures' process start (vllm:*_created)
LS = """total 3436
-rw-r--r-- 1 root root     690 Nov 29 16:20 config.json
-rw-r--r-- 1 root root     132 Nov 29 16:20 generation_config.json
-rw-r--r-- 1 root root 3411464 Nov 29 16:20 model.safetensors
-rw-r--r-- 1 root root   61930 Nov 29 16:20 tokenizer.json
-rw-r--r-- 1 root root     344 Nov 29 16:20 tokenizer_config.json
"""


def make(tmp_path: Path) -> Path:
    d = tmp_path / "serving" / "tiny"
    (d / "metrics").mkdir(parents=True)
    for i, name in enumerate(("idle", "load", "after_load")):
        shutil.copy(
            VLLM / f"vllm_cpu_metrics_{name}.txt", d / "metrics" / f"{T0 + 60 + 15 * i}.prom"
        )
    shutil.copy(VLLM / "vllm_cpu_server_log.txt", d / "log.txt")
    command = next(
        line for line in (d / "log.txt").read_text().splitlines() if line.startswith("# Command:")
    )
    (d / "cmdline.txt").write_text("\n".join(command.split(":", 1)[1].split()) + "\n")
    (d / "model_files.txt").write_text(LS)
    (d / "health.jsonl").write_text(
        json.dumps({"t": T0 + 61, "endpoint": "/health", "status": 200, "latency_s": 0.004})
        + "\n"
        + json.dumps({"t": T0 + 76, "endpoint": "/health", "status": 503, "latency_s": 0.01})
        + "\n"
    )
    return d


def test_replay_feeds_the_live_signals(tmp_path: Path) -> None:
    r = read_serving_dir(make(tmp_path))
    assert r.missing == []
    values = {}
    for t, b in r.observations:
        for s in b.samples:
            assert s.subject == "serving:tiny"
            values.setdefault((s.signal, s.labels), []).append((t, s.value))
    assert [v for _, v in values[("serving.requests_running", ())]] == [0.0, 8.0, 0.0]
    assert values[("serving.requests_waiting_by_reason", (("reason", "capacity"),))][1][1] == 12
    assert values[("serving.max_num_seqs", ())][0][1] == 8.0
    assert values[("serving.cuda_graphs_enabled", ())][0][1] == 0.0
    assert values[("serving.kv_cache_capacity_tokens", ())][0][1] == 5120.0
    assert values[("serving.model_tokenizer_present", ())][0][1] == 1.0
    assert values[("serving.model_unsafe_weights", ())][0][1] == 0.0
    assert [v for _, v in values[("serving.healthy", ())]] == [1.0, 0.0]
    streams = {e.stream for e in r.events}
    assert {"serving.log_stats", "serving.kv_capacity", "serving.cuda_graphs"} <= streams
    stats = [e for e in r.events if e.stream == "serving.log_stats"]
    assert stats[0].t == pytest.approx(1795969839.0)  # 11-29 16:30:39 as UTC, year from the scrapes


def test_replay_through_the_rules(tmp_path: Path) -> None:
    r = read_serving_dir(make(tmp_path))
    store = SignalStore()
    for t, b in r.observations:
        store.ingest("serving", b, t)
    assert not [e for e in r.events if e.stream == "serving.engine_dead"]  # a requested stop
    store.add_events(r.events)
    rules = load_rules([REPO / "rules"]).ruleset
    now = max(t for t, _ in r.observations)
    codes = {
        res.verdict.code
        for res in evaluate(rules, store, now)
        if res.status == "match" and res.verdict is not None
    }
    assert "CUDA_GRAPHS_DISABLED" in codes
    assert not {"KV_CACHE_PRESSURE", "TOKENIZER_MISSING", "SCHEDULER_STALL"} & codes


def test_missing_files_are_listed(tmp_path: Path) -> None:
    d = tmp_path / "serving" / "x"
    d.mkdir(parents=True)
    r = read_serving_dir(d)
    assert sorted(r.missing) == sorted(FILES)
    assert r.observations == []


@pytest.mark.parametrize(
    ("file", "text", "where"),
    [
        ("health.jsonl", '{"t": 1, "endpoint": "/health"}\nnot json\n', "health.jsonl:2"),
        ("metrics/1795969900.prom", "vllm:x 1\n<html>\n", "1795969900.prom:2"),
        ("metrics/yesterday.prom", "vllm:x 1\n", "yesterday.prom:0"),
        ("cmdline.txt", "vllm\nserve\n--max-num-seqs\nmany\n", "cmdline.txt:4"),
    ],
)
def test_malformed_files_name_file_and_line(
    tmp_path: Path, file: str, text: str, where: str
) -> None:
    d = tmp_path / "serving" / "x"
    (d / "metrics").mkdir(parents=True)
    (d / file).write_text(text)
    with pytest.raises(ServingBundleError) as err:
        read_serving_dir(d)
    assert where in str(err.value)


@pytest.mark.parametrize(
    ("captured", "year"),
    [
        ("2024-12-05T00:00:00Z", 2024),  # the lines' own year: the capture's
        ("2025-01-03T00:00:00Z", 2024),  # 11-29 after a January capture: the year before
        ("2024-11-29T18:50:00Z", 2024),  # minutes before the capture
    ],
)
def test_log_lines_without_a_year_take_the_capture_year(
    tmp_path: Path, captured: str, year: int
) -> None:
    """vLLM stamps its lines MM-DD, no year. With no metrics scrape to date them, the year
    is the bundle's capture year, not the year the replay runs in (a golden made this year
    would change meaning next year)."""
    from datetime import UTC, datetime

    from moptd.bundle.reader import read_bundle

    d = tmp_path / "serving" / "main"
    d.mkdir(parents=True)
    shutil.copy(VLLM / "vllm_cpu_engine_core_killed.txt", d / "log.txt")
    (tmp_path / "bundle.yaml").write_text(f"captured_at: {captured}\n")
    tl = read_bundle(tmp_path)
    dead = [e for e in tl.events if e.stream == "serving.engine_dead"]
    assert dead
    assert {datetime.fromtimestamp(e.t, UTC).year for e in dead} == {year}
    assert datetime.fromtimestamp(dead[0].t, UTC).strftime("%m-%d %H:%M:%S") == "11-29 18:44:15"
