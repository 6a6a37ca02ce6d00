"""A real Prometheus scraping a real `moptd run` on loopback, with moptd's alert rules loaded.

Checks through Prometheus' HTTP API that every alert rule evaluates, that the exporter-level
alerts react, and that every dashboard panel's query returns data, unless the panel is
documented as needing something this host lacks (tools/gen_dashboards.py NEEDS): on the CPU
host GPU panels are exceptions; a second moptd replays a recorded H200 through its recorded
NVML backend so the GPU panels are checked too.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon_proc import free_port
from tests.prometheus_proc import PrometheusProcess

from .conftest import REPO, require_tool

pytestmark = pytest.mark.slow

RULES = REPO / "grafana" / "alerts" / "moptd.rules.yaml"
DCGM_RULES = REPO / "grafana" / "recording" / "moptd-dcgm.rules.yaml"
DCGM_DASHBOARD = REPO / "tests" / "fixtures" / "dcgm-exporter" / "dcgm-exporter-dashboard.json"
RATE_INTERVAL = "5s"  # Grafana's $__rate_interval for a 1 s scrape interval, rounded up


def load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_dashboards", REPO / "tools/gen_dashboards.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_dashboards", module)
    spec.loader.exec_module(module)
    return module


gen = load_generator()


def wait_for(what: str, probe, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


@dataclass
class Stack:
    moptd_target: str
    dead_target: str
    prometheus: PrometheusProcess
    tmp: Path

    def query(self, expr: str) -> dict[str, Any]:
        return self.prometheus.query(expr)

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.prometheus.api("alerts")["data"]["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        groups = self.prometheus.api("rules")["data"]["groups"]
        return [r for g in groups for r in g["rules"]]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# the GPM recording (format 2): also the profiling fields, so the tensor and DRAM panels answer
RECORDING = REPO / "tests" / "fixtures" / "h200" / "nvml_recording_h200_gpm.jsonl"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    yield from run_stack(tmp_path_factory.mktemp("e2e"), "")


@pytest.fixture(scope="module")
def gpu_stack(tmp_path_factory) -> Iterator[Stack]:
    """moptd reading a real H200 recording through its recorded NVML backend (2 GPUs)."""
    if not RECORDING.is_file():
        pytest.skip(f"{RECORDING} is not there")
    extra = (
        "collectors:\n  nvml:\n    backend: recorded\n"
        f"    recording: {RECORDING}\n    replicate: 2\n"
    )
    yield from run_stack(tmp_path_factory.mktemp("e2e-gpu"), extra)


def run_stack(tmp: Path, extra_config: str) -> Iterator[Stack]:
    prometheus = require_tool("prometheus")
    port, dead = free_port(), free_port()
    config = tmp / "moptd.yaml"
    config.write_text(
        f"state_dir: {tmp / 'state'}\n"
        f"api:\n  socket: {tmp / 'run' / 'api.sock'}\n"
        f"exporter:\n  listen: 127.0.0.1:{port}\n" + extra_config,
        encoding="utf-8",
    )
    moptd_log = (tmp / "moptd.log").open("wb")
    moptd = subprocess.Popen(
        [sys.executable, "-m", "moptd", "run", "--config", str(config)],
        cwd=REPO,
        stdout=moptd_log,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")},
    )
    prom = PrometheusProcess(
        prometheus,
        tmp,
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES), str(DCGM_RULES)],
            "scrape_configs": [
                {
                    "job_name": "moptd",
                    "static_configs": [{"targets": [f"127.0.0.1:{port}", f"127.0.0.1:{dead}"]}],
                }
            ],
        },
    )
    s = Stack(f"127.0.0.1:{port}", f"127.0.0.1:{dead}", prom, tmp)
    try:
        wait_for("Prometheus to be ready", prom.ready, 60)

        def scraped() -> bool:
            result = s.query(f'up{{job="moptd", instance="{s.moptd_target}"}} == 1')
            return bool(result.get("data", {}).get("result"))

        wait_for("a successful scrape of moptd", scraped, 60)
        # Enough samples for rate() over RATE_INTERVAL and a few rule evaluations.
        time.sleep(8)
        yield s
    finally:
        prom.stop()
        stop(moptd)
        moptd_log.close()


def substitute(expr: str, stack: Stack) -> str:
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$job", "moptd")
        .replace("$instance", stack.moptd_target.replace(".", "\\\\."))
        .replace("$gpu", ".*")
        .replace("$serving", ".*")
        .replace("$severity", ".*")
    )


def check_panels(stack: Stack, must_answer: set[str | None]) -> list[tuple[str, str, str]]:
    """Run every panel query; those whose need is in must_answer must return data."""
    errors, empty, documented = [], [], []
    for uid, panel, query in gen.panel_queries():
        result = stack.query(substitute(query.expr, stack))
        if result.get("status") != "success":
            errors.append(f"{uid}: {panel.title!r}: {result.get('error')}")
            continue
        if result["data"]["result"]:
            continue
        if panel.needs in must_answer:
            empty.append(f"{uid}: {panel.title!r} (needs {panel.needs}): {query.expr}")
        else:
            documented.append((uid, panel.title, str(panel.needs)))
    assert not errors, "queries Prometheus rejected:\n" + "\n".join(errors)
    assert not empty, "panels returned no data:\n" + "\n".join(empty)
    return documented


def test_every_dashboard_query_returns_data_or_is_documented(stack):
    documented = check_panels(stack, {None})
    # On this CPU host the GPU, serving and incident panels are the documented exceptions.
    assert {need for _, _, need in documented} <= set(gen.NEEDS)


def test_gpu_panels_return_data_from_a_recorded_h200(gpu_stack):
    documented = check_panels(gpu_stack, {None, "gpu"})
    assert {need for _, _, need in documented} <= set(gen.NEEDS) - {"gpu"}


def test_every_findings_annotation_query_is_accepted(stack):
    """The dashboards' findings annotations: Prometheus accepts each query (it returns data
    only while a finding fires)."""
    queries = gen.annotation_queries()
    assert len(queries) == len(gen.DASHBOARDS)
    for uid, expr in queries:
        result = stack.query(substitute(expr, stack))
        assert result.get("status") == "success", (uid, expr, result)


def test_every_alert_rule_evaluates(stack):
    def all_evaluated() -> bool:
        return all(r.get("lastEvaluation", "").startswith("20") for r in stack.rules())

    wait_for("every rule to be evaluated", all_evaluated, 30)
    rules = stack.rules()
    names = {r["name"] for r in rules}
    expected = {
        r.get("alert") or r["record"]
        for f in (RULES, DCGM_RULES)
        for g in yaml.safe_load(f.read_text())["groups"]
        for r in g["rules"]
    }
    assert names == expected
    bad = [
        f"{r['name']}: {r['health']} {r.get('lastError', '')}" for r in rules if r["health"] != "ok"
    ]
    assert not bad, bad


def test_exporter_alerts_react(stack):
    # The dead target makes MoptdDown pending (its for: is 2 m); the live one never does.
    def down_alerts() -> list[dict[str, Any]]:
        return [a for a in stack.alerts() if a["labels"]["alertname"] == "MoptdDown"]

    alerts = wait_for("MoptdDown for the dead target", down_alerts, 30)
    instances = {a["labels"]["instance"] for a in alerts}
    assert instances == {stack.dead_target}
    assert all(a["state"] in ("pending", "firing") for a in alerts)
    # moptd's own collectors are healthy here: no collector alert at all.
    collector = [a for a in stack.alerts() if a["labels"]["alertname"].startswith("MoptdCollector")]
    assert collector == []
    # What the collector alerts read is there.
    result = stack.query(f'moptd_collector_success{{instance="{stack.moptd_target}"}}')
    assert result["data"]["result"]


def kmsg_writable() -> bool:
    return os.access("/dev/kmsg", os.W_OK)


def write_xid_79() -> None:
    if not kmsg_writable():
        pytest.skip("/dev/kmsg is not writable here (needs root)")
    marker = f"moptd-test-{uuid.uuid4()}"
    with open("/dev/kmsg", "w", encoding="utf-8") as kmsg:
        kmsg.write(f"NVRM: Xid (PCI:0000:fe:00): 79, pid=0, GPU has fallen off the bus. {marker}\n")


@pytest.mark.root
def test_xid_79_in_the_kernel_log_fires_the_raw_xid_alert(stack):
    # Pages through moptd_xid_errors_total alone, without the rule engine.
    pytest.importorskip("moptd.collectors.kernel_log", reason="no kernel-log collector yet")
    write_xid_79()

    def firing() -> list[dict[str, Any]]:
        return [
            a
            for a in stack.alerts()
            if a["labels"]["alertname"] == "MoptdXidGPULost"
            and "fe:00" in a["labels"].get("gpu", "")
            and a["state"] == "firing"
        ]

    alerts = wait_for("MoptdXidGPULost for PCI 0000:fe:00", firing, 45)
    assert alerts[0]["labels"]["instance"] == stack.moptd_target
    assert alerts[0]["labels"]["code"] == "GPU_LOST"


@pytest.mark.root
def test_xid_79_in_the_kernel_log_fires_the_critical_finding_alert(stack):
    write_xid_79()

    def firing() -> list[dict[str, Any]]:
        return [
            a
            for a in stack.alerts()
            if a["labels"]["alertname"] == "MoptdFindingCritical"
            and a["labels"].get("code") == "GPU_LOST"
            and a["state"] == "firing"
        ]

    alerts = wait_for("MoptdFindingCritical with code GPU_LOST", firing, 45)
    assert alerts[0]["labels"]["instance"] == stack.moptd_target
    assert alerts[0]["annotations"]["runbook_url"].endswith("/docs/runbooks/GPU_LOST.md")


# --- dcgm-exporter compatibility: grafana/recording/moptd-dcgm.rules.yaml ----------------


def _dcgm_series(stack: Stack, name: str) -> list[dict[str, Any]]:
    result = stack.query(f'{name}{{instance="{stack.moptd_target}"}}')
    assert result["status"] == "success", result
    return list(result["data"]["result"])


def test_the_dcgm_exporter_dashboard_works_unchanged_on_moptd(gpu_stack):
    """NVIDIA's own dcgm-exporter dashboard (copied verbatim): every panel query, with its
    variables filled in as Grafana fills them, returns data from moptd's recording rules."""
    import json

    dashboard = json.loads(DCGM_DASHBOARD.read_text())
    exprs = [
        t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if t.get("expr")
    ]
    assert len(exprs) >= 8
    instance = gpu_stack.moptd_target.replace(".", "\\\\.")
    for expr in exprs:
        query = expr.replace("$instance", instance).replace("$gpu", ".*")
        result = wait_for(
            f"data for {expr}",
            lambda q=query: gpu_stack.query(q)["data"]["result"],
            30,
        )
        assert result, expr
    # the dashboard's variables: label_values(DCGM_FI_DEV_GPU_TEMP, gpu) finds both GPUs
    gpus = {r["metric"]["gpu"] for r in _dcgm_series(gpu_stack, "DCGM_FI_DEV_GPU_TEMP")}
    assert gpus == {"0", "1"}


def test_dcgm_series_carry_dcgm_labels_and_units(gpu_stack):
    """Checked against the real H200's own nvidia-smi -q (tests/fixtures/h200/nvsmi_idle.txt,
    the same host as the recording): Max Clocks SM 1980 MHz; FB Memory Total 143771 MiB, which
    NVML's v2 memory info splits into used + free + reserved."""
    wait_for("the recording rules", lambda: _dcgm_series(gpu_stack, "DCGM_FI_DEV_FB_USED"), 30)
    for s in _dcgm_series(gpu_stack, "DCGM_FI_DEV_MAX_SM_CLOCK"):
        labels = s["metric"]
        assert float(s["value"][1]) == 1980.0, s
        assert labels["UUID"] == labels["uuid"]
        assert labels["UUID"].startswith("GPU-")
        assert labels["device"] == f"nvidia{labels['gpu']}"
        assert labels["modelName"] == "NVIDIA H200"
        assert labels["DCGM_FI_DRIVER_VERSION"]
        assert labels["pci_bus_id"]
    # one evaluation of one group records all three at the same instant
    on = " + on (instance, job, gpu, uuid) "
    total = gpu_stack.query(
        on.join(
            f'{name}{{instance="{gpu_stack.moptd_target}"}}'
            for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
        )
    )["data"]["result"]
    assert {r["metric"]["gpu"] for r in total} == {"0", "1"}, total
    for r in total:
        assert abs(float(r["value"][1]) - 143771) < 1.0, total
    for s in _dcgm_series(gpu_stack, "DCGM_FI_DEV_GPU_UTIL"):
        assert 0.0 <= float(s["value"][1]) <= 100.0
