"""The drain step fits the host (issue 31 item 4): on a host Kubernetes does not schedule,
the first action of a hardware block is not `kubectl drain`.

The host layouts are the schedulers' documented default paths (moptd/catalog/drain.yaml
cites them), made under tmp_path as the host root. The managed engine's own drain runs
against a real daemon with a real child process: POST holds /v1/serving/NAME/ready at 503,
a remedy's readiness hold does not lift it, DELETE lets it go.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moptd.cli.drain_fit import UNKNOWN, detect, drain_step, fit
from moptd.cli.explain_facts import annotate, load_ruleset
from moptd.diagnose.loader import default_rules_dir
from tests.daemon_proc import DaemonProcess, free_port


def layout(root: Path, *paths: str) -> Path:
    for p in paths:
        (root / p).mkdir(parents=True, exist_ok=True)
    return root


def test_kubelet_root_dir_is_kubernetes_and_the_downward_api_names_the_node(tmp_path):
    root = layout(tmp_path, "var/lib/kubelet/pods")
    host = detect(root, {})
    assert (host.kind, host.node) == ("kubernetes", "$(hostname)")
    assert "/var/lib/kubelet/pods" in host.why
    # the DaemonSet's NODE_NAME (spec.nodeName) is the name the API server knows
    host = detect(root, {"NODE_NAME": "ip-10-0-3-17.ec2.internal"})
    assert drain_step(host, "GPU_LOST") == (
        "kubectl drain ip-10-0-3-17.ec2.internal --ignore-daemonsets --delete-emptydir-data",
        True,
    )


def test_a_pod_sees_kubernetes_by_its_environment(tmp_path):
    host = detect(tmp_path, {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "NODE_NAME": "gpu-7"})
    assert (host.kind, host.node) == ("kubernetes", "gpu-7")


def test_k3s_agent_is_kubernetes(tmp_path):
    assert detect(layout(tmp_path, "var/lib/rancher/k3s/agent"), {}).kind == "kubernetes"


def test_slurm_node_drains_with_scontrol_and_a_reason(tmp_path):
    root = tmp_path
    (root / "etc/slurm").mkdir(parents=True)
    (root / "etc/slurm/slurm.conf").write_text("")
    host = detect(root, {})
    assert host.kind == "slurm"
    text, command = drain_step(host, "ECC_UNCORRECTABLE")
    assert command
    assert text == (
        'scontrol update NodeName=$(hostname -s) State=DRAIN Reason="moptd ECC_UNCORRECTABLE"'
    )


def test_no_scheduler_no_kubectl(tmp_path):
    host = detect(tmp_path, {})
    assert host.kind == "none"
    text, command = drain_step(host, "GPU_LOST")
    assert not command
    assert "kubectl" not in text
    assert "load balancer" in text


def test_the_engine_moptd_runs_drains_through_moptd(tmp_path):
    host = detect(tmp_path, {}, managed="llm")
    assert drain_step(host, "GPU_LOST") == ("moptd serving drain llm", True)
    # Kubernetes schedules the engine where both are there
    assert detect(layout(tmp_path, "var/lib/kubelet/pods"), {}, managed="llm").kind == "kubernetes"


def gpu_lost_finding() -> dict[str, object]:
    rules = load_ruleset([default_rules_dir()])
    assert rules is not None
    rule = rules.by_id("gpu-lost")
    assert rule is not None
    leaf = next(b for b in rule.branches if b.verdict is not None and b.verdict.code == "GPU_LOST")
    assert leaf.verdict is not None
    finding = {
        "code": "GPU_LOST",
        "rule": rule.id,
        "path": [f"{rule.id}/{leaf.id}"],
        "actions": [f"{a.kind}: {a.text}" for a in leaf.verdict.actions],
    }
    return annotate(finding, rules)


def test_fit_rewrites_the_rules_drain_step_and_says_why(tmp_path):
    f = gpu_lost_finding()
    steps = f["action_steps"]
    assert isinstance(steps, list)
    assert steps[0]["kind"] == "drain_node"
    assert "kubectl drain" in steps[0]["text"]
    fitted = fit(f, detect(tmp_path, {}))
    assert fitted["drain"] == {"host": "none", "why": detect(tmp_path, {}).why}
    first = fitted["action_steps"][0]
    assert first["kind"] == "drain_node"
    assert first["command"] is False
    assert "kubectl" not in first["text"]
    assert not any("kubectl" in a for a in fitted["actions"])
    # the other steps are the rule's
    assert fitted["action_steps"][1:] == steps[1:]
    # a bundle: the alternatives, each named
    shown = fit(f, UNKNOWN)["action_steps"][0]["text"]
    assert "kubectl drain <node>" in shown
    assert "scontrol update NodeName=<node>" in shown


def test_explain_of_a_bundle_names_the_alternatives():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "moptd",
            "explain",
            "--json",
            "--bundle",
            "tests/fixtures/incidents/xid79-gpu-then-vllm-shm-stall",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    view = json.loads(out.stdout)
    lost = next(f for f in view["findings"] if f["code"] == "GPU_LOST")
    assert lost["drain"]["host"] == "unknown"
    assert lost["action_steps"][0]["text"].startswith("drain the node from what schedules")


# --- the managed engine's own drain, on a real daemon ---


def unix_call(sock: Path, method: str, path: str) -> tuple[int, dict[str, object]]:
    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(10)
            self.sock.connect(str(sock))

    conn = Conn("moptd")
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def wait_running(sock: Path) -> int:
    """The readiness once the engine runs (200): the drain must move it, not the start."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, _ = unix_call(sock, "GET", "/v1/serving/llm/ready")
        if status == 200:
            return status
        time.sleep(0.2)
    raise AssertionError("the managed engine never became ready")


@pytest.mark.slow
def test_moptd_serving_drain_holds_readiness_until_undone(tmp_path):
    engine = {
        "name": "llm",
        "device": "cpu",  # no GPU gates
        "port": free_port(),
        "command": ["sleep", "120"],
        "backoff_initial": "1s",
        "stop_grace": "5s",
    }
    d = DaemonProcess(tmp_path, {"collectors": {"serving": {"managed": engine}}}).start()
    try:
        d.wait_metrics()
        sock = d.socket
        before = wait_running(sock)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "moptd",
                    "serving",
                    "drain",
                    *args,
                    "--config",
                    str(d.config_path),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        out = cli("llm")
        assert out.returncode == 0, out.stderr
        assert "drained llm" in out.stdout
        assert "--undo" in out.stdout
        status, body = unix_call(sock, "GET", "/v1/serving/llm/ready")
        assert status == 503
        assert "drained by an operator" in str(body["reason"])
        out = cli("nope")
        assert out.returncode == 2
        assert "unknown serving process" in out.stderr
        out = cli("llm", "--undo")
        assert out.returncode == 0, out.stderr
        assert "undrained llm" in out.stdout
        assert unix_call(sock, "GET", "/v1/serving/llm/ready")[0] == before
    finally:
        d.stop()
