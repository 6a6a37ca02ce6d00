"""Every serving-layer parser takes any input and either answers or raises its own error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moptd.serving.bundle import ServingBundleError, read_serving_dir
from moptd.serving.engines import view_from_samples, view_from_trtllm_stats
from moptd.serving.gates import classify_names
from moptd.serving.proctree import parse_stat
from moptd.serving.promtext import PromSample
from moptd.serving.spec import SpecError, flag_value, model_of, parse_endpoints, parse_managed
from moptd.serving.systemd import parse_show

_names = st.sampled_from(
    [
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_count",
        "vllm_e2e_request_latency_seconds_sum",
        "vllm:cache_config_info",
        "sglang:num_queue_reqs",
        "trtllm_kv_cache_utilization",
        "process_cpu_seconds_total",
        "other_metric",
    ]
)
_labels = st.lists(
    st.tuples(
        st.sampled_from(["le", "engine", "finished_reason", "reason", "x"]), st.text(max_size=8)
    ),
    max_size=3,
    unique_by=lambda kv: kv[0],
).map(lambda kvs: tuple(sorted(kvs)))


@given(st.lists(st.builds(PromSample, _names, _labels, st.floats()), max_size=40))
def test_engine_mapping_takes_any_samples(samples: list[PromSample]) -> None:
    try:
        view = view_from_samples(samples)
    except ValueError:
        return  # an le label that is not a number
    for h in view.histograms.values():
        h.quantile(0.5)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(_json)
def test_trtllm_stats_take_any_json(payload: object) -> None:
    try:
        view_from_trtllm_stats(json.dumps(payload))
    except ValueError:
        pass


@given(st.text(max_size=300))
def test_stat_parser(text: str) -> None:
    r = parse_stat(text)
    assert r is None or isinstance(r[3], float)


@given(st.text(max_size=300))
def test_systemctl_show_parser(text: str) -> None:
    for k, v in parse_show(text).items():
        assert "\n" not in k
        assert "\n" not in v


@given(st.lists(st.text(max_size=20), max_size=10))
def test_model_file_names(names: list[str]) -> None:
    f = classify_names(names)
    assert f.safe_weights + f.pickle_weights + f.other_weights <= len(names)


@given(st.lists(st.text(max_size=12), max_size=8), st.text(max_size=12))
def test_command_line_helpers(args: list[str], flag: str) -> None:
    flag_value(tuple(args), flag)
    model_of(tuple(args))


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "name",
                "command",
                "port",
                "env",
                "restart",
                "stop_grace",
                "log_lines",
                "probes",
                "model_dir",
                "user",
            ]
        ),
        _json,
    )
)
def test_managed_spec_takes_any_mapping(raw: dict[str, object]) -> None:
    try:
        parse_managed(raw)
    except SpecError as exc:
        where = exc.key
    else:
        return
    assert where.startswith("collectors.serving.managed")


@given(_json)
def test_endpoint_spec_takes_anything(raw: object) -> None:
    try:
        parse_endpoints(raw)
    except SpecError as exc:
        where = exc.key
    else:
        return
    assert where.startswith("collectors.serving.endpoints")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=200), st.text(max_size=200), st.text(max_size=200))
def test_bundle_files_take_any_text(
    tmp_path: Path, health: str, cmdline: str, listing: str
) -> None:
    d = tmp_path / "serving" / "x"
    d.mkdir(parents=True, exist_ok=True)
    (d / "health.jsonl").write_text(health)
    (d / "cmdline.txt").write_text(cmdline)
    (d / "model_files.txt").write_text(listing)
    (d / "log.txt").write_text(health + cmdline)
    try:
        read_serving_dir(d)
    except ServingBundleError as exc:
        where = exc.file
    else:
        return
    assert where.startswith(str(d))


def test_unclosed_quote_in_a_command_is_a_spec_error() -> None:
    # found by test_managed_spec_takes_any_mapping: shlex's ValueError escaped the parser
    with pytest.raises(SpecError, match="command"):
        parse_managed({"name": "main", "command": "vllm serve 'model"})
