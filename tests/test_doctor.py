"""`moptd doctor` exit codes (0 healthy, 1 warnings, 2 critical) on this real host, with
the host collector pointed at a procfs tree built from captured files."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from moptd.cli.cmd_doctor import Check, can_rw, device_nodes_check, worst
from tests.conftest import FIXTURES

NO_SWAP = FIXTURES / "h200/meminfo"  # the H200 host: SwapTotal 0 kB
WITH_SWAP = FIXTURES / "meminfo/rhel6_2g_ram_1g_swap"  # SwapTotal 1048572 kB


def procfs_tree(tmp: Path, swappiness: str, meminfo: Path = NO_SWAP) -> Path:
    proc = tmp / "proc"
    (proc / "sys/vm").mkdir(parents=True)
    shutil.copy(meminfo, proc / "meminfo")
    shutil.copy("/proc/stat", proc / "stat")  # the real file: the collector needs one
    (proc / "sys/vm/swappiness").write_text(swappiness + "\n")
    return proc


def doctor(
    tmp: Path,
    swappiness: str = "1",
    serving: dict | None = None,
    meminfo: Path = NO_SWAP,
    procfs: Path | None = None,
):
    config = {
        "state_dir": str(tmp / "state"),
        "api": {"socket": str(tmp / "api.sock")},
        "paths": {"procfs": str(procfs or procfs_tree(tmp, swappiness, meminfo))},
        "host": {"watch_paths": [str(tmp)]},
        "collectors": {
            name: {"enabled": False}
            for name in ("nvml", "driver", "kernel", "container", "serving")
        },
    }
    config["collectors"]["host"] = {"enabled": True}
    if serving is not None:
        config["collectors"]["serving"] = {"enabled": True, "managed": serving}
    path = tmp / "moptd.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "doctor", "--json", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    body = json.loads(out.stdout) if out.stdout.startswith("{") else None
    return out.returncode, body, out


def test_healthy_host_exits_0(tmp_path):
    code, body, out = doctor(tmp_path, swappiness="1")
    assert code == 0, out.stdout + out.stderr
    assert body["status"] == "ok"
    names = {c["name"]: c["status"] for c in body["checks"]}
    assert names["collector host"] == "ok"
    assert names["vm.swappiness"] == "ok"
    assert names[f"disk space {tmp_path}"] in ("ok", "warning", "critical")


def test_high_swappiness_is_a_warning_exit_1(tmp_path):
    code, body, _ = doctor(tmp_path, swappiness="60", meminfo=WITH_SWAP)
    assert code == 1
    swap = next(c for c in body["checks"] if c["name"] == "vm.swappiness")
    assert swap["status"] == "warning"
    assert "60" in swap["detail"]


def test_swappiness_on_a_host_without_swap_is_no_warning(tmp_path):
    # The H200 host's meminfo: SwapTotal 0 kB. With no swap the kernel cannot swap anonymous
    # memory out, so the setting changes nothing there.
    code, body, out = doctor(tmp_path, swappiness="60", meminfo=NO_SWAP)
    assert code == 0, out.stdout + out.stderr
    swap = next(c for c in body["checks"] if c["name"] == "vm.swappiness")
    assert swap["status"] == "ok"
    assert "60" in swap["detail"]
    assert "no swap" in swap["detail"]
    assert swap["code"] == ""


def test_swappiness_check_on_the_real_proc(tmp_path):
    meminfo = Path("/proc/meminfo").read_text()
    swap_kb = int(next(ln.split()[1] for ln in meminfo.splitlines() if ln.startswith("SwapTotal:")))
    swappiness = int(Path("/proc/sys/vm/swappiness").read_text())
    _, body, out = doctor(tmp_path, procfs=Path("/proc"))
    swap = next(c for c in body["checks"] if c["name"] == "vm.swappiness")
    if swap_kb == 0:
        assert swap["status"] == "ok", out.stdout
        assert "no swap" in swap["detail"]
    else:
        assert swap["status"] == ("warning" if swappiness > 10 else "ok"), out.stdout
    assert str(swappiness) in swap["detail"]


def test_serving_port_taken_is_critical_exit_2(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        model = tmp_path / "model"
        model.mkdir()
        for name in ("config.json", "tokenizer.json", "model.safetensors"):
            (model / name).write_text("{}")
        code, body, out = doctor(
            tmp_path,
            serving={
                "name": "llm",
                "command": ["vllm", "serve", str(model)],
                "device": "cpu",
                "port": port,
                "model_dir": str(model),
            },
        )
    assert code == 2, out.stdout + out.stderr
    port_check = next(c for c in body["checks"] if c["name"] == "serving port")
    assert port_check["status"] == "critical"
    assert port_check["code"] == "PORT_CONFLICT"
    assert any(c["name"] == "serving tokenizer" and c["status"] == "ok" for c in body["checks"])


LISTENER = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)
"""


def _serving(tmp: Path, port: int) -> dict:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (model / name).write_text("{}")
    cmd = ["vllm", "serve", str(model)]
    return {"name": "llm", "command": cmd, "device": "cpu", "port": port,
            "model_dir": str(model)}


def test_the_port_held_by_moptds_own_running_server_is_no_conflict(tmp_path):
    """`moptd doctor` on a host where the daemon runs its managed server: the port is in
    use by that server (recorded in serving/NAME/managed.json when moptd started it, in
    its own session), as it should be. A real listener in its own session stands in for
    the engine; a record naming another process group leaves the conflict reported."""
    from moptd.serving.orphan import write_record

    server = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        record_dir = tmp_path / "state" / "serving" / "llm"
        record_dir.mkdir(parents=True)
        assert write_record(record_dir, server.pid) is not None
        proc = procfs_tree(tmp_path, "1")
        code, body, out = doctor(tmp_path, serving=_serving(tmp_path, port), procfs=proc)
        port_check = next(c for c in body["checks"] if c["name"] == "serving port")
        assert port_check["status"] == "ok", out.stdout + out.stderr
        assert f"pid {server.pid}" in port_check["detail"]
        assert "managed server moptd started" in port_check["detail"]
        # (the stand-in model's files fail the checklist: that is not what is checked here)
        assert not [c for c in body["checks"] if c["code"] == "PORT_CONFLICT"]
        # the record names the listener, but another process holds the port doctor checks
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            other = held.getsockname()[1]
            code, body, out = doctor(tmp_path, serving=_serving(tmp_path, other), procfs=proc)
        port_check = next(c for c in body["checks"] if c["name"] == "serving port")
        assert (port_check["status"], port_check["code"]) == ("critical", "PORT_CONFLICT")
        assert code == 2
    finally:
        server.kill()
        server.wait()
        assert server.stdout is not None
        server.stdout.close()


def test_missing_tokenizer_is_critical(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_text("{}")
    code, body, _ = doctor(
        tmp_path,
        serving={
            "name": "llm",
            "command": ["vllm", "serve", str(model)],
            "device": "cpu",
            "port": 1,
            "model_dir": str(model),
            "host": "127.0.0.1",
        },
    )
    assert code == 2
    tok = next(c for c in body["checks"] if c["name"] == "serving tokenizer")
    assert tok["code"] == "TOKENIZER_MISSING"


def test_bad_serving_configuration_is_critical_not_a_traceback(tmp_path):
    # the serving section is checked when the configuration loads: exit 2, file:line:key
    code, _, out = doctor(tmp_path, serving={"name": "llm", "command": 42})
    assert code == 2
    assert "Traceback" not in out.stderr
    assert "moptd.yaml:" in out.stderr
    assert "key 'collectors.serving.managed.command'" in out.stderr


def test_plain_checklist_output(tmp_path):
    doctor(tmp_path, swappiness="60", meminfo=WITH_SWAP)
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "doctor", "--config", str(tmp_path / "moptd.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "! vm.swappiness" in out.stdout
    assert "✓ collector host" in out.stdout
    assert "moptd doctor: warnings (exit 1)" in out.stdout


def test_device_nodes_missing(tmp_path):
    c = device_nodes_check(None, tmp_path)
    assert (c.status, c.code) == ("critical", "DEVICE_NODE_PROBLEM")
    assert "nvidiactl" in c.detail


def test_device_node_permissions(tmp_path):
    f = tmp_path / "node"
    f.write_text("")
    os.chmod(f, 0o660)
    st = f.stat()
    assert can_rw(st, 0, set())
    assert can_rw(st, st.st_uid, set())
    assert not can_rw(st, st.st_uid + 12345, set())
    assert can_rw(st, st.st_uid + 12345, {st.st_gid})
    os.chmod(f, 0o666)
    assert can_rw(f.stat(), st.st_uid + 12345, set())


def test_worst():
    assert worst([]) == "ok"
    assert worst([Check("a", "skipped")]) == "ok"
    assert worst([Check("a", "ok"), Check("b", "warning")]) == "warning"
    assert worst([Check("a", "critical"), Check("b", "warning")]) == "critical"
