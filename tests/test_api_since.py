"""`since` on every endpoint that takes it (issue 34): an empty or blank `since=` (a
script's unset variable) gets a 400 that says what a time looks like, from a real daemon
over its socket; and the OpenAPI document says so, so that a request valid by the document
is never refused for it (schemathesis flagged `since=` on three endpoints)."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from tests.api_helpers import get, wait_socket
from tests.conftest import REPO
from tests.daemon_proc import DaemonProcess

OPENAPI = yaml.safe_load((REPO / "docs" / "api" / "openapi.yaml").read_text())


def _takes_since() -> dict[str, dict[str, object]]:
    """path -> the `since` parameter's schema, for every GET that documents one."""
    out = {}
    for path, ops in OPENAPI["paths"].items():
        for param in ops.get("get", {}).get("parameters", []):
            if param.get("name") == "since":
                out[path] = param["schema"]
    return out


SINCE = _takes_since()


def test_the_endpoints_that_take_since():
    assert set(SINCE) == {"/v1/findings", "/v1/explain", "/v1/remediations"}


@pytest.mark.parametrize("path", sorted(SINCE))
def test_the_document_refuses_an_empty_since(path):
    schema = SINCE[path]
    for bad in ("", " ", "\t"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    for good in ("1h", "1764892800", "2026-12-05T00:00:00Z"):
        jsonschema.validate(good, schema)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = DaemonProcess(tmp_path_factory.mktemp("since")).start()
    wait_socket(d.socket, d.proc)
    yield d
    d.stop()


@pytest.mark.parametrize("path", sorted(SINCE))
@pytest.mark.parametrize("value", ["", "%20", "%20%09"])
def test_an_empty_since_gets_400_with_a_clear_message(daemon, path, value):
    code, body = get(daemon.socket, f"{path}?since={value}")
    assert code == 400, body
    assert body["status"] == 400
    assert body["error"].startswith("since: empty; give Unix seconds, an RFC 3339 time"), body


@pytest.mark.parametrize("path", sorted(SINCE))
def test_a_good_since_is_taken(daemon, path):
    code, body = get(daemon.socket, f"{path}?since=1h")
    assert code == 200, body
