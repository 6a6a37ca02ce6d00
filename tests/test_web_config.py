"""TLS and basic auth on /metrics from a node_exporter-style web configuration file:
broken files refused with file, line and key; a real Prometheus scrapes over TLS with
basic auth; a wrong password or plain HTTP gets nothing."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moptd.config import ConfigError
from moptd.daemon.webconfig import load_web_config
from tests.conftest import require_tool
from tests.daemon_proc import DaemonProcess
from tests.prometheus_proc import PrometheusProcess

PASSWORD = "scrape-me"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a server certificate for 127.0.0.1, made by the real openssl."""
    openssl = require_tool("openssl")
    d = tmp_path_factory.mktemp("pki")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=60)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=moptd test CA",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    )
    return d


def web_yaml(pki: Path, users: bool = True) -> str:
    text = (
        f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n  key_file: {pki / 'server.key'}\n"
    )
    if users:
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        text += f"basic_auth_users:\n  prometheus: {hashed}\n"
    return text


@pytest.mark.parametrize(
    ("body", "line", "key", "why"),
    [
        ("tls_server_config:\n  cert_file: a.crt\n", 1, "tls_server_config.key_file", "required"),
        ("http_server_config:\n  http2: false\n", 1, "http_server_config", "not implemented"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n",
            4,
            "tls_server_config.cipher_suites",
            "not implemented",
        ),
        ("basic_auth_users:\n  alice: hunter2\n", 2, "basic_auth_users.alice", "bcrypt hash"),
        ("tls_config:\n  cert_file: a\n", 1, "tls_config", "unknown key"),
        (
            "tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n",
            2,
            "tls_server_config.cert_file",
            "cannot load",
        ),
        ("tls_server_config: [1, 2]\n", 1, "tls_server_config", "must be a mapping"),
        ("basic_auth_users:\n  a: b\n c: d\n", 3, None, "YAML"),
    ],
)
def test_a_broken_file_names_file_line_and_key(tmp_path, body, line, key, why):
    f = tmp_path / "web.yml"
    f.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_web_config(f)
    text = str(err.value)
    assert text.startswith(f"{f}:{line}: "), text
    if key:
        assert f"key {key!r}" in text
    assert why in text


def test_client_auth_modes(tmp_path, pki):
    f = tmp_path / "web.yml"
    base = web_yaml(pki, users=False)
    f.write_text(base + "  client_auth_type: RequireAndVerifyClientCert\n")
    with pytest.raises(ConfigError, match=r"client_ca_file.*required"):
        load_web_config(f)
    f.write_text(
        base + f"  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {pki / 'ca.crt'}\n"
    )
    assert load_web_config(f).ssl_context.verify_mode == ssl.CERT_REQUIRED
    f.write_text(base + "  client_auth_type: RequireAnyClientCert\n")
    with pytest.raises(ConfigError, match="not implemented"):
        load_web_config(f)


@given(st.text(max_size=400))
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_text_is_a_config_or_a_config_error(tmp_path, text):
    f = tmp_path / "web.yml"
    f.write_text(text)
    problem = ""
    try:
        load_web_config(f)
    except ConfigError as exc:
        problem = str(exc)
    assert problem == "" or problem.startswith(str(f))


def _get(url: str, ca: Path | None, auth: str | None) -> int:
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else None
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.slow
def test_a_real_prometheus_scrapes_over_tls_with_basic_auth(tmp_path, pki):
    web = tmp_path / "web.yml"
    web.write_text(web_yaml(pki))
    with DaemonProcess(_mkdir(tmp_path / "d"), {"exporter": {"web_config_file": str(web)}}) as d:
        https = f"https://127.0.0.1:{d.port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                status = _get(https, pki / "ca.crt", f"prometheus:{PASSWORD}")
                break
            except OSError:
                assert d.proc is not None
                assert d.proc.poll() is None, d.log()
                assert time.monotonic() < deadline, d.log()
                time.sleep(0.2)
        assert status == 200
        assert _get(https, pki / "ca.crt", None) == 401
        assert _get(https, pki / "ca.crt", "prometheus:wrong") == 401
        assert _get(https, pki / "ca.crt", f"nobody:{PASSWORD}") == 401
        # plain HTTP to a TLS port gets no HTTP answer
        with pytest.raises(OSError, match=r"Remote end closed|reset|BadStatusLine"):
            _get(f"http://127.0.0.1:{d.port}/metrics", None, None)

        target = f"127.0.0.1:{d.port}"
        tls = {"ca_file": str(pki / "ca.crt")}
        prom = PrometheusProcess(
            require_tool("prometheus"),
            tmp_path,
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "good",
                        "scheme": "https",
                        "tls_config": tls,
                        "basic_auth": {"username": "prometheus", "password": PASSWORD},
                        "static_configs": [{"targets": [target]}],
                    },
                    {
                        "job_name": "wrong-password",
                        "scheme": "https",
                        "tls_config": tls,
                        "basic_auth": {"username": "prometheus", "password": "nope"},
                        "static_configs": [{"targets": [target]}],
                    },
                    {"job_name": "plain", "static_configs": [{"targets": [target]}]},
                ],
            },
        )
        try:
            deadline = time.monotonic() + 60
            ups: dict[str, str] = {}
            while time.monotonic() < deadline:
                try:
                    result = prom.query("up")["data"]["result"]
                except OSError:
                    result = []
                ups = {r["metric"]["job"]: r["value"][1] for r in result}
                if len(ups) == 3:
                    break
                time.sleep(0.5)
            assert ups == {"good": "1", "wrong-password": "0", "plain": "0"}, ups
            hosts = prom.query('moptd_collector_success{job="good",collector="host"}')
            assert hosts["data"]["result"], json.dumps(hosts)
        finally:
            prom.stop()
    assert "exporter listening on https://" in d.log()


@pytest.mark.slow
def test_a_broken_web_config_stops_the_start_with_file_line_and_key(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: /nonexistent.crt\n")
    d = DaemonProcess(_mkdir(tmp_path / "d"), {"exporter": {"web_config_file": str(web)}})
    d.start()
    assert d.proc is not None
    assert d.proc.wait(30) == 2
    d.stop()
    assert f"{web}:1: key 'tls_server_config.key_file': required" in d.log(), d.log()


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
