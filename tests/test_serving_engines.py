"""The engine registry: one entry per engine, and what spec.py, the collector and the log
parser take from it."""

from __future__ import annotations

import importlib
import json
from dataclasses import replace

import pytest

from moptd.serving import logparse
from moptd.serving.engines import (
    ENGINES,
    REGISTRY,
    add_running_totals,
    log_parsers,
    read_page,
    view_from_trtllm_stats,
)
from moptd.serving.engines.prometheus import PageMapping
from moptd.serving.promtext import PromParseError
from moptd.serving.spec import Managed, SpecError, parse_endpoints, parse_managed
from tests.conftest import FIXTURES

STATS = [
    {"iter": 10, "numActiveRequests": 1, "numQueuedRequests": 0},
    {"iter": 11, "numActiveRequests": 4, "numQueuedRequests": 2},
]


def test_the_registry_names_each_engine_once() -> None:
    assert ENGINES == ("vllm", "sglang", "trtllm")
    for name, engine in REGISTRY.items():
        assert engine.name == name
        # docs/serving.md links each engine to the module named after it
        assert importlib.import_module(f"moptd.serving.engines.{name}").ENGINE is engine
        assert engine.metrics_path.startswith("/")
        assert engine.prefixes


def test_two_engines_claiming_one_series_are_refused() -> None:
    vllm = REGISTRY["vllm"]
    taken = {"vllm:num_requests_running": ("running", "", "sum")}
    clone = replace(REGISTRY["sglang"], name="copy", scalars=taken)
    with pytest.raises(ValueError, match="vllm:num_requests_running is vllm's already"):
        PageMapping((vllm, clone))


def test_metrics_path_defaults_come_from_the_registry() -> None:
    for name, engine in REGISTRY.items():
        (ep,) = parse_endpoints([{"name": "a", "url": "http://h:1", "engine": name}])
        assert ep.metrics_path == engine.metrics_path
        managed = parse_managed({"name": "m", "command": ["serve"], "engine": name})
        assert isinstance(managed, Managed)
        assert managed.endpoint().metrics_path == engine.metrics_path


def test_an_unknown_engine_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(SpecError, match="must be vllm, sglang or trtllm, not 'tgi'"):
        parse_endpoints([{"name": "a", "url": "http://h:1", "engine": "tgi"}])


def test_a_page_is_read_by_the_engine_reader_for_its_path() -> None:
    body = json.dumps(STATS).encode()
    view = read_page("trtllm", "/metrics", body)
    assert view.scalars["running"] == 4
    assert view.scalars["steps_since_last"] == 2
    prom = (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_load.txt").read_bytes()
    for engine in ENGINES:
        assert read_page(engine, REGISTRY[engine].metrics_path, prom).engine_series > 0
    with pytest.raises(PromParseError):  # a JSON page is no Prometheus text elsewhere
        read_page("vllm", "/metrics", body)


def test_per_read_counts_add_up_across_reads() -> None:
    totals: dict[str, float] = {}
    seen = []
    for _ in range(3):
        view = view_from_trtllm_stats(json.dumps(STATS))
        add_running_totals("trtllm", view, totals)
        assert "steps_since_last" not in view.scalars
        seen.append(view.scalars["steps"])
    assert seen == [2.0, 4.0, 6.0]
    view = view_from_trtllm_stats(json.dumps(STATS))
    add_running_totals("vllm", view, totals)  # vLLM counts no per-read field: left alone
    assert view.scalars["steps_since_last"] == 2
    assert "steps" not in view.scalars


def test_engine_log_parsers_run_first() -> None:
    own = log_parsers()
    assert own
    assert logparse._PARSERS[: len(own)] == own
    log = (FIXTURES / "vllm-cpu" / "vllm_cpu_server_log.txt").read_text()
    line = next(line for line in log.splitlines() if "Avg prompt throughput" in line)
    rec = logparse.parse_line(line)  # vLLM's stats line, parsed by vllm.py
    assert rec is not None
    assert rec.stream == "serving.log_stats"
    assert (rec.fields["running"], rec.fields["waiting"]) == (8.0, 12.0)
    assert rec.fields["kv_usage"] == pytest.approx(0.615)
