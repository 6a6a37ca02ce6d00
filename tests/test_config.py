"""Configuration: defaults, overrides, and errors that name file, line and key."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.collectors import registry
from moptd.config import ConfigError, load_config, parse_config


def parse(text: str):
    return parse_config(text, "moptd.yaml", registry())


def test_defaults_need_no_file():
    cfg = load_config(None, registry())
    assert cfg.source == "<defaults>"
    assert cfg.exporter_listen == "127.0.0.1:9477"
    assert cfg.collectors["nvml"].enabled
    assert cfg.collectors["nvml"].interval == 1.0
    assert cfg.retention == 3600


def test_overrides_and_durations():
    cfg = parse("exporter:\n  listen: 0.0.0.0:9500\ncollectors:\n  host:\n"
                "    interval: 500ms\n    timeout: 2s\nstore:\n  retention: 30m\n")
    assert cfg.exporter_listen == "0.0.0.0:9500"
    assert cfg.collectors["host"].interval == 0.5
    assert cfg.collectors["host"].timeout == 2.0
    assert cfg.retention == 1800


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("exporter:\n  listn: x\n",
         "moptd.yaml:2: key 'exporter.listn': unknown key (known here: listen, web_config_file)"),
        ("log_level: 3\n", "moptd.yaml:1: key 'log_level': must be string, not 3"),
        ("collectors:\n  host:\n    enabled: yes please\n",
         "moptd.yaml:3: key 'collectors.host.enabled': must be true/false, not 'yes please'"),
        ("collectors:\n  host:\n    interval: 5 minutes\n",
         "moptd.yaml:3: key 'collectors.host.interval': not a duration: '5 minutes'"),
        ("collectors:\n  gpu:\n    enabled: true\n",
         "moptd.yaml:2: key 'collectors.gpu': unknown key (known here: "),
        ("api:\n  listen: 0.0.0.0:9478\n",
         "moptd.yaml:2: key 'api.listen': must be a loopback address (127.0.0.1, ::1), "
         "not '0.0.0.0:9478'"),
        ("exporter:\n  listen: nowhere\n",
         "moptd.yaml:2: key 'exporter.listen': must be host:port, not 'nowhere'"),
        ("store:\n  retention: 1h\nstore:\n  max_points: 5\n",
         "moptd.yaml:3: key 'store': duplicate key"),
        ("exporter: [1, 2\n", "moptd.yaml:2: YAML syntax error"),
        ("collectors:\n  host:\n    interval: 0\n",
         "moptd.yaml:3: key 'collectors.host.interval': must be above zero"),
    ],
)
def test_errors_name_file_line_and_key(text, message):
    with pytest.raises(ConfigError) as exc:
        parse(text)
    assert str(exc.value).startswith(message)


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", registry())


def test_run_refuses_a_bad_config_with_status_2(tmp_path):
    bad = tmp_path / "moptd.yaml"
    bad.write_text("exporter:\n  listen: 127.0.0.1:1\n  bogus: 1\n")
    proc = subprocess.run([sys.executable, "-m", "moptd", "run", "--config", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"{bad}:3: key 'exporter.bogus': unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_config_env_variable(tmp_path, monkeypatch):
    from moptd.config import find_config_path

    f = tmp_path / "c.yaml"
    monkeypatch.setenv("MOPTD_CONFIG", str(f))
    assert find_config_path(None) == f
    assert find_config_path("/x.yaml").as_posix() == "/x.yaml"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_gives_a_config_or_a_config_error(text):
    message = ""
    try:
        parse(text)
    except ConfigError as exc:
        message = str(exc)
    assert not message or message.startswith("moptd.yaml")


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["exporter", "listen", "collectors", "host", "nvml",
                                       "interval", "enabled", "store", "retention", "x"]),
                      children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["exporter", "collectors", "store", "api", "host",
                                        "paths", "log_level", "state_dir", "bogus"]),
                       yaml_values, max_size=4))
def test_any_structure_gives_a_config_or_a_config_error(data):
    import yaml

    message = ""
    try:
        parse(yaml.safe_dump(data))
    except ConfigError as exc:
        message = str(exc)
    assert not message or "key '" in message or "YAML" in message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("collectors:\n  serving:\n    endpoints:\n      - name: main\n"
         "        url: http://127.0.0.1:8000\n      - name: other\n        url: ftp://x\n",
         "moptd.yaml:7: key 'collectors.serving.endpoints[1].url': must start with http://"),
        ("collectors:\n  serving:\n    managed:\n      name: a\n      command: 5\n",
         "moptd.yaml:5: key 'collectors.serving.managed.command': must be a command line"),
    ],
)
def test_collector_option_checks_name_the_line(text, message):
    with pytest.raises(ConfigError) as exc:
        parse(text)
    assert str(exc.value).startswith(message)


# Issue 18, item 10: every value range-checked. Each of these was accepted before, and
# each did harm: nan corrupted the timer heap, 1e-9 spun a core, -1 made a 07777 socket.
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("collectors:\n  host:\n    interval: .nan\n",
         "moptd.yaml:3: key 'collectors.host.interval': duration must be a finite number"),
        ("collectors:\n  host:\n    interval: nan\n",
         "moptd.yaml:3: key 'collectors.host.interval': duration must be a finite number"),
        ("collectors:\n  host:\n    timeout: .inf\n",
         "moptd.yaml:3: key 'collectors.host.timeout': duration must be a finite number"),
        ("collectors:\n  host:\n    timeout: 1e999\n",
         "moptd.yaml:3: key 'collectors.host.timeout': duration must be a finite number"),
        ("collectors:\n  host:\n    interval: 1ms\n",
         "moptd.yaml:3: key 'collectors.host.interval': must be 100ms to 1d, not 0.001 s"),
        ("collectors:\n  host:\n    interval: 2d\n",
         "moptd.yaml:3: key 'collectors.host.interval': must be 100ms to 1d, not 172800 s"),
        ("rules:\n  interval: 1e-9\n",
         "moptd.yaml:2: key 'rules.interval': must be 100ms to 1d, not 1e-09 s"),
        ("rules:\n  interval: .nan\n",
         "moptd.yaml:2: key 'rules.interval': duration must be a finite number"),
        ("rules:\n  interval: 0\n", "moptd.yaml:2: key 'rules.interval': must be above zero"),
        ("store:\n  retention: inf\n",
         "moptd.yaml:2: key 'store.retention': duration must be a finite number"),
        ("store:\n  retention: 1s\n",
         "moptd.yaml:2: key 'store.retention': must be 10s to 30d, not 1 s"),
        ("store:\n  max_points: -1\n",
         "moptd.yaml:2: key 'store.max_points': must be 2 to 1000000, not -1"),
        ("store:\n  max_events: 0\n",
         "moptd.yaml:2: key 'store.max_events': must be 1 to 1000000, not 0"),
        ("store:\n  max_series: 99999999999\n",
         "moptd.yaml:2: key 'store.max_series': must be 100 to 10000000, not 99999999999"),
        ("api:\n  socket_mode: -1\n",
         "moptd.yaml:2: key 'api.socket_mode': must be 0 to 0o777, not -1 (-0o1)"),
        ("api:\n  socket_mode: 07777\n",
         "moptd.yaml:2: key 'api.socket_mode': must be 0 to 0o777, not 4095 (0o7777)"),
        ("collectors:\n  serving:\n    scrape_timeout: .inf\n",
         "moptd.yaml:3: key 'collectors.serving.scrape_timeout': must be finite, not inf"),
        ("collectors:\n  serving:\n    max_response_bytes: -1\n",
         "moptd.yaml:3: key 'collectors.serving.max_response_bytes': must be above zero, not -1"),
        ("collectors:\n  serving:\n    sample_limit: 0\n",
         "moptd.yaml:3: key 'collectors.serving.sample_limit': must be above zero, not 0"),
        ("collectors:\n  nvml:\n    gpu_deadline: .nan\n",
         "moptd.yaml:3: key 'collectors.nvml.gpu_deadline': must be finite, not nan"),
        ("collectors:\n  kernel:\n    incident_gap: -5\n",
         "moptd.yaml:3: key 'collectors.kernel.incident_gap': must be above zero, not -5"),
        ("collectors:\n  serving:\n    endpoints:\n      - name: a\n"
         "        url: http://127.0.0.1:8000\n      - name: b\n        url: http://10.1.2.3:8000\n",
         "moptd.yaml:7: key 'collectors.serving.endpoints[1].url': must be a loopback URL "
         "(127.0.0.1, ::1, localhost), not 'http://10.1.2.3:8000'"),
        ("collectors:\n  serving:\n    endpoints:\n      - name: a\n"
         "        url: http://gpu-node-7:8000\n",
         "moptd.yaml:5: key 'collectors.serving.endpoints[0].url': must be a loopback URL"),
    ],
)
def test_out_of_range_values_are_refused_with_file_line_and_key(text, message):
    with pytest.raises(ConfigError) as exc:
        parse(text)
    assert str(exc.value).startswith(message)


@pytest.mark.parametrize(
    "text",
    [
        "collectors:\n  host:\n    interval: 100ms\n    timeout: 1d\n",
        "rules:\n  interval: 0.1\nstore:\n  retention: 30d\n  max_points: 2\n  max_events: 1\n",
        "store:\n  max_series: 100\napi:\n  socket_mode: 0600\n",
        "api:\n  socket_mode: 0\n",
        "collectors:\n  serving:\n    endpoints:\n"
        "      - {name: a, url: 'http://localhost:8000'}\n"
        "      - {name: b, url: 'http://[::1]:8000'}\n"
        "      - {name: c, url: 'https://127.0.0.2:8443'}\n",
    ],
)
def test_the_bounds_themselves_are_accepted(text):
    parse(text)


def test_the_store_limits_reach_the_config():
    cfg = parse("store:\n  max_series: 500\n")
    assert cfg.max_series == 500
    assert parse("").max_series == 20000


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_config_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    path = tmp_path / "moptd.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with pytest.raises(ConfigError) as exc:
        load_config(path, registry())
    article = "a FIFO" if kind == "fifo" else "a directory"
    assert str(exc.value) == f"{path}: not a regular file ({article})"


def test_a_token_file_that_is_a_fifo_is_refused_at_its_line(tmp_path):
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as exc:
        parse(f"api:\n  listen: 127.0.0.1:9478\n  token_file: {fifo}\n")
    assert str(exc.value) == (
        f"moptd.yaml:3: key 'api.token_file': {fifo} is a FIFO, not a regular file"
    )


def test_a_missing_token_file_is_still_the_token_loaders_to_report(tmp_path):
    cfg = parse(f"api:\n  token_file: {tmp_path / 'absent'}\n")
    assert cfg.api_token_file == tmp_path / "absent"


@settings(max_examples=300, deadline=None)
@given(st.floats() | st.integers(-10**30, 10**30) | st.text(max_size=20))
def test_any_interval_gives_a_bounded_finite_interval_or_a_config_error(value):
    import yaml

    message = ""
    try:
        cfg = parse(yaml.safe_dump({"rules": {"interval": value}}))
    except ConfigError as exc:
        message = str(exc)
    if message:
        assert message.startswith("moptd.yaml:2: key 'rules.interval': ")
    else:
        assert 0.1 <= cfg.rule_interval <= 86400


def test_printed_configuration_loads_back_as_the_same_configuration(tmp_path):
    """`moptd config > moptd.yaml` is a working configuration file; `--json` is one JSON
    object (the old output put a comment line before the JSON)."""
    import json

    env = {**os.environ, "PYTHONPATH": os.getcwd(), "MOPTD_CONFIG": ""}
    def moptd(*argv: str) -> str:
        out = subprocess.run([sys.executable, "-m", "moptd", "config", *argv], env=env,
                             capture_output=True, text=True, timeout=60, check=True)
        return out.stdout

    cfg = tmp_path / "moptd.yaml"
    cfg.write_text("store: {retention: 2h}\napi: {socket_mode: 0640}\n")
    printed = moptd("--config", str(cfg))
    again = tmp_path / "again.yaml"
    again.write_text(printed)
    assert "socket_mode: 0640\n" in printed
    first = json.loads(moptd("--config", str(cfg), "--json"))
    second = json.loads(moptd("--config", str(again), "--json"))
    assert first["source"] == str(cfg)
    assert second["source"] == str(again)
    assert first["config"] == second["config"]
    assert first["config"]["store"]["retention"] == "2h"
    assert first["config"]["api"]["socket_mode"] == 0o640
