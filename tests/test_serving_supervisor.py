"""The managed serving process with real child processes (sh, python): failures, back-off,
crash loops, log floods, stopping a whole process group, the gates, and the systemd
backend's command lines."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moptd.observations import Batch, Event
from moptd.serving import gates
from moptd.serving.spec import SpecError, parse_endpoints, parse_managed
from moptd.serving.supervisor import Supervisor, backoff_delay
from moptd.serving.systemd import (
    SystemdSupervisor,
    journal_argv,
    parse_show,
    render_env_file,
    systemctl_argv,
)

M = "collectors.serving.managed"
E = "collectors.serving.endpoints[0]"


def spec(command: list[str], **extra: object):  # type: ignore[no-untyped-def]
    raw: dict[str, object] = {
        "name": "t",
        "command": command,
        "device": "cpu",
        "port": _free_port(),
        "backoff_initial": 0.05,
        "backoff_max": 0.2,
        "stop_grace": 1,
        "crash_loop_count": 3,
        "crash_loop_window": 60,
        "log_lines": 100,
    }
    raw.update(extra)
    m = parse_managed(raw)
    assert m is not None
    return m


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(cond, limit: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            pytest.fail("condition not met in time")
        await asyncio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.slow
async def test_command_that_does_not_exist_backs_off_into_a_crash_loop(tmp_path: Path) -> None:
    events: list[Event] = []
    sup = Supervisor(spec(["/nonexistent/vllm", "serve"]), events.extend, tmp_path)
    await sup.start()
    try:
        await until(lambda: sup.state == "crash_loop")
        exits = [e for e in events if e.stream == "serving.process_exit"]
        assert len(exits) == 3
        assert all(e.fields["expected"] is False for e in exits)
        assert "cannot start /nonexistent/vllm" in exits[0].text
        assert sup.restarts == 2
        b = Batch()
        sup.fill(b, time.time())
        values = {s.signal: s.value for s in b.samples}
        assert values["serving.crash_loop"] == 1.0
        assert values["serving.process_up"] == 0.0
    finally:
        await sup.stop()
        sup.close()


@pytest.mark.slow
async def test_exit_status_zero_unasked_is_a_failure_and_restart_clears_the_loop(
    tmp_path: Path,
) -> None:
    events: list[Event] = []
    sup = Supervisor(spec(["sh", "-c", "echo started; exit 0"]), events.extend, tmp_path)
    await sup.start()
    try:
        await until(lambda: sup.state == "crash_loop")
        exits = [e for e in events if e.stream == "serving.process_exit"]
        assert [e.fields["exit_code"] for e in exits] == [0, 0, 0]
        assert not any(e.fields["expected"] for e in exits)
        assert (tmp_path / "log.txt").read_text().count("started") == 3
        await sup.restart()  # the operator's restart clears the crash loop: it runs again
        await until(lambda: (tmp_path / "log.txt").read_text().count("started") == 4)
    finally:
        await sup.stop()
        sup.close()


@pytest.mark.slow
async def test_log_flood_stays_bounded(tmp_path: Path) -> None:
    flood = (
        "import sys\n"
        "for i in range(20000): sys.stdout.write(f'line {i}\\n')\n"
        "sys.stdout.write('x' * 1000000 + '\\n')\n"
        "sys.stdout.flush()\n"
        "import time; time.sleep(30)\n"
    )
    sup = Supervisor(spec([sys.executable, "-c", flood]), lambda e: None, tmp_path)
    await sup.start()
    try:
        await until(lambda: sup.ring.total >= 20001)
        assert len(sup.ring) == 100
        assert sup.ring.dropped >= 19901
        assert all(len(line) <= 16384 for _, line in sup.ring)
    finally:
        await sup.stop()
        sup.close()


@pytest.mark.slow
async def test_stop_kills_the_whole_group_after_the_grace_period(tmp_path: Path) -> None:
    script = "trap '' TERM; sleep 300 & echo child $!; while true; do sleep 0.1; done"
    events: list[Event] = []
    sup = Supervisor(spec(["sh", "-c", script]), events.extend, tmp_path)
    await sup.start()
    await until(lambda: any(line.startswith("child ") for _, line in sup.ring))
    child = int(next(line for _, line in sup.ring if line.startswith("child ")).split()[1])
    leader = sup.pid
    assert leader is not None
    assert _alive(child)
    t0 = time.monotonic()
    await sup.stop()
    sup.close()
    assert time.monotonic() - t0 >= 0.9  # waited the grace period, then SIGKILL
    assert not _alive(leader)
    assert not _alive(child)
    # the exit is published by the process watcher, which may run just after stop() returns
    await until(lambda: any(e.stream == "serving.process_exit" for e in events))
    exit_ev = [e for e in events if e.stream == "serving.process_exit"][-1]
    assert exit_ev.fields["expected"] is True


@pytest.mark.slow
async def test_engine_dead_lines_while_stopping_are_not_reported(tmp_path: Path) -> None:
    script = (
        "trap 'echo \"vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
        "issue.\"; exit 0' TERM; echo ready; while true; do sleep 0.1; done"
    )
    events: list[Event] = []
    sup = Supervisor(spec(["sh", "-c", script]), events.extend, tmp_path)
    await sup.start()
    await until(lambda: any(line == "ready" for _, line in sup.ring))
    await sup.stop()
    sup.close()
    assert any("EngineDeadError" in line for _, line in sup.ring)
    assert not [e for e in events if e.stream == "serving.engine_dead"]


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_delay(n, 2, 30) for n in range(7)] == [0, 2, 4, 8, 16, 30, 30]


# --- gates -------------------------------------------------------------------------------


def test_port_gate_sees_a_listener() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = gates.check_port("127.0.0.1", port)
        assert (r.ok, r.code) == (False, "PORT_CONFLICT")
        assert str(port) in r.reason
    assert gates.check_port("127.0.0.1", port).ok


def test_model_dir_gates(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "pytorch_model.bin").write_bytes(b"\0")
    (d / "training_args.bin").write_bytes(b"\0")
    results = {r.check: r for r in gates.check_model_dir(d)}
    assert results["model_config"].ok
    assert results["weights"].ok
    assert results["tokenizer"].code == "TOKENIZER_MISSING"
    files = gates.scan_model_dir(d)
    assert files.unsafe_only
    (d / "tokenizer.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\0")
    assert all(r.ok for r in gates.check_model_dir(d))
    assert not gates.scan_model_dir(d).unsafe_only
    missing = gates.check_model_dir(tmp_path / "absent")
    assert not missing[0].ok
    assert "does not exist" in missing[0].reason


@pytest.mark.slow
async def test_gated_start_publishes_the_reason_and_starts_nothing(tmp_path: Path) -> None:
    events: list[Event] = []
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0")
    marker = tmp_path / "ran"
    sup = Supervisor(
        spec(["sh", "-c", f"touch {marker}"], model_dir=str(model)), events.extend, tmp_path
    )
    await sup.start()
    try:
        await until(lambda: any(e.stream == "serving.gate" for e in events))
        gate = next(e for e in events if e.stream == "serving.gate")
        assert gate.fields["code"] == "TOKENIZER_MISSING"
        assert sup.state == "gated"
        await asyncio.sleep(0.3)
        assert not marker.exists()
    finally:
        await sup.stop()
        sup.close()


# --- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"name": "x"}, M + ".command"),
        ({"name": "x", "command": "vllm serve m", "port": "80"}, M + ".port"),
        (
            {"name": "x", "command": ["a"], "restart": "sometimes"},
            M + ".restart",
        ),
        ({"name": "x y", "command": ["a"]}, M + ".name"),
        (
            {"name": "x", "command": ["a"], "stop_grace": "soon"},
            M + ".stop_grace",
        ),
        ({"name": "x", "command": ["a"], "colour": 1}, M + ".colour"),
    ],
)
def test_managed_config_errors_name_the_key(raw: dict[str, object], key: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_managed(raw)
    assert err.value.key == key


def test_endpoint_config() -> None:
    eps = parse_endpoints([{"name": "a", "url": "http://h:1/", "engine": "trtllm"}])
    assert eps[0].url == "http://h:1"
    assert eps[0].metrics_path == "/prometheus/metrics"
    for bad, key in (
        ([{"name": "a"}], E + ".url"),
        ([{"name": "a", "url": "ftp://x"}], E + ".url"),
        (
            [{"name": "a", "url": "http://x", "engine": "tgi"}],
            E + ".engine",
        ),
        (
            [{"name": "a", "url": "http://x", "probes": ["ping"]}],
            E + ".probes",
        ),
        ("x", "collectors.serving.endpoints"),
    ):
        with pytest.raises(SpecError) as err:
            parse_endpoints(bad)
        assert err.value.key == key


# --- systemd backend --------------------------------------------------------------------


def test_systemctl_and_journal_argv() -> None:
    assert systemctl_argv("start", "llama") == [
        "systemctl",
        "start",
        "--no-block",
        "moptd-serving@llama.service",
    ]
    assert systemctl_argv("stop", "llama") == ["systemctl", "stop", "moptd-serving@llama.service"]
    assert systemctl_argv("show", "llama")[:3] == [
        "systemctl",
        "show",
        "moptd-serving@llama.service",
    ]
    assert journal_argv("llama") == [
        "journalctl",
        "--unit",
        "moptd-serving@llama.service",
        "--output",
        "cat",
        "--no-pager",
        "--lines",
        "0",
        "--follow",
    ]
    with pytest.raises(ValueError, match="unknown"):
        systemctl_argv("enable", "llama")


def test_env_file_and_show_parsing() -> None:
    m = spec(["vllm", "serve", "/srv/m", "--port", "8000"], env={"CUDA_VISIBLE_DEVICES": "0,1"})
    text = render_env_file(m)
    assert "SERVING_CMD=vllm serve /srv/m --port 8000\n" in text
    assert "CUDA_VISIBLE_DEVICES=0,1\n" in text
    with pytest.raises(ValueError, match="blanks"):
        render_env_file(spec(["vllm", "serve", "/srv/my model"]))
    show = parse_show("ActiveState=active\nMainPID=4242\nNRestarts=3\nResult=success\n")
    assert show == {
        "ActiveState": "active",
        "MainPID": "4242",
        "NRestarts": "3",
        "Result": "success",
    }


async def test_systemd_supervisor_runs_systemctl(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = "ActiveState=failed\nMainPID=0\nNRestarts=5\nResult=start-limit-hit\n"
        return subprocess.CompletedProcess(argv, 0, out if argv[1] == "show" else "", "")

    events: list[Event] = []
    m = spec(["vllm", "serve", "/srv/m"], backend="systemd")
    sup = SystemdSupervisor(m, events.extend, env_dir=tmp_path, gates=lambda _: [], run=run)
    sup._follow_journal = _no_journal  # type: ignore[method-assign]
    await sup.start()
    # first `systemctl show`: a unit that already runs is adopted, not started again
    assert calls[0][:3] == ["systemctl", "show", "moptd-serving@t.service"]
    assert calls[1] == ["systemctl", "start", "--no-block", "moptd-serving@t.service"]
    assert (tmp_path / "t.env").read_text().startswith("# written by moptd")
    await sup.refresh()
    b = Batch()
    sup.fill(b, time.time())
    values = {s.signal: s.value for s in b.samples}
    assert values["serving.crash_loop"] == 1.0
    assert values["serving.restarts"] == 5.0
    assert values["serving.process_up"] == 0.0
    await sup.restart()
    assert calls[-2:] == [
        ["systemctl", "reset-failed", "moptd-serving@t.service"],
        ["systemctl", "restart", "--no-block", "moptd-serving@t.service"],
    ]
    await sup.stop()
    sup.close()
    assert os.getpid() > 0


async def _no_journal(*_since: float) -> None:
    return None


async def test_the_daemon_runs_it_and_the_collector_only_watches(tmp_path: Path) -> None:
    """ManagedProcess (the daemon's) runs a child that prints a real vLLM start-up log; the
    serving collector reports it through its view, and stopping the collector leaves the
    child running: only the daemon stops it."""
    from moptd.collector import CollectorContext
    from moptd.collectors.serving import ServingCollector
    from moptd.daemon.managed import ManagedProcess
    from tests.conftest import FIXTURES

    log = FIXTURES / "vllm-cpu" / "vllm_cpu_server_log.txt"
    raw = {"name": "t", "command": ["sh", "-c", f"cat {log}; exec sleep 60"], "device": "cpu"}
    events: list[Event] = []
    m = parse_managed({**raw, "port": _free_port()})
    assert m is not None
    managed = ManagedProcess(m, events.extend, tmp_path)
    ctx = CollectorContext(options={"managed": raw | {"port": m.port}}, state_dir=tmp_path)
    c = ServingCollector(ctx)
    c.watch_managed(managed.view)
    await managed.start()
    await c.start()
    try:
        sup = managed.supervisor
        await until(lambda: sup.pid is not None and sup.log_state.version == "0.32.0")
        pid = sup.pid
        assert pid is not None
        b = await c.collect()
        s = "serving:t"

        def one(signal: str) -> float:
            (v,) = [x.value for x in b.samples if (x.signal, x.subject) == (signal, s)]
            return v

        assert one("serving.process_up") == 1.0
        assert one("serving.restarts") == 0.0
        assert one("serving.up") == 0.0  # nothing listens: the child only printed a log
        assert b.attrs[s]["managed"] == "process"
        assert b.attrs[s]["pid"] == str(pid)
        (info,) = [x for x in b.samples if x.signal == "serving.info"]
        assert dict(info.labels)["version"] == "0.32.0"
        await c.stop()
        assert _alive(pid), "stopping the collector stopped the managed process"
    finally:
        await managed.stop()
    assert not _alive(pid)
    assert [e.fields["expected"] for e in events if e.stream == "serving.process_exit"] == [True]
