"""API answers are strict JSON (RFC 8259) whatever the values (issue 18, item 11).

Python's json writes NaN and ±Infinity bare, which strict parsers (jq, Go, JavaScript's
JSON.parse) refuse. /v1/snapshot gives them as the strings "NaN", "+Inf" and "-Inf"
(Prometheus's spellings), /v1/status as null.
"""

from __future__ import annotations

import json
import math
from typing import Any

from moptd.clock import VirtualClock
from moptd.daemon.handlers import dumps
from moptd.daemon.views import snapshot_view, status_view
from moptd.observations import Batch, Sample
from moptd.store import SignalStore


def strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"not JSON: bare {constant}")

    return json.loads(text, parse_constant=refuse)


def store_with_non_finite_values() -> SignalStore:
    store = SignalStore(VirtualClock(0))
    store.ingest("serving", Batch([
        Sample("serving.kv_cache_usage", "serving:a", math.inf),
        Sample("serving.requests_running", "serving:a", -math.inf),
        Sample("serving.ttft", "serving:a", math.nan, (("quantile", "0.99"),)),
        Sample("serving.requests_waiting", "serving:a", 3.0),
    ]))
    store.ingest("nvml", Batch([
        Sample("gpu.util", "gpu:0", math.nan),
        Sample("gpu.power", "gpu:0", math.inf),
    ]))
    return store


def test_the_snapshot_spells_non_finite_values_as_strings():
    body = strict(dumps(snapshot_view(store_with_non_finite_values())))
    signals = body["subjects"]["serving:a"]["signals"]
    assert signals["serving.kv_cache_usage"] == "+Inf"
    assert signals["serving.requests_running"] == "-Inf"
    assert signals["serving.ttft"] == [{"labels": {"quantile": "0.99"}, "value": "NaN"}]
    assert signals["serving.requests_waiting"] == 3
    assert body["subjects"]["gpu:0"]["signals"] == {"gpu.util": "NaN", "gpu.power": "+Inf"}


def test_the_status_view_gives_null_for_non_finite_readings():
    body = strict(dumps(status_view(store_with_non_finite_values(), [])))
    (gpu,) = body["gpus"]
    assert gpu["util"] is None
    assert gpu["power"] is None


def test_any_answer_with_a_non_finite_number_left_in_it_is_strict_json():
    # an evidence value, say, that no view turned into a string
    body = {"evidence": {"ratio": math.nan, "values": [1.5, math.inf, (-math.inf,)]}}
    assert strict(dumps(body)) == {
        "evidence": {"ratio": "NaN", "values": [1.5, "+Inf", ["-Inf"]]}
    }
