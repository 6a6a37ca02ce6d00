"""Non-finite engine values are absent, not values (issue 30, item 8).

An engine whose page says `vllm:kv_cache_usage_perc +Inf` had moptd export
`moptd_serving_kv_cache_usage_ratio +Inf` and fire KV_CACHE_PRESSURE ("KV cache inf full").
A value of +Inf, -Inf or NaN measures nothing: the daemon leaves the signal out, /metrics
shows no sample for it and no rule fires on it. The page is the captured vLLM CPU page
(tests/fixtures/vllm-cpu) with the adversarial lines of tests/faults/test_hostile_endpoint.py.
"""

from __future__ import annotations

import time

import pytest

from tests.api_helpers import wait_for
from tests.faults.conftest import api_get, assert_serving
from tests.faults.test_hostile_endpoint import (  # noqa: F401 - engine_factory is a fixture
    engine_factory,
    non_finite_page,
    serving_daemon,
)

pytestmark = pytest.mark.slow


def test_an_infinite_kv_cache_usage_is_absent_and_fires_nothing(tmp_path, engine_factory):  # noqa: F811
    engine = engine_factory(non_finite_page)
    d = serving_daemon(tmp_path, engine)
    try:
        wait_for(lambda: "moptd_serving_requests_waiting" in assert_serving(d), timeout=30)
        time.sleep(2)  # several scrapes and rule ticks
        text = assert_serving(d)
        samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        assert not [ln for ln in samples if ln.endswith(("Inf", "NaN"))
                    and "serving" in ln], samples
        assert not [ln for ln in samples if "kv_cache_usage" in ln], samples
        codes = {f["code"] for f in api_get(d, "/v1/findings")["active"]}
        assert "KV_CACHE_PRESSURE" not in codes, codes
    finally:
        d.stop()
