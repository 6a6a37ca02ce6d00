"""Prometheus's scrape limits in moptd's page parser (issue 18, item 4).

sample_limit, label_limit, label_name_length_limit and label_value_length_limit, named and
meant as in Prometheus's scrape_config: a page past one is refused whole. The pages are the
vLLM CPU captures in tests/fixtures/vllm-cpu, unchanged, with lines added by the tests.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.serving import promtext
from moptd.serving.promtext import (
    NO_LIMITS,
    PromLimitError,
    PromParseError,
    ScrapeLimits,
    parse,
)
from tests.conftest import FIXTURES

PAGES = sorted((FIXTURES / "vllm-cpu").glob("vllm_cpu_metrics_*.txt"))
IDLE = (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_idle.txt").read_text()


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_real_pages_are_well_within_the_default_limits(path):
    text = path.read_text()
    assert parse(text, ScrapeLimits()) == parse(text)


def test_sample_limit_counts_samples_not_lines():
    n = len(parse(IDLE))
    assert len(parse(IDLE, ScrapeLimits(sample_limit=n))) == n
    with pytest.raises(PromLimitError) as exc:
        parse(IDLE, ScrapeLimits(sample_limit=n - 1))
    assert exc.value.limit == "sample_limit"
    assert str(exc.value).endswith(f"more than {n - 1} samples (sample_limit)")


def test_label_limit():
    # cache_config_info carries 37 labels on this page
    widest = max(len(s.labels) for s in parse(IDLE))
    parse(IDLE, ScrapeLimits(label_limit=widest))
    with pytest.raises(PromLimitError) as exc:
        parse(IDLE, ScrapeLimits(label_limit=widest - 1))
    assert exc.value.limit == "label_limit"
    line = next(i for i, ln in enumerate(IDLE.split("\n"), 1) if ln.startswith("vllm:cache_config"))
    assert exc.value.line == line


@pytest.mark.parametrize(
    ("extra", "limit"),
    [
        ('vllm:num_requests_running{model_name="' + "m" * 4097 + '"} 0\n',
         "label_value_length_limit"),
        ("vllm:num_requests_running{" + "n" * 257 + '="x"} 0\n', "label_name_length_limit"),
        ("vllm:num_requests_running{" + ",".join(f'l{i}="v"' for i in range(129)) + "} 0\n",
         "label_limit"),
    ],
)
def test_a_line_past_a_default_label_limit_refuses_the_page(extra, limit):
    page = IDLE + extra
    with pytest.raises(PromLimitError) as exc:
        parse(page, ScrapeLimits())
    assert exc.value.limit == limit
    assert exc.value.line == len(IDLE.split("\n"))
    parse(page, NO_LIMITS)  # a saved page (a bundle) still reads


def test_the_parser_caches_stay_bounded_under_rotating_long_labels():
    for i in range(3 * promtext._CACHE_MAX // 100):
        page = "".join(
            f'vllm:request_success_total{{finished_reason="{i}-{j}",x="{"y" * 3000}"}} 1\n'
            for j in range(100)
        )
        parse(page)
    assert len(promtext._LABEL_CACHE) <= promtext._CACHE_MAX
    assert all(len(body) <= promtext._CACHED_BODY_MAX for body in promtext._LABEL_CACHE)
    assert len(promtext._NAMES) <= promtext._CACHE_MAX


limits = st.builds(
    ScrapeLimits,
    st.integers(0, 50),
    st.integers(0, 6),
    st.integers(0, 12),
    st.integers(0, 12),
)
label = st.tuples(st.from_regex(r"[a-z_]{1,16}", fullmatch=True), st.text("ab\\\"\n", max_size=16))
line = st.builds(
    lambda name, labels, value: name
    + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")
    + f" {value}",
    st.from_regex(r"[a-z:]{1,20}", fullmatch=True),
    st.lists(label, max_size=8),
    st.sampled_from(["1", "0.5", "NaN", "+Inf", "x"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(line | st.text(max_size=40), max_size=80), limits)
def test_any_page_gives_samples_within_the_limits_or_a_parse_error(lines, lim):
    try:
        samples = parse("\n".join(lines), lim)
    except PromParseError:
        return
    assert not lim.sample_limit or len(samples) <= lim.sample_limit
    for s in samples:
        assert not lim.label_limit or len(s.labels) <= lim.label_limit
        for k, v in s.labels:
            assert not lim.label_name_length_limit or len(k) <= lim.label_name_length_limit
            assert not lim.label_value_length_limit or len(v) <= lim.label_value_length_limit


def test_a_histogram_with_more_buckets_than_the_limit_refuses_the_page():
    from moptd.serving.engines import view_from_samples
    from moptd.serving.engines.prometheus import MAX_BUCKETS

    ttft = "vllm:time_to_first_token_seconds_bucket"
    widest = max(
        sum(1 for s in parse(IDLE) if s.name == name)
        for name in {s.name for s in parse(IDLE) if s.name.endswith("_bucket")}
    )
    assert widest < MAX_BUCKETS  # 23 on vLLM's page
    view_from_samples(parse(IDLE))
    # le values that rotate (or are NaN, each one a key of its own) within sample_limit
    extra = "".join(
        f'{ttft}{{engine="0",le="{1000 + i}.5",model_name="tinyllama"}} 0.0\n'
        for i in range(MAX_BUCKETS)
    )
    with pytest.raises(PromLimitError) as exc:
        view_from_samples(parse(IDLE + extra, ScrapeLimits()))
    assert str(exc.value) == (
        f"vllm:time_to_first_token_seconds has more than {MAX_BUCKETS} buckets (bucket_limit)"
    )
    nan = "".join(
        f'{ttft}{{engine="{i}",le="NaN",model_name="tinyllama"}} 0.0\n' for i in range(MAX_BUCKETS)
    )
    with pytest.raises(PromLimitError):
        view_from_samples(parse(IDLE + nan, ScrapeLimits()))
