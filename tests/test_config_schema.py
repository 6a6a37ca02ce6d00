"""`moptd config --schema` (issue 34): moptd.yaml's JSON Schema, derived from the one
configuration declaration (moptd.config). It must be a valid draft 2020-12 schema, accept
the built-in defaults and every configuration moptd ships or documents, refuse what the
loader refuses for keys and types, and never refuse what the loader accepts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import jsonschema
import pytest
import yaml

from moptd.collectors import registry
from moptd.config import ConfigError, parse_config
from tests.conftest import REPO


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "config", "--schema"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    return doc


def _shipped() -> dict[str, Any]:
    """Every configuration moptd ships or shows: the unit's, the image's, the DaemonSet's
    ConfigMap and the YAML examples in docs/configuration.md."""
    found = {
        "systemd/moptd.yaml": yaml.safe_load((REPO / "systemd/moptd.yaml").read_text()),
        "deploy/image/moptd.yaml": yaml.safe_load((REPO / "deploy/image/moptd.yaml").read_text()),
    }
    docs = yaml.safe_load_all((REPO / "deploy/kubernetes/moptd.yaml").read_text())
    configmap = next(d for d in docs if d and d["kind"] == "ConfigMap")
    found["deploy/kubernetes ConfigMap"] = yaml.safe_load(configmap["data"]["moptd.yaml"])
    text = (REPO / "docs/configuration.md").read_text()
    for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", text, re.S)):
        found[f"docs/configuration.md example {i + 1}"] = yaml.safe_load(block)
    return found


SHIPPED = _shipped()


def _errors(schema: dict[str, Any], config: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(config)]


def test_the_built_in_defaults_are_valid(schema):
    defaults = parse_config("", "<defaults>", registry()).raw
    assert _errors(schema, json.loads(json.dumps(defaults))) == []
    assert _errors(schema, None) == []  # an empty file: the defaults


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_and_documented_configuration_is_valid(schema, name):
    config = SHIPPED[name]
    parse_config(yaml.safe_dump(config), name, registry())  # the loader takes it too
    assert _errors(schema, config) == []


def test_every_key_of_the_declaration_is_in_the_schema(schema):
    """Each key `moptd config` prints (the defaults filled in) is a property, at its level."""
    defaults = parse_config("", "<defaults>", registry()).raw

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and "properties" in node:
            assert set(value) == set(node["properties"]), path
            for key, sub in value.items():
                walk(sub, node["properties"][key], f"{path}.{key}")

    walk(defaults, schema, "")
    assert set(schema["properties"]["collectors"]["properties"]) == set(registry())


@pytest.mark.parametrize(
    ("config", "where"),
    [
        ({"exporter": {"listn": "127.0.0.1:9477"}}, "listn"),  # a typo
        ({"loglevel": "debug"}, "loglevel"),
        ({"collectors": {"nvmll": {"enabled": False}}}, "nvmll"),  # no such collector
        ({"collectors": {"host": {"intervall": "5s"}}}, "intervall"),
        ({"store": {"max_points": "many"}}, "max_points"),  # a type
        ({"collectors": {"nvml": {"enabled": "yes please"}}}, "enabled"),
        ({"api": {"socket_mode": True}}, "socket_mode"),  # YAML's true is not an integer
        ({"log_level": "verbose"}, "log_level"),
        (["not", "a", "mapping"], "mapping"),
    ],
)
def test_what_the_loader_refuses_the_schema_refuses(schema, config, where):
    with pytest.raises(ConfigError):
        parse_config(yaml.safe_dump(config), "<test>", registry())
    assert _errors(schema, config), config


def test_the_editor_hint_in_the_docs_names_the_command():
    text = (REPO / "docs/configuration.md").read_text()
    assert "# yaml-language-server: $schema=" in text
    assert "moptd config --schema" in text
