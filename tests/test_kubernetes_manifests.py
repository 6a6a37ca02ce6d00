"""deploy/kubernetes: schema validation (kubernetes-validate's bundled schemas, strict) and
the cross-references between the objects."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from moptd.collectors import registry
from moptd.config import parse_config

from .conftest import REPO

try:
    import kubernetes_validate
except ImportError:  # the test extra brings it; CI must not skip silently
    if os.environ.get("MOPTD_REQUIRE_TOOLS"):
        raise
    pytest.skip("kubernetes-validate (test extra) is not installed", allow_module_level=True)

DEPLOY = REPO / "deploy" / "kubernetes"
K8S_VERSION = "1.30.0"

# The part of the Prometheus Operator's ServiceMonitor CRD (monitoring.coreos.com/v1) that
# these manifests use; unknown keys are rejected so a typo cannot pass.
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object",
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": "^(0|([0-9]+(ms|s|m|h))+)$"},
                            "scrapeTimeout": {
                                "type": "string",
                                "pattern": "^(0|([0-9]+(ms|s|m|h))+)$",
                            },
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {
                                            "type": "array",
                                            "items": {"type": "string"},
                                        },
                                        "targetLabel": {"type": "string"},
                                        "separator": {"type": "string"},
                                        "regex": {"type": "string"},
                                        "replacement": {"type": "string"},
                                        "modulus": {"type": "integer"},
                                        "action": {
                                            "enum": [
                                                "replace",
                                                "keep",
                                                "drop",
                                                "hashmod",
                                                "labelmap",
                                                "labeldrop",
                                                "labelkeep",
                                                "lowercase",
                                                "uppercase",
                                                "keepequal",
                                                "dropequal",
                                            ]
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((f"{path.name}: {doc['kind']}/{doc['metadata']['name']}", doc))
    return out


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] == "ServiceMonitor":
        jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def by_kind(kind: str) -> dict[str, Any]:
    return next(doc for _, doc in documents() if doc["kind"] == kind)


@pytest.mark.parametrize(("name", "doc"), documents(), ids=[n for n, _ in documents()])
def test_manifest_is_valid(name, doc):
    validate(doc)


def test_the_expected_objects_are_there():
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Service", "ServiceMonitor"]
    )


def test_a_misspelt_field_is_rejected():
    ds = by_kind("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    spec["hostPid"] = spec.pop("hostPID")
    with pytest.raises(kubernetes_validate.ValidationError, match="hostPid"):
        validate(ds)


def test_a_misspelt_servicemonitor_field_is_rejected():
    sm = by_kind("ServiceMonitor")
    sm["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        validate(sm)


def test_daemonset_has_what_moptd_needs():
    spec = by_kind("DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    container = spec["containers"][0]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/kmsg"]]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"  # device nodes and NVML from the runtime
    # the node's name as the API server knows it, for explain's drain step (drain_fit.py)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "resources" not in container or "nvidia.com/gpu" not in str(container["resources"])


def test_the_objects_point_at_each_other():
    ds = by_kind("DaemonSet")
    service = by_kind("Service")
    monitor = by_kind("ServiceMonitor")
    template_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    assert service["spec"]["selector"].items() <= template_labels.items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    port_names = {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports
        assert service_ports[endpoint["port"]]["targetPort"] in port_names
    # The alert rules select job="moptd": the job label comes from jobLabel's value.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "moptd"
    config_name = next(
        v["configMap"]["name"]
        for v in ds["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    )
    assert by_kind("ConfigMap")["metadata"]["name"] == config_name


def test_the_configmap_is_a_valid_moptd_config():
    text = by_kind("ConfigMap")["data"]["moptd.yaml"]
    config = parse_config(text, "configmap:moptd.yaml", registry())
    assert config.exporter_listen == "0.0.0.0:9477"
    assert str(config.api_socket) == "/run/moptd/api.sock"


def test_manifests_are_only_yaml(tmp_path: Path):
    assert {p.suffix for p in DEPLOY.iterdir() if p.is_file()} <= {".yaml", ".md"}


def test_the_cli_accepts_the_manifests_strictly():
    """What an operator (and CI) runs: `kubernetes-validate --strict`, the command line,
    not only the library call above. The ServiceMonitor is a CRD the CLI has no schema
    for; its fields are checked by SERVICE_MONITOR_SCHEMA."""
    cli = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    cli = cli or shutil.which("kubernetes-validate")
    assert cli is not None, "kubernetes-validate is installed with the test extra"
    res = subprocess.run(
        [cli, "--strict", "-k", K8S_VERSION, str(DEPLOY / "moptd.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    passed = re.findall(r"passed for resource (\S+) against version", res.stdout + res.stderr)
    assert len(passed) == len([d for d in documents() if d[0].startswith("moptd.yaml")])


def test_the_namespace_admits_a_privileged_pod_and_says_so():
    labels = by_kind("Namespace")["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "privileged"
    assert by_kind("DaemonSet")["metadata"]["namespace"] == by_kind("Namespace")["metadata"]["name"]


def test_gpu_and_remediation_taints_do_not_evict_the_monitor():
    spec = by_kind("DaemonSet")["spec"]["template"]["spec"]
    tolerated = {t["key"]: t for t in spec["tolerations"]}
    for key in (
        "nvidia.com/gpu",
        # NVSentinel's fault-quarantine examples (docs/INTEGRATIONS.md)
        "nvidia.com/gpu-xid-error",
        "nvidia.com/gpu-nvlink-error",
        "nvidia.com/syslog-xid-error",
        "nvidia.com/gpu-error",
    ):
        assert tolerated[key]["operator"] == "Exists"
        assert "effect" not in tolerated[key]  # NoSchedule and NoExecute alike
    assert spec["priorityClassName"] == "system-node-critical"


def test_the_host_is_read_under_the_configured_host_root():
    spec = by_kind("DaemonSet")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    config = parse_config(by_kind("ConfigMap")["data"]["moptd.yaml"], "configmap", registry())
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    host = mounts[str(config.host_root)]
    assert host["readOnly"] is True
    assert host["mountPropagation"] == "HostToContainer"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[host["name"]]["hostPath"]["path"] == "/"
    assert config.procfs == config.host_root / "proc"
    # every other host path is read-only, but the state the kernel-log position lives in
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    assert sorted(writable) == ["/run/moptd", "/tmp", str(config.state_dir)]
    # root for /dev/kmsg; the image itself runs as its own user
    assert container["securityContext"]["runAsUser"] == 0


def test_the_liveness_probe_is_the_images_health_check():
    container = by_kind("DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    probe = container["livenessProbe"]["exec"]["command"]
    dockerfile = (REPO / "Dockerfile").read_text()
    (healthcheck,) = re.findall(r'^\s+CMD (\[".*"\])$', dockerfile, re.MULTILINE)
    image_probe = json.loads(healthcheck)
    assert probe[:2] == image_probe[:2]
    assert " ".join(probe[2].split()) == " ".join(image_probe[2].split())
