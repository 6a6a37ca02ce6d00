"""The systemd backend of the managed server: where the env file lives, refusals that
show, adopting a unit that already runs, the journal follow, the port held by the unit."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.daemon.socket_group import give_to_group
from moptd.observations import Event
from moptd.proc.info import parse_cgroup
from moptd.proc.listeners import port_held_by_unit
from moptd.serving import systemd as backend
from moptd.serving.spec import parse_managed

from .conftest import FIXTURES, REPO

CAPTURES = FIXTURES / "systemd-nspawn"
UNIT = "moptd-serving@demo.service"


def managed():  # type: ignore[no-untyped-def]
    m = parse_managed(
        {"name": "demo", "backend": "systemd", "device": "cpu", "command": ["sh", "x"]}
    )
    assert m is not None
    return m


def unit_setting(unit: str, key: str) -> list[str]:
    text = (REPO / "systemd" / unit).read_text()
    return re.findall(rf"^{key}=(.*)$", text, re.M)


def test_the_env_file_is_where_moptd_may_write_and_the_unit_reads() -> None:
    # moptd.service has ProtectSystem=strict: only its StateDirectory (and ReadWritePaths)
    # are writable, so the env file must live there, and the template must read it there.
    (state,) = unit_setting("moptd.service", "StateDirectory")
    writable = [Path("/var/lib") / state] + [
        Path(p) for line in unit_setting("moptd.service", "ReadWritePaths") for p in line.split()
    ]
    assert any(backend.ENV_DIR.is_relative_to(w) for w in writable), backend.ENV_DIR
    (env_file,) = unit_setting("moptd-serving@.service", "EnvironmentFile")
    assert env_file == str(backend.ENV_DIR / "%i.env")


class Systemctl:
    """systemctl as the supervisor calls it: answers `show` with the given properties."""

    def __init__(self, show: str, start_rc: int = 0, start_err: str = "") -> None:
        self.show, self.start_rc, self.start_err = show, start_rc, start_err
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if argv[:2] == ["systemctl", "show"]:
            return subprocess.CompletedProcess(argv, 0, self.show, "")
        if argv[:2] == ["systemctl", "start"]:
            return subprocess.CompletedProcess(argv, self.start_rc, "", self.start_err)
        return subprocess.CompletedProcess(argv, 0, "", "")


INACTIVE = "ActiveState=inactive\nMainPID=0\nResult=success\nExecMainStartTimestamp=\n"


async def test_an_unwritable_env_dir_is_a_refusal_not_a_silent_stop(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    run = Systemctl(INACTIVE)
    events: list[Event] = []
    sup = backend.SystemdSupervisor(
        managed(), events.extend, env_dir=blocker / "serving", gates=lambda _: [], run=run
    )
    await sup.start()
    assert sup.state == "gated"
    assert str(blocker / "serving" / "demo.env") in sup.reason
    assert [(e.stream, e.fields["check"]) for e in events] == [("serving.gate", "env_file")]
    assert not any(c[:2] == ["systemctl", "start"] for c in run.calls)
    await sup.refresh()  # the inactive unit does not hide the reason
    assert sup.state == "gated"
    sup.close()


async def test_a_failed_systemctl_start_is_a_refusal(tmp_path: Path) -> None:
    run = Systemctl(INACTIVE, 1, "Failed to start moptd-serving@demo.service: Access denied")
    events: list[Event] = []
    sup = backend.SystemdSupervisor(
        managed(), events.extend, env_dir=tmp_path, gates=lambda _: [], run=run
    )
    await sup.start()
    assert sup.state == "gated"
    assert "Access denied" in sup.reason
    assert [e.fields["check"] for e in events] == ["systemctl"]
    sup.close()


async def test_a_running_unit_is_adopted_without_gates_or_start(tmp_path: Path) -> None:
    show = "ActiveState=active\nMainPID=77\nResult=success\nExecMainStartTimestamp=@1796190620\n"
    run = Systemctl(show)
    gated: list[object] = []
    followed: list[float] = []

    async def follow(since: float) -> None:
        followed.append(since)

    sup = backend.SystemdSupervisor(
        managed(), lambda _: None, env_dir=tmp_path, gates=gated.append, run=run
    )
    sup._follow_journal = follow  # type: ignore[method-assign]
    await sup.start()
    assert gated == []  # the port and GPU memory are the running server's own
    assert [c[1] for c in run.calls] == ["show"]
    assert (sup.state, sup.pid, followed) == ("running", 77, [1796190620.0])
    sup.close()


def test_follow_argv_starts_at_since_with_the_boot_and_times() -> None:
    argv = backend.follow_argv("demo", 1796190620.0, "8e035c9fb1d94401bbd1149bd4fdc7be")
    assert argv[:4] == ["journalctl", "--unit", UNIT, "--boot=8e035c9fb1d94401bbd1149bd4fdc7be"]
    assert argv[argv.index("--since") + 1] == "@1796190620.000000"
    assert "--lines" not in argv
    assert argv[-1] == "--follow"
    assert argv[argv.index("--output") + 1] == "short-unix"


def test_short_unix_lines_of_a_real_journal() -> None:
    lines = (CAPTURES / "journal_short_unix.txt").read_text().splitlines()
    parsed = [backend.split_short_unix(line) for line in lines]
    assert all(p is not None for p in parsed)
    first = parsed[0]
    assert first == (
        1796190620.439931,
        "Starting moptd-serving@demo.service - moptd-managed model server demo...",
    )
    log = (FIXTURES / "vllm-cpu" / "vllm_cpu_server_log.txt").read_text().splitlines()
    # journald keeps each stdout line; short output drops the trailing blanks
    assert [p[1] for p in parsed[2:] if p] == [x.rstrip() for x in log[: len(parsed) - 2]]
    assert backend.split_short_unix("-- No entries --") is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_split_short_unix_takes_any_text(line: str) -> None:
    out = backend.split_short_unix(line)
    assert out is None or (isinstance(out[0], float) and out[1] in line)


def test_newest_boot_id_from_a_real_entry() -> None:
    text = (CAPTURES / "journal_newest.json").read_text()
    assert backend.newest_boot_id(text) == "8e035c9fb1d94401bbd1149bd4fdc7be"
    assert backend.newest_boot_id("") is None
    assert backend.newest_boot_id('{"_BOOT_ID": "../../etc"}') is None


@given(st.text(max_size=200))
def test_newest_boot_id_takes_any_text(text: str) -> None:
    backend.newest_boot_id(text)


def test_start_time_of_show() -> None:
    assert backend.start_time({"ExecMainStartTimestamp": "@1796190620"}) == 1796190620.0
    assert backend.start_time({"ExecMainStartTimestamp": ""}) is None
    assert backend.start_time({"ExecMainStartTimestamp": "@nan"}) is None


def test_the_unit_of_a_real_serving_process_cgroup() -> None:
    text = (CAPTURES / "serving_unit_cgroup.txt").read_text()
    assert parse_cgroup(text).unit == UNIT


@pytest.fixture
def listener():  # type: ignore[no-untyped-def]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen();"
            "print(s.getsockname()[1], flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    port = int(holder.stdout.readline())
    yield holder, port
    holder.kill()
    holder.wait()
    holder.stdout.close()


def proc_copy(root: Path, pid: int, cgroup: str) -> None:
    """A procfs root with this host's real /proc/net/tcp and the listener's own files,
    its cgroup replaced by the captured one of a real moptd-serving@demo process."""
    (root / "net").mkdir(parents=True)
    for name in ("tcp", "tcp6"):
        shutil.copy(f"/proc/net/{name}", root / "net" / name)
    d = root / str(pid)
    d.mkdir()
    for name in ("comm", "cmdline", "status"):
        (d / name).write_bytes(Path(f"/proc/{pid}/{name}").read_bytes())
    (d / "cgroup").write_text(cgroup)
    (d / "fd").mkdir()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        os.symlink(os.readlink(f"/proc/{pid}/fd/{fd}"), d / "fd" / fd)


def test_a_port_held_by_the_managed_unit_is_its_own(tmp_path: Path, listener) -> None:  # type: ignore[no-untyped-def]
    holder, port = listener
    proc_copy(tmp_path, holder.pid, (CAPTURES / "serving_unit_cgroup.txt").read_text())
    assert port_held_by_unit(port, UNIT, tmp_path)
    assert not port_held_by_unit(port, "moptd-serving@other.service", tmp_path)
    assert not port_held_by_unit(port, "", tmp_path)
    # the descriptors unreadable (moptd is not root): the socket's owner uid decides
    shutil.rmtree(tmp_path / str(holder.pid) / "fd")
    assert port_held_by_unit(port, UNIT, tmp_path)
    assert not port_held_by_unit(port, "moptd-serving@other.service", tmp_path)


def test_a_port_nobody_listens_on_is_not_the_units() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening
        assert not port_held_by_unit(port, UNIT)


def test_the_socket_goes_to_a_group_this_process_is_in(tmp_path: Path) -> None:
    path = tmp_path / "api.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        import grp

        group = grp.getgrgid(os.getgid()).gr_name
        assert give_to_group(path, group) is None
        assert "no such group" in (give_to_group(path, "no-such-group-moptd") or "")


def test_root_reads_every_journal() -> None:
    if os.geteuid() != 0:
        pytest.skip("the unprivileged case is tested in tests/test_nspawn_systemd.py")
    assert backend.journal_access_problem() == ""
