"""Serving-layer faults against a real `moptd run` (issue 8).

Endpoint faults: a vLLM look-alike on a real loopback socket (a thread here, serving the
captured vLLM CPU /metrics page while healthy) answers /metrics with garbage, nothing, or a
byte every half second. Process faults: the managed serving process, a small Python HTTP
server this file writes, crash-loops, hangs (SIGSTOP) and dies (SIGKILL).

In every case the daemon's own /metrics and API keep answering (each poll goes through
`assert_serving`), the endpoint's signals or the rules' finding say what happened, the
findings the API showed are still in state_dir/findings.db after the daemon stops, and no
managed process is left behind.

The shipped serving-down rule holds for 1 m and keeps firing for 1 m; a rules.d copy of it
with `for: 1s` and `keep_firing_for: 2s` keeps these tests short. The conditions are the
shipped ones, copied unchanged.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import socket
import sqlite3
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from moptd.diagnose.loader import default_rules_dir
from tests.conftest import FIXTURES
from tests.daemon_proc import DaemonProcess, free_port
from tests.faults.conftest import api_get, assert_serving, metric_value, start_daemon

pytestmark = pytest.mark.slow

PAGE = (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_idle.txt").read_bytes()
MODELS = json.dumps({"object": "list", "data": [{"id": "tinyllama", "object": "model"}]})
MIB = 1 << 20

# --- an unmanaged engine whose answers the test chooses ---


class FaultyEngine:
    """A vLLM look-alike on a real loopback socket. `faults` maps a path to a fault name;
    a path without one answers like vLLM (the captured page, an empty 200 /health)."""

    def __init__(self, port: int = 0) -> None:
        self.faults: dict[str, str] = {}
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                engine.answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop listening: from now on a connection is refused."""
        self.server.shutdown()
        self.server.server_close()

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        fault = self.faults.get(path, "ok")
        try:
            if fault == "reset":
                # SO_LINGER 0: close() sends RST, not FIN; the client reads a reset
                linger = struct.pack("ii", 1, 0)
                h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                h.rfile.close()
                h.wfile.close()
                h.connection.close()
                # http.server flushes and closes these after the handler: let it
                h.rfile, h.wfile = io.BytesIO(), io.BytesIO()
                h.close_connection = True
                return
            if fault == "ok":
                body = {"/metrics": PAGE, "/v1/models": MODELS.encode()}.get(path, b"")
                self._send(h, body)
            elif fault == "random":
                self._send(h, random.Random(8).randbytes(64 << 10))
            elif fault == "empty":
                self._send(h, b"")
            elif fault == "huge_line":
                # one sample line of 6 MiB: under the 8 MiB body cap, so the parser sees it
                label = b"x" * (6 * MIB)
                self._send(h, PAGE + b'python_info{version="' + label + b'"} 1\n')
            elif fault == "truncated":
                self._head(h, len(PAGE))
                h.wfile.write(PAGE[: len(PAGE) // 2])
                h.close_connection = True
            elif fault == "endless":
                # no length, a valid line repeated for ever: only the reader's cap ends it
                self._head(h, None)
                chunk = b"vllm:num_requests_running 1\n" * (MIB // 28)
                for _ in range(4096):
                    h.wfile.write(chunk)
                h.close_connection = True
            elif fault == "trickle":
                self._head(h, len(PAGE))
                for i in range(len(PAGE)):
                    h.wfile.write(PAGE[i : i + 1])
                    h.wfile.flush()
                    time.sleep(0.5)
            else:
                raise AssertionError(f"unknown fault {fault!r}")
        except OSError:
            pass  # the daemon hung up on a fault, as it should

    @staticmethod
    def _head(h: BaseHTTPRequestHandler, length: int | None) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain; version=0.0.4")
        if length is None:
            h.send_header("Connection", "close")
        else:
            h.send_header("Content-Length", str(length))
        h.end_headers()

    def _send(self, h: BaseHTTPRequestHandler, body: bytes) -> None:
        self._head(h, len(body))
        h.wfile.write(body)


# --- the managed serving process ---

ENGINE_PROGRAM = '''\
"""A stand-in for a vLLM API server: /health, /v1/models and a captured /metrics page."""
import http.server
import signal
import sys

port, page, mode = int(sys.argv[1]), open(sys.argv[2], "rb").read(), sys.argv[3]
if mode == "crash":
    print("stand-in told to fail at start: exiting with status 1", flush=True)
    sys.exit(1)
BODIES = {
    "/health": b"",
    "/metrics": page,
    "/v1/models": b'{"object": "list", "data": [{"id": "tinyllama", "object": "model"}]}',
}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = BODIES.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # a client that gave up while the server was stopped makes the late answer's
        # write fail; socketserver prints that traceback, vLLM's uvicorn prints nothing,
        # and moptd would rightly quote it as an unclassified error of the stand-in
        pass


server = Server(("127.0.0.1", port), Handler)
# vLLM shuts down gracefully on SIGTERM; a handler (not the default action) is what leaves
# a stopped server unable to act on it
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
# the two lines vLLM prints once it listens (moptd's start-up detection reads them)
print(f"(APIServer pid=1) INFO 11-29 16:30:28 [entry.py:140] Starting vLLM server on "
      f"http://127.0.0.1:{port}", flush=True)
print("INFO:     Application startup complete.", flush=True)
server.serve_forever()
'''


def model_dir(tmp: Path) -> Path:
    """What the gates require: config.json, a tokenizer file and safetensors weights."""
    d = tmp / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return d


def managed(tmp: Path, mode: str, **spec: Any) -> dict[str, Any]:
    program = tmp / "engine.py"
    program.write_text(ENGINE_PROGRAM)
    page = tmp / "metrics.txt"
    page.write_bytes(PAGE)
    port = free_port()
    return {
        "name": "tiny",
        "engine": "vllm",
        "command": [sys.executable, str(program), str(port), str(page), mode],
        "host": "127.0.0.1",
        "port": port,
        "device": "cpu",
        "model_dir": str(model_dir(tmp)),
        "probes": ["health", "models"],
        "stop_grace": 2,
        **spec,
    }


# --- the daemon ---


def fast_serving_down(rules_d: Path) -> None:
    """The shipped serving-down rule, conditions unchanged, with short for/keep_firing_for."""
    shipped = yaml.safe_load((default_rules_dir() / "serving" / "serving.rules.yaml").read_text())
    rule = next(r for r in shipped["rules"] if r["id"] == "serving-down")
    rule.update({"for": "1s", "keep_firing_for": "2s"})
    rules_d.mkdir()
    (rules_d / "fast.rules.yaml").write_text(
        yaml.safe_dump({"schema": "moptd.rules/v1", "rules": [rule]}, sort_keys=False)
    )


def daemon_config(tmp: Path, **serving: Any) -> dict[str, Any]:
    fast_serving_down(tmp / "rules.d")
    return {
        "collectors": {
            # the kernel log is shared with other tests that flood it
            "kernel": {"enabled": False},
            "nvml": {"enabled": False},
            "driver": {"enabled": False},
            "container": {"enabled": False},
            # the witness that other collectors are not disturbed
            "host": {"interval": 1},
            "serving": {"interval": 0.5, "scrape_timeout": 1.0, **serving},
        },
        "rules": {"paths": [str(default_rules_dir()), str(tmp / "rules.d")], "interval": 0.5},
    }


@pytest.fixture
def run_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(**serving: Any) -> DaemonProcess:
        d = start_daemon(tmp_path / "daemon", daemon_config(tmp_path, **serving))
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def wait_until(
    d: DaemonProcess, what: str, check: Callable[[str], Any], within: float = 20.0
) -> Any:
    """Poll until check(/metrics text) is truthy; every poll also requires the daemon's
    /metrics and API to answer within 5 s."""
    deadline = time.monotonic() + within
    while True:
        value = check(assert_serving(d, within=5.0))
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}\n{d.log()[-3000:]}")
        time.sleep(0.2)


def serving(text: str, name: str, signal_: str, **labels: str) -> float | None:
    return metric_value(text, f"moptd_serving_{signal_}", serving=name, **labels)


def collector_ok(text: str, name: str) -> bool:
    return metric_value(text, "moptd_collector_success", collector=name) == 1.0


def attrs(d: DaemonProcess, subject: str) -> dict[str, Any]:
    snap = api_get(d, f"/v1/snapshot?subject={subject}")
    return dict(snap["subjects"][subject]["attrs"])


def active(d: DaemonProcess, code: str, subject: str) -> dict[str, Any] | None:
    found = api_get(d, f"/v1/findings?code={code}")["active"]
    return next((f for f in found if f["subject"] == subject), None)


def committed(d: DaemonProcess) -> list[dict[str, Any]]:
    """The findings history as the API shows it, each with its transitions and events."""
    return [api_get(d, f"/v1/findings/{f['id']}") for f in api_get(d, "/v1/findings")["history"]]


def assert_committed(d: DaemonProcess, seen: list[dict[str, Any]]) -> None:
    """Every finding the API showed is in findings.db, read after the daemon stopped: the
    same finding, resolved if it was, with at least its transitions and events."""
    assert seen, "the API showed no finding"
    db = sqlite3.connect(f"file:{d.state_dir / 'findings.db'}?mode=ro", uri=True)
    try:
        for f in seen:
            row = db.execute(
                "SELECT rule, subject, code, state FROM findings WHERE id = ?", (f["id"],)
            ).fetchone()
            assert row is not None, f"finding {f['id']} ({f['code']}) is gone"
            assert row[:3] == (f["rule"], f["subject"], f["code"])
            if f["state"] == "resolved":
                assert row[3] == "resolved"
            (transitions,) = db.execute(
                "SELECT COUNT(*) FROM transitions WHERE finding_id = ?", (f["id"],)
            ).fetchone()
            assert transitions >= len(f["transitions"]) > 0, f
            for e in f["events"]:
                hit = db.execute(
                    "SELECT 1 FROM events WHERE stream = ? AND subject = ? AND t = ?",
                    (e["stream"], e["subject"], e["t"]),
                ).fetchone()
                assert hit is not None, f"event lost: {e}"
    finally:
        db.close()


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def peak_rss(d: DaemonProcess) -> int:
    """The daemon's peak resident set (VmHWM), in bytes."""
    assert d.proc is not None
    for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


# --- endpoint faults ---

# fault -> what the endpoint's scrape_error says
GARBAGE = {
    "random": "codec can't decode",
    "truncated": "ClientPayloadError",
    "huge_line": "longer than",
    "endless": "body larger than 8388608 bytes",
}


def test_garbage_metrics_fails_only_that_endpoint_and_memory_stays_bounded(run_daemon):
    good, bad = FaultyEngine(), FaultyEngine()
    d = run_daemon(endpoints=[{"name": "good", "url": good.url}, {"name": "bad", "url": bad.url}])
    text = wait_until(
        d,
        "both endpoints up",
        lambda t: serving(t, "good", "up") == 1 and serving(t, "bad", "up") == 1 and t,
    )
    good_failures = serving(text, "good", "scrape_failures_total")
    baseline = peak_rss(d)
    for fault, reason in GARBAGE.items():
        bad.faults["/metrics"] = fault
        failed = serving(assert_serving(d), "bad", "scrape_failures_total") or 0.0
        text = wait_until(
            d,
            f"{fault}: two failed scrapes of the bad endpoint",
            lambda t, n=failed: (serving(t, "bad", "scrape_failures_total") or 0) >= n + 2 and t,
        )
        assert serving(text, "bad", "up") == 0, fault
        assert reason in attrs(d, "serving:bad")["scrape_error"], fault
        assert serving(text, "bad", "healthy") == 1, "/health was not touched"
        assert serving(text, "good", "up") == 1, fault
        assert collector_ok(text, "serving"), "an endpoint's failure is not the collector's"
        assert collector_ok(text, "host")
    growth = peak_rss(d) - baseline
    assert growth < 64 * MIB, f"peak RSS grew {growth / MIB:.0f} MiB on bad /metrics bodies"
    bad.faults.clear()
    text = wait_until(d, "bad endpoint recovers", lambda t: serving(t, "bad", "up") == 1 and t)
    assert serving(text, "good", "scrape_failures_total") == good_failures
    assert active(d, "SERVING_DOWN", "serving:bad") is None, "/health answered all along"
    good.close()
    bad.close()


def failures(d: DaemonProcess, name: str) -> float:
    return serving(assert_serving(d), name, "scrape_failures_total") or 0.0


def test_silent_metrics_marks_the_endpoint_down_and_serving_down_fires(run_daemon):
    engine = FaultyEngine()
    d = run_daemon(endpoints=[{"name": "quiet", "url": engine.url, "probes": ["health", "models"]}])
    wait_until(d, "endpoint up", lambda t: serving(t, "quiet", "up") == 1)

    def failed_twice(what: str) -> str:
        n = failures(d, "quiet")
        text: str = wait_until(
            d, what, lambda t: (serving(t, "quiet", "scrape_failures_total") or 0) >= n + 2 and t
        )
        return text

    # An empty 200 on /metrics only: no page. /health answers, so no rule calls it down.
    engine.faults["/metrics"] = "empty"
    text = failed_twice("empty /metrics fails the scrape")
    assert serving(text, "quiet", "up") == 0
    assert serving(text, "quiet", "healthy") == 1
    assert attrs(d, "serving:quiet")["scrape_error"].endswith("/metrics: empty body")
    assert active(d, "SERVING_DOWN", "serving:quiet") is None

    # Every path resets the connection: neither /health nor /metrics answers.
    engine.faults.update(dict.fromkeys(("/metrics", "/health", "/v1/models"), "reset"))
    down = wait_until(
        d, "SERVING_DOWN on resets", lambda _: active(d, "SERVING_DOWN", "serving:quiet")
    )
    assert down["path"] == ["serving-down/not-answering"], down
    a = attrs(d, "serving:quiet")
    assert "Connection reset by peer" in a["scrape_error"], a
    assert "Connection reset by peer" in a["probe_health_error"], a

    # Nothing listens any more: refused, and still down.
    port = engine.port
    engine.close()
    failed_twice("refused connections fail the scrape")
    assert "Connect call failed" in attrs(d, "serving:quiet")["scrape_error"]
    assert active(d, "SERVING_DOWN", "serving:quiet") is not None

    # The server is back: the finding resolves after keep_firing_for, into the history.
    engine = FaultyEngine(port)
    wait_until(
        d, "SERVING_DOWN resolves", lambda _: active(d, "SERVING_DOWN", "serving:quiet") is None
    )
    seen = committed(d)
    assert [(f["code"], f["state"]) for f in seen] == [("SERVING_DOWN", "resolved")], seen
    d.stop()
    assert_committed(d, seen)
    engine.close()


def test_trickling_metrics_is_cut_by_the_scrape_timeout(run_daemon):
    good, slow = FaultyEngine(), FaultyEngine()
    d = run_daemon(
        endpoints=[{"name": "good", "url": good.url}, {"name": "slow", "url": slow.url}],
        scrape_timeout=1.5,
    )
    wait_until(
        d, "both up", lambda t: serving(t, "good", "up") == 1 and serving(t, "slow", "up") == 1
    )
    # one byte every 0.5 s: the whole page would take almost seven hours
    slow.faults["/metrics"] = "trickle"
    n = failures(d, "slow")
    text = wait_until(
        d,
        "the trickling scrape fails twice",
        lambda t: (serving(t, "slow", "scrape_failures_total") or 0) >= n + 2 and t,
    )
    assert serving(text, "slow", "up") == 0
    assert "no complete answer within 1.5s" in attrs(d, "serving:slow")["scrape_error"]
    took = serving(text, "slow", "scrape_duration_seconds")
    assert took is not None
    assert 1.4 <= took < 4.0, f"cut after {took}s, not at the 1.5 s deadline"
    assert serving(text, "slow", "healthy") == 1
    assert serving(text, "good", "up") == 1
    assert collector_ok(text, "serving"), "one slow endpoint is not the collector's failure"
    assert collector_ok(text, "host")
    pass_took = metric_value(text, "moptd_collector_duration_seconds", collector="serving")
    assert pass_took is not None
    assert pass_took < 10.0, "within the collector's own timeout"
    slow.faults.clear()
    wait_until(d, "the endpoint recovers", lambda t: serving(t, "slow", "up") == 1)
    good.close()
    slow.close()


# --- process faults ---


def supervisor(d: DaemonProcess) -> dict[str, Any]:
    return dict(api_get(d, "/v1/serving?lines=200")["managed"])


def ready(t: str) -> bool:
    return all(
        serving(t, "tiny", name) == want
        for name, want in (("process_up", 1), ("starting", 0), ("up", 1), ("healthy", 1))
    )


def process_exits(d: DaemonProcess, finding_id: int) -> list[dict[str, Any]]:
    detail = api_get(d, f"/v1/findings/{finding_id}")
    return [e for e in detail["events"] if e["stream"] == "serving.process_exit"]


def test_crash_loop_stops_the_restarts_and_fires_serving_down(run_daemon, tmp_path):
    spec = managed(
        tmp_path,
        "crash",
        backoff_initial=0.3,
        backoff_max=1,
        crash_loop_count=3,
        crash_loop_window="1m",
    )
    d = run_daemon(managed=spec)
    down = wait_until(
        d,
        "SERVING_DOWN, crash-loop branch",
        lambda _: (f := active(d, "SERVING_DOWN", "serving:tiny"))
        and f["path"] == ["serving-down/crash-loop"]
        and f,
    )
    assert "(2 restarts)" in down["summary"], down
    sup = supervisor(d)
    assert sup["state"] == "crash_loop", sup
    assert (sup["last_exit"]["exit_code"], sup["last_exit"]["expected"]) == (1, False), sup
    exits = process_exits(d, down["id"])
    assert [e["fields"]["exit_code"] for e in exits] == [1, 1, 1], exits
    # well past the longest back-off: the supervisor has given up, no fourth start
    time.sleep(3)
    text = assert_serving(d)
    assert serving(text, "tiny", "crash_loop") == 1
    assert serving(text, "tiny", "restarts_total") == 2
    assert serving(text, "tiny", "process_up") == 0
    sup = supervisor(d)
    assert (sup["state"], sup["restarts"], sup["pid"]) == ("crash_loop", 2, None), sup
    assert len(process_exits(d, down["id"])) == 3
    assert active(d, "SERVING_DOWN", "serving:tiny") is not None
    seen = committed(d)
    d.stop()
    assert_committed(d, seen)


def test_hung_server_fires_serving_down_and_recovers_on_sigcont(run_daemon, tmp_path):
    d = run_daemon(managed=managed(tmp_path, "serve"))
    wait_until(d, "the managed server is ready", ready)
    pid = supervisor(d)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        down = wait_until(
            d, "SERVING_DOWN on a hung server", lambda _: active(d, "SERVING_DOWN", "serving:tiny")
        )
        assert down["path"] == ["serving-down/not-answering"], down
        a = attrs(d, "serving:tiny")
        assert "no complete answer within 1s" in a["scrape_error"], a
        assert "no complete answer within 1s" in a["probe_health_error"], a
        text = assert_serving(d)
        assert serving(text, "tiny", "process_up") == 1, "stopped is not gone"
        assert collector_ok(text, "serving")
        assert collector_ok(text, "host")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(d, "probes answer again", ready)
    wait_until(
        d, "SERVING_DOWN resolves", lambda _: active(d, "SERVING_DOWN", "serving:tiny") is None
    )
    assert supervisor(d)["pid"] == pid, "a hang is not a restart"
    seen = committed(d)
    assert [(f["code"], f["state"]) for f in seen] == [("SERVING_DOWN", "resolved")], seen
    # moptd stops while its server is stopped again: the whole group still goes
    os.kill(pid, signal.SIGSTOP)
    d.stop()
    assert "ignored SIGTERM for 2s; SIGKILL" in d.log()
    assert group_gone(pid), f"process group {pid} outlived moptd"
    assert_committed(d, seen)


def test_killed_server_is_restarted_with_backoff(run_daemon, tmp_path):
    d = run_daemon(managed=managed(tmp_path, "serve", backoff_initial=3))
    text = wait_until(d, "the managed server is ready", lambda t: ready(t) and t)
    assert serving(text, "tiny", "restarts_total") == 0
    pid = supervisor(d)["pid"]
    os.kill(pid, signal.SIGKILL)
    down = wait_until(
        d, "SERVING_DOWN while it is gone", lambda _: active(d, "SERVING_DOWN", "serving:tiny")
    )
    assert down["path"] == ["serving-down/process-gone"], down
    text = wait_until(
        d,
        "restarted and ready",
        lambda t: ready(t) and serving(t, "tiny", "restarts_total") == 1 and t,
    )
    sup = supervisor(d)
    assert sup["pid"] not in (None, pid)
    exit_ = sup["last_exit"]
    assert (exit_["signal"], exit_["expected"]) == (signal.SIGKILL, False), exit_
    assert sup["started_at"] - exit_["t"] >= 2.9, "restarted before backoff_initial"
    [event] = process_exits(d, down["id"])
    assert event["fields"] == {"exit_code": -1, "signal": signal.SIGKILL, "expected": False}
    wait_until(
        d, "SERVING_DOWN resolves", lambda _: active(d, "SERVING_DOWN", "serving:tiny") is None
    )
    seen = committed(d)
    assert [(f["code"], f["state"]) for f in seen] == [("SERVING_DOWN", "resolved")], seen
    d.stop()
    assert group_gone(pid), "the killed server's group outlived moptd"
    assert group_gone(sup["pid"]), "the restarted server outlived moptd"
    assert_committed(d, seen)
