"""Configuration: defaults, overrides, and errors that name file, line and key."""

from __future__ import annotations

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
         "moptd.yaml:2: key 'exporter.listn': unknown key (known here: listen)"),
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
