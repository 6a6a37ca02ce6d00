"""Container collector: engines, the nvidia runtime, CDI specs against the driver, and
malformed files reported by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.collector import CollectorContext
from moptd.collectors.container import (
    ConfigError,
    ContainerCollector,
    parse_cdi_spec,
    parse_containerd_config,
    parse_daemon_json,
    parse_toolkit_version,
)

H200 = Path(__file__).parent / "fixtures/h200"

# The shape `nvidia-ctk cdi generate` writes (trimmed): libraries named with the driver version.
CDI_SPEC = """\
---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - create-symlinks
    - --link
    - libcuda.so.{v}::/usr/lib/x86_64-linux-gnu/libcuda.so.1
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{v}
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{v}
    options: [ro, nosuid, nodev, bind]
  - hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}
    containerPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}
    options: [ro, nosuid, nodev, bind]
"""

DAEMON_JSON = {
    "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    "default-runtime": "runc",
}

CONTAINERD_V2 = """\
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def test_daemon_json():
    assert parse_daemon_json(json.dumps(DAEMON_JSON), "d.json") is True
    assert parse_daemon_json('{"default-runtime": "nvidia"}', "d.json") is True
    assert parse_daemon_json('{"log-driver": "json-file"}', "d.json") is False
    assert parse_daemon_json("", "d.json") is False


def test_daemon_json_malformed_names_file_and_line():
    with pytest.raises(ConfigError, match=r"^/etc/docker/daemon\.json:3: not valid JSON"):
        parse_daemon_json('{\n  "runtimes": {\n  "nvidia": }\n}', "/etc/docker/daemon.json")
    with pytest.raises(ConfigError, match="key 'runtimes'"):
        parse_daemon_json('{"runtimes": []}', "d.json")


def test_containerd_config():
    # the runtime and CDI are two facts: CDI alone is no runtime (it needs a spec too)
    assert parse_containerd_config(CONTAINERD_V2, "c.toml").nvidia_runtime is True
    cdi_only = parse_containerd_config(
        'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\nenable_cdi = true\n', "c.toml"
    )
    assert (cdi_only.nvidia_runtime, cdi_only.cdi) == (False, True)
    empty = parse_containerd_config("version = 2\n", "c.toml")
    assert (empty.nvidia_runtime, empty.cdi) == (False, False)
    with pytest.raises(ConfigError, match=r"^c\.toml: not valid TOML"):
        parse_containerd_config("version = = 2", "c.toml")


def test_cdi_spec_driver_version():
    spec = parse_cdi_spec(CDI_SPEC.format(v="580.159.04"), "nvidia.yaml")
    assert (spec.kind, spec.driver_version) == ("nvidia.com/gpu", "580.159.04")
    as_json = json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": []})
    assert parse_cdi_spec(as_json, "x.json").driver_version == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cdiVersion: [0.5", "not valid YAML/JSON"),
        ("- a list", "expected a mapping"),
        ("kind: nvidia.com/gpu\n", "key 'cdiVersion'"),
        ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: {}\n", "key 'devices'"),
    ],
)
def test_cdi_spec_malformed_names_the_file(text, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_cdi_spec(text, "/etc/cdi/nvidia.yaml")
    assert str(info.value).startswith("/etc/cdi/nvidia.yaml")


def test_toolkit_version():
    assert (
        parse_toolkit_version("NVIDIA Container Toolkit CLI version 1.17.3\ncommit: 1a2b\n")
        == "1.17.3"
    )
    assert parse_toolkit_version("cli-version: 1.14.6\nlib-version: 1.14.6\n") == "1.14.6"
    assert parse_toolkit_version("nothing") == ""


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parsers_raise_only_config_errors(text):
    for parse in (parse_daemon_json, parse_containerd_config, parse_cdi_spec):
        message = "f"
        try:
            parse(text, "f")
        except ConfigError as exc:
            message = str(exc)
        assert message.startswith("f")
    parse_toolkit_version(text)


def _setup(tmp_path: Path, spec_version: str, daemon_json: str) -> CollectorContext:
    etc_cdi, run_cdi, bin_dir, proc = (tmp_path / d for d in ("etc-cdi", "run-cdi", "bin", "proc"))
    for d in (etc_cdi, run_cdi, bin_dir, proc / "driver/nvidia"):
        d.mkdir(parents=True)
    shutil.copy(H200 / "proc_driver_nvidia_version", proc / "driver/nvidia/version")
    (etc_cdi / "nvidia.yaml").write_text(CDI_SPEC.format(v=spec_version))
    (run_cdi / "broken.json").write_text('{"cdiVersion": ')
    (run_cdi / "notes.txt").write_text("not a spec")
    (tmp_path / "daemon.json").write_text(daemon_json)
    dockerd = bin_dir / "dockerd"
    dockerd.write_text("#!/bin/sh\nexit 0\n")
    ctk = bin_dir / "nvidia-ctk"
    ctk.write_text(
        "#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.3'\necho 'commit: x'\n"
    )
    for exe in (dockerd, ctk):
        exe.chmod(0o755)
    return CollectorContext(
        options={
            "docker_daemon_json": str(tmp_path / "daemon.json"),
            "containerd_config": str(tmp_path / "no-containerd.toml"),
            "cdi_dirs": [str(etc_cdi), str(run_cdi)],
            "docker_socket": str(tmp_path / "no-docker.sock"),
            "containerd_socket": str(tmp_path / "no-containerd.sock"),
            "podman_socket": str(tmp_path / "no-podman.sock"),
            "crio_socket": str(tmp_path / "no-crio.sock"),
            "crio_config": str(tmp_path / "no-crio.conf"),
            "crio_config_dir": str(tmp_path / "no-crio.conf.d"),
            "search_path": str(bin_dir),
        },
        procfs=proc,
    )


def _by(batch, signal):
    return {s.labels: s.value for s in batch.samples if s.signal == signal}


async def test_stale_cdi_spec_after_a_driver_upgrade(tmp_path, caplog):
    ctx = _setup(tmp_path, "570.86.15", json.dumps(DAEMON_JSON))
    collector = ContainerCollector(ctx)
    try:
        batch = await collector.collect()
    finally:
        await collector.stop()
    spec = str(tmp_path / "etc-cdi/nvidia.yaml")
    broken = str(tmp_path / "run-cdi/broken.json")
    # a dockerd binary with no daemon answering on the socket is no engine, and says so
    assert _by(batch, "container.engine_present") == {
        (("engine", "docker"),): 0.0,
        (("engine", "containerd"),): 0.0,
        (("engine", "podman"),): 0.0,
        (("engine", "crio"),): 0.0,
    }
    (status,) = _by(batch, "container.engine_status").values()
    assert status == (
        f"no daemon answers: no dockerd runs and nothing listens at {tmp_path}/no-docker.sock"
        " (a CLI or a socket file alone is no engine)"
    )
    assert _by(batch, "container.nvidia_runtime_configured") == {
        (("engine", "docker"),): 1.0,
        (("engine", "containerd"),): 0.0,
    }
    assert _by(batch, "container.cdi_spec_driver_match") == {(("file", spec),): 0.0}
    assert (
        _by(batch, "container.cdi_spec")[
            (("driver_version", "570.86.15"), ("file", spec), ("kind", "nvidia.com/gpu"))
        ]
        == 1.0
    )
    valid = _by(batch, "container.config_valid")
    assert valid[(("file", broken),)] == 0.0
    assert valid[(("file", spec),)] == 1.0
    error = _by(batch, "container.config_error")[(("file", broken),)]
    assert isinstance(error, str)
    assert error.startswith(broken)
    assert broken in caplog.text
    assert _by(batch, "container.toolkit_version") == {(("version", "1.17.3"),): 1.0}


async def test_current_cdi_spec_and_malformed_daemon_json(tmp_path):
    ctx = _setup(tmp_path, "580.159.04", '{"runtimes": {"nvidia": ')
    collector = ContainerCollector(ctx)
    try:
        batch = await collector.collect()
    finally:
        await collector.stop()
    spec = str(tmp_path / "etc-cdi/nvidia.yaml")
    daemon = str(tmp_path / "daemon.json")
    assert _by(batch, "container.cdi_spec_driver_match") == {(("file", spec),): 1.0}
    assert _by(batch, "container.config_valid")[(("file", daemon),)] == 0.0
    message = _by(batch, "container.config_error")[(("file", daemon),)]
    assert isinstance(message, str)
    assert message.startswith(f"{daemon}:1: not valid JSON")
    # a malformed daemon.json is no verdict on the runtime
    assert (("engine", "docker"),) not in _by(batch, "container.nvidia_runtime_configured")
