"""Container engines asked, not guessed: a daemon that answers on its socket counts, a CLI
alone does not; containerd's config with its imports and CRI-O's drop-ins are read as the
engines read them. The configs are those nvidia-ctk and NVIDIA's docs write
(tests/fixtures/container-paste/SOURCE.md); the dockerd test runs Debian's real dockerd."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.cli import render
from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors import registry
from moptd.collectors.container import ContainerCollector
from moptd.collectors.container_config import (
    ConfigError,
    parse_engine_info,
    read_containerd_config,
    read_crio_config,
)
from moptd.config import ConfigError as ConfigFileError
from moptd.config import parse_config
from moptd.daemon.views import container_view
from moptd.diagnose.engine import evaluate
from moptd.diagnose.loader import load_rules
from moptd.observations import Batch
from moptd.proc import engine_socket
from moptd.store import SignalStore
from tests.conftest import require_tool

PASTE = Path(__file__).parent / "fixtures/container-paste"
H200 = Path(__file__).parent / "fixtures/h200"
RULES = Path(__file__).parent.parent / "rules/container/container.rules.yaml"


def _ctx(
    tmp_path: Path, etc: Path, procfs: Path | None = None, **options: object
) -> CollectorContext:
    """A context reading /etc from ``etc``, with no engine socket and no tools. /proc is a
    tree of an H200 host's driver version and nothing else (no process runs there) unless
    ``procfs`` is given (the real one, where a daemon a test started runs)."""
    proc = tmp_path / "proc"
    (proc / "driver/nvidia").mkdir(parents=True, exist_ok=True)
    shutil.copy(H200 / "proc_driver_nvidia_version", proc / "driver/nvidia/version")
    proc = procfs or proc
    (tmp_path / "bin").mkdir(exist_ok=True)
    base: dict[str, object] = {
        "cdi_dirs": [str(tmp_path / "no-cdi")],
        "docker_socket": str(tmp_path / "no-docker.sock"),
        "containerd_socket": str(tmp_path / "no-containerd.sock"),
        "podman_socket": str(tmp_path / "no-podman.sock"),
        "crio_socket": str(tmp_path / "no-crio.sock"),
        "docker_daemon_json": str(tmp_path / "no-daemon.json"),
        "engine_timeout": 2.0,
        "search_path": str(tmp_path / "bin"),
        "use_tools": False,
    }
    base.update(options)
    return CollectorContext(options=base, procfs=proc, etc=etc)


async def _collect(ctx: CollectorContext) -> Batch:
    collector = ContainerCollector(ctx)
    try:
        return await collector.collect()
    finally:
        await collector.stop()


def _by(batch: Batch, signal: str) -> dict[str, object]:
    return {
        dict(s.labels).get("engine", dict(s.labels).get("file", "")): s.value
        for s in batch.samples
        if s.signal == signal
    }


def test_engine_timeout_is_checked_at_load_time():
    text = "collectors:\n  container:\n    engine_timeout: 100\n"
    with pytest.raises(
        ConfigFileError,
        match=r"moptd\.yaml:3: key 'collectors\.container\.engine_timeout': expected seconds",
    ):
        parse_config(text, "moptd.yaml", registry())
    parse_config("collectors:\n  container:\n    engine_timeout: 0.5\n", "moptd.yaml", registry())


# --- containerd: config.toml and its imports -------------------------------------------


@pytest.mark.parametrize(
    ("case", "nvidia", "cdi", "files"),
    [
        # nvidia-ctk --cdi.enabled on containerd 1.x (config v2): the drop-in sets both
        ("containerd-v2-cdi", 1.0, 1.0, 2),
        # the drop-in names the runtime; config v2 leaves CDI off by default
        ("containerd-v2-dropin", 1.0, 0.0, 2),
        ("containerd-v2-not-imported", 0.0, 0.0, 1),
        # containerd 2.x (config v3): CDI on unless enable_cdi = false
        ("containerd-v3-dropin", 1.0, 1.0, 2),
        # the drop-in is on disk but config.toml does not import it: containerd never
        # reads it (gpu-operator#1679), so the runtime is not configured
        ("containerd-v3-not-imported", 0.0, 1.0, 1),
    ],
)
async def test_containerd_config_with_its_imports(tmp_path, case, nvidia, cdi, files):
    batch = await _collect(_ctx(tmp_path, PASTE / case / "etc"))
    assert _by(batch, "container.nvidia_runtime_configured")["containerd"] == nvidia
    assert _by(batch, "container.cdi_enabled")["containerd"] == cdi
    valid = {k: v for k, v in _by(batch, "container.config_valid").items() if "containerd" in k}
    expected = {"/etc/containerd/config.toml": 1.0}
    if files == 2:
        expected["/etc/containerd/conf.d/99-nvidia.toml"] = 1.0
    assert valid == expected


@pytest.mark.parametrize(
    "case",
    ["containerd-v2-cdi", "containerd-v2-dropin", "containerd-v2-not-imported"],
)
def test_the_real_containerd_reads_the_imports_as_moptd_does(tmp_path, case):
    """`containerd config dump` (Debian's containerd; config v2, what 1.x reads) merges
    the same files and finds the nvidia runtime where moptd does. The fixture's import
    glob is pointed at the copy in tmp_path: containerd reads real paths."""
    containerd = require_tool("containerd")
    etc = tmp_path / "etc"
    shutil.copytree(PASTE / case / "etc", etc)
    main = etc / "containerd/config.toml"
    main.write_text(main.read_text().replace("/etc/containerd/conf.d", f"{etc}/containerd/conf.d"))
    out = subprocess.run(
        [containerd, "--config", str(main), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    dumped = tomllib.loads(out)
    runtimes = dumped["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    ours = read_containerd_config(
        str(main), lambda p: Path(p).read_text(), lambda p: sorted(glob.glob(p))
    )
    assert ("nvidia" in runtimes) == ours.nvidia_runtime
    # containerd lists the files it loaded from a Go map: the order is not the merge order
    assert sorted(ours.files) == sorted(dumped.get("imports", [str(main)]))


async def test_a_malformed_drop_in_is_named(tmp_path):
    etc = tmp_path / "etc"
    shutil.copytree(PASTE / "containerd-v3-dropin/etc", etc)
    (etc / "containerd/conf.d/50-broken.toml").write_text("[plugins\n")
    batch = await _collect(_ctx(tmp_path, etc))
    error = _by(batch, "container.config_error")["/etc/containerd/conf.d/50-broken.toml"]
    assert isinstance(error, str)
    assert error.startswith("/etc/containerd/conf.d/50-broken.toml: not valid TOML")
    assert _by(batch, "container.config_valid")["/etc/containerd/conf.d/50-broken.toml"] == 0.0
    # no verdict on the runtime from a configuration containerd itself would refuse
    assert "containerd" not in _by(batch, "container.nvidia_runtime_configured")


def _reader(files: dict[str, str]):
    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return files[path]

    return read


def test_imports_relative_to_the_file_cycles_and_missing_files():
    drop_in = (PASTE / "containerd-v3-dropin/etc/containerd/conf.d/99-nvidia.toml").read_text()
    files = {
        "/etc/containerd/config.toml": 'version = 3\nimports = ["conf.d/99-nvidia.toml"]\n',
        # an import of the importing file is read once (containerd keeps a loaded set)
        "/etc/containerd/conf.d/99-nvidia.toml": 'imports = ["../config.toml"]\n' + drop_in,
    }
    config = read_containerd_config("/etc/containerd/config.toml", _reader(files), lambda p: [])
    assert config.nvidia_runtime
    assert config.files == ("/etc/containerd/config.toml", "/etc/containerd/conf.d/99-nvidia.toml")
    files["/etc/containerd/config.toml"] = 'version = 3\nimports = ["/etc/containerd/gone.toml"]\n'
    with pytest.raises(ConfigError, match=r"^/etc/containerd/config\.toml: imports: "):
        read_containerd_config("/etc/containerd/config.toml", _reader(files), lambda p: [])
    files["/etc/containerd/config.toml"] = "version = 3\nimports = 7\n"
    with pytest.raises(ConfigError, match="key 'imports'"):
        read_containerd_config("/etc/containerd/config.toml", _reader(files), lambda p: [])


def test_imports_are_bounded():
    # each file imports the next one: past MAX_IMPORT_DEPTH it is an error, not a hang
    files = {f"/c/{i}.toml": f'version = 2\nimports = ["{i + 1}.toml"]\n' for i in range(200)}
    with pytest.raises(ConfigError, match="nested deeper"):
        read_containerd_config("/c/0.toml", _reader(files), lambda p: [])
    many = {"/c/main.toml": 'version = 2\nimports = ["/c/d/*.toml"]\n'}
    many.update({f"/c/d/{i:03}.toml": "" for i in range(100)})
    glob = lambda p: sorted(k for k in many if k.startswith("/c/d/"))  # noqa: E731
    with pytest.raises(ConfigError, match=r"^/c/main\.toml: imports: more than 64 files"):
        read_containerd_config("/c/main.toml", _reader(many), glob)


# --- CRI-O: crio.conf and crio.conf.d ---------------------------------------------------


@pytest.mark.parametrize(
    ("case", "nvidia", "files"),
    [
        # nvidia-ctk runtime configure --runtime=crio: crio.conf untouched, a drop-in
        ("crio-nvidia-ctk", 1.0, ["/etc/crio/crio.conf", "/etc/crio/crio.conf.d/99-nvidia.toml"]),
        ("crio-no-nvidia", 0.0, ["/etc/crio/crio.conf"]),
        # the k8s-device-plugin README's drop-in, without a crio.conf (CRI-O's defaults)
        ("crio-device-plugin-readme", 1.0, ["/etc/crio/crio.conf.d/99-nvidia.conf"]),
    ],
)
async def test_crio_config_and_drop_ins(tmp_path, case, nvidia, files):
    batch = await _collect(_ctx(tmp_path, PASTE / case / "etc"))
    assert _by(batch, "container.nvidia_runtime_configured")["crio"] == nvidia
    assert _by(batch, "container.cdi_enabled")["crio"] == 1.0  # CRI-O's default dirs
    valid = {k: v for k, v in _by(batch, "container.config_valid").items() if "crio" in k}
    assert valid == dict.fromkeys(files, 1.0)


async def test_no_crio_configuration_says_nothing_of_crio(tmp_path):
    batch = await _collect(_ctx(tmp_path, PASTE / "containerd-v2-cdi/etc"))
    assert "crio" not in _by(batch, "container.nvidia_runtime_configured")
    assert _by(batch, "container.engine_present")["crio"] == 0.0


def test_a_later_crio_drop_in_wins():
    base = (PASTE / "crio-nvidia-ctk/etc/crio/crio.conf").read_text()
    files = {
        "/etc/crio/crio.conf": base,
        "/etc/crio/crio.conf.d/10-dirs.conf": "[crio.runtime]\ncdi_spec_dirs = []\n",
    }
    config = read_crio_config(
        "/etc/crio/crio.conf", ["/etc/crio/crio.conf.d/10-dirs.conf"], _reader(files)
    )
    assert config is not None
    assert (config.nvidia_runtime, config.cdi) == (False, False)
    files["/etc/crio/crio.conf.d/10-dirs.conf"] = "[crio.runtime]\nruntimes = 3\n"
    with pytest.raises(ConfigError, match=r"^/etc/crio/crio\.conf\.d/10-dirs\.conf: key"):
        read_crio_config(
            "/etc/crio/crio.conf", ["/etc/crio/crio.conf.d/10-dirs.conf"], _reader(files)
        )


# --- docker / podman: GET /info ---------------------------------------------------------


def test_engine_info_runtimes_and_cdi():
    # the examples of moby's api/swagger.yaml SystemInfo (fixtures/container-paste)
    info = json.loads((PASTE / "docker-info-swagger-example.json").read_text())
    config = parse_engine_info(info, "/var/run/docker.sock", cdi_by_default=False)
    assert (config.nvidia_runtime, config.cdi) == (False, True)
    # "An empty list indicates that CDI device injection is disabled"
    config = parse_engine_info(info | {"CDISpecDirs": []}, "s", cdi_by_default=False)
    assert config.cdi is False
    # docker < 25 has no CDISpecDirs: no CDI; podman injects CDI devices natively
    del info["CDISpecDirs"]
    assert parse_engine_info(info, "s", cdi_by_default=False).cdi is False
    assert parse_engine_info(info, "s", cdi_by_default=True).cdi is True
    with pytest.raises(ConfigError, match=r"^/run/podman/podman\.sock: /info: key 'Runtimes'"):
        parse_engine_info({"Runtimes": []}, "/run/podman/podman.sock", cdi_by_default=True)


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_engine_info_raises_only_config_errors(data):
    for value in (data, {"Runtimes": data}, {"CDISpecDirs": data, "DefaultRuntime": data}):
        message = "s: /info"
        try:
            parse_engine_info(value, "s", cdi_by_default=False)
        except ConfigError as exc:
            message = str(exc)
        assert message.startswith("s: /info")


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300), st.lists(st.text(max_size=20), max_size=3))
def test_config_readers_raise_only_config_errors(text, imports):
    files = {"/etc/c.toml": text, "/etc/i.toml": "imports = " + json.dumps(imports) + "\n" + text}
    messages = []
    for main in ("/etc/c.toml", "/etc/i.toml"):
        try:
            read_containerd_config(main, _reader(files), lambda p: [])
        except ConfigError as exc:
            messages.append(str(exc))
        try:
            read_crio_config(main, ["/etc/i.toml"], _reader(files))
        except ConfigError as exc:
            messages.append(str(exc))
    assert all(m.startswith("/etc/") for m in messages)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_http_reply_parser_raises_only_unreachable(reply):
    message = "s:"
    try:
        engine_socket._body(reply, "s")
    except engine_socket.EngineUnreachable as exc:
        message = str(exc)
    assert message.startswith("s:")


# --- the socket client: bounded in time and size ----------------------------------------


@pytest.fixture
def unix_server(tmp_path: Path) -> Iterator[tuple[Path, list[bytes], list[socket.socket]]]:
    """A unix socket whose connections get the replies queued in the list (b"" for none:
    the server holds the connection open without a word, in the third list)."""
    path = Path(f"/tmp/h9-{os.getpid()}-{id(tmp_path)}.sock")  # AF_UNIX paths are short
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    replies: list[bytes] = []
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.recv(4096)
            reply = replies.pop(0) if replies else b""
            if reply:
                conn.sendall(reply)
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path, replies, held
    finally:
        server.close()
        for conn in held:
            conn.close()
        path.unlink(missing_ok=True)


def test_socket_client_bounds(unix_server, tmp_path):
    path, replies, _ = unix_server
    replies.append(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nOK")
    assert engine_socket.get(path, "/_ping", 2.0) == b"OK"
    replies.append(b"HTTP/1.1 500 Internal Server Error\r\n\r\n{}")
    with pytest.raises(engine_socket.EngineUnreachable, match="HTTP 500 Internal Server Error"):
        engine_socket.get(path, "/info", 2.0)
    replies.append(b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 5000)
    with pytest.raises(engine_socket.EngineUnreachable, match="reply over 1000 bytes"):
        engine_socket.get(path, "/info", 2.0, max_bytes=1000)
    replies.append(b"")  # a daemon that never answers: the deadline ends the wait
    started = time.monotonic()
    with pytest.raises(engine_socket.EngineUnreachable, match=r"no full reply in 0\.3s"):
        engine_socket.get(path, "/info", 0.3)
    assert time.monotonic() - started < 2.0
    with pytest.raises(engine_socket.EngineUnreachable, match="no such socket"):
        engine_socket.get(tmp_path / "absent.sock", "/_ping", 1.0)


def test_a_socket_file_with_no_daemon_refuses(tmp_path):
    path = Path(f"/tmp/h9-dead-{os.getpid()}.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # bound, never listening: what a crashed daemon leaves behind
    try:
        with pytest.raises(engine_socket.EngineUnreachable, match="connection refused"):
            engine_socket.accepts(path, 1.0)
    finally:
        dead.close()
        path.unlink()


def test_listening_by_proc_net_unix(tmp_path):
    # proc(5)'s example table: /dev/printer listens (Flags __SO_ACCEPTCON)
    table = PASTE / "proc-net-unix/proc5-example.txt"
    assert engine_socket.listening(table, "/dev/printer") is True
    assert engine_socket.listening(table, "/run/docker.sock") is False
    assert engine_socket.listening(tmp_path / "absent", "/dev/printer") is None
    # this kernel's own table, for a socket that listens and one that is only bound
    live, bound = (Path(f"/tmp/h9-{os.getpid()}-{n}.sock") for n in ("live", "bound"))
    a, b = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    try:
        a.bind(str(live))
        a.listen(1)
        b.bind(str(bound))
        assert engine_socket.listening(Path("/proc/net/unix"), str(live)) is True
        assert engine_socket.listening(Path("/proc/net/unix"), str(bound)) is False
    finally:
        a.close()
        b.close()
        live.unlink(missing_ok=True)
        bound.unlink(missing_ok=True)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=400), st.sampled_from(["/run/docker.sock", "/dev/printer", "x"]))
def test_proc_net_unix_reader_never_fails(text, path):
    with tempfile.NamedTemporaryFile("w", suffix=".unix") as fh:
        fh.write(text)
        fh.flush()
        assert engine_socket.listening(Path(fh.name), path) in (True, False)


def _listener_named(comm: str, path: Path, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A process whose /proc/PID/comm is ``comm`` (Python run through a link of that
    name), listening on a unix socket at ``path`` until killed."""
    link = tmp_path / comm
    link.symlink_to(sys.executable)
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.bind(sys.argv[1]); s.listen(8); print('up', flush=True)\n"
        "while True: time.sleep(1)\n"
    )
    proc = subprocess.Popen([str(link), "-c", code, str(path)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"
    return proc


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


async def test_a_socket_activated_service_is_not_started(tmp_path, unix_server):
    """A socket that listens with no dockerd running is systemd's (docker.socket):
    connecting would start docker. It is not asked; the engine counts on its files."""
    path, _, held = unix_server
    proc = tmp_path / "no-processes"
    proc.mkdir()
    (proc / "net").symlink_to("/proc/net")  # this kernel's socket table, no pid at all
    batch = await _collect(_ctx(tmp_path, tmp_path / "etc", proc, docker_socket=str(path)))
    assert _by(batch, "container.engine_present")["docker"] == 1.0
    assert str(_by(batch, "container.engine_status")["docker"]).startswith(
        f"a socket listens at {path} but no dockerd runs (socket activation): not asked"
    )
    assert held == []  # no connection was made


@pytest.fixture
def containerd_listener(tmp_path: Path) -> Iterator[Path]:
    path = Path(f"/tmp/h9-{os.getpid()}-ctd.sock")
    holder = _listener_named("containerd", path, tmp_path)
    try:
        yield path
    finally:
        _end(holder)
        path.unlink(missing_ok=True)


async def test_a_daemon_of_that_name_is_asked(tmp_path, containerd_listener):
    """A socket held by a process named containerd is asked (it accepts)."""
    path = containerd_listener
    ctx = _ctx(tmp_path, tmp_path / "etc", Path("/proc"), containerd_socket=str(path))
    batch = await _collect(ctx)
    assert _by(batch, "container.engine_present")["containerd"] == 1.0
    assert _by(batch, "container.engine_status")["containerd"] == f"answers at {path}"


_AS_NOBODY = """
import json, sys
from pathlib import Path
from moptd.collector import CollectorContext
from moptd.collectors.container import ContainerCollector
ctx = CollectorContext(options=json.loads(sys.argv[1]), procfs=Path(sys.argv[2]))
batch = ContainerCollector(ctx).read()
print(json.dumps([[s.signal, dict(s.labels).get("engine"), s.value] for s in batch.samples]))
"""


@pytest.fixture
def proc_of() -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    """A /proc in which only the processes put in the list run (links to their real
    /proc/PID) over this kernel's /proc/net, readable by nobody: whether "a dockerd runs"
    is the test's to say, not whatever this host runs (CI's docker.service, another
    session's dockerd)."""
    root = Path(tempfile.mkdtemp(prefix="h9-proc-", dir="/tmp"))
    root.chmod(0o755)
    (root / "net").symlink_to("/proc/net")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield root, procs
    finally:
        shutil.rmtree(root)


@pytest.mark.parametrize("dockerd_elsewhere", [False, True])
def test_a_socket_that_refuses_moptd_is_judged_by_whether_a_daemon_listens(
    tmp_path, proc_of, dockerd_elsewhere
):
    """moptd runs as its own user; docker.sock and containerd.sock are root's. A daemon
    listening behind a socket moptd may not open still counts (on its files); a socket
    file nobody listens on does not, whether or not a dockerd runs elsewhere (rootless, or
    on another socket). Run as nobody, against root's 0600 sockets."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run the collector as another user")
    procfs, running = proc_of
    live, dead, other = (Path(f"/tmp/h9-{os.getpid()}-{n}.sock") for n in ("live", "dead", "other"))
    b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        running.append(_listener_named("containerd", live, tmp_path))  # a containerd runs
        if dockerd_elsewhere:  # a dockerd runs, listening at a socket not docker_socket
            running.append(_listener_named("dockerd", other, tmp_path))
        for proc in running:
            (procfs / str(proc.pid)).symlink_to(f"/proc/{proc.pid}")
        live.chmod(0o600)
        b.bind(str(dead))  # what a crashed daemon leaves: a file, no listener
        dead.chmod(0o600)
        options = {
            "containerd_socket": str(live),
            "docker_socket": str(dead),
            "podman_socket": str(tmp_path / "none.sock"),
            "crio_socket": str(tmp_path / "none.sock"),
            "docker_daemon_json": str(tmp_path / "none.json"),
            "containerd_config": str(tmp_path / "none.toml"),
            "cdi_dirs": [],
            "search_path": "",
            "use_tools": False,
        }
        out = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--",
             sys.executable, "-c", _AS_NOBODY, json.dumps(options), str(procfs)],
            capture_output=True, text=True, timeout=60, check=False,
            env={"PYTHONPATH": str(Path(__file__).parent.parent), "HOME": "/tmp"},
        )  # fmt: skip
    finally:
        for proc in running:
            _end(proc)
        b.close()
        for path in (live, dead, other):
            path.unlink(missing_ok=True)
    assert out.returncode == 0, out.stderr
    samples = json.loads(out.stdout)
    present = {e: v for sig, e, v in samples if sig == "container.engine_present"}
    status = {e: v for sig, e, v in samples if sig == "container.engine_status"}
    assert present["containerd"] == 1.0
    assert status["containerd"].startswith(f"a daemon listens at {live}, but {live}: permission")
    assert present["docker"] == 0.0
    if dockerd_elsewhere:  # so docker_socket is asked, refuses, and nothing listens there
        assert status["docker"] == (
            f"no daemon listens at {dead} (moptd may not open it: permission denied)"
        )
    else:  # never asked
        assert status["docker"] == (
            f"no daemon answers: no dockerd runs and nothing listens at {dead}"
            " (a CLI or a socket file alone is no engine)"
        )
    # podman's socket behind a directory moptd may not search (as /run/podman is): no crash
    assert present["podman"] == 0.0


# --- a CLI alone is no engine -----------------------------------------------------------


async def test_a_docker_cli_without_a_daemon_is_no_engine(tmp_path):
    ctx = _ctx(tmp_path, tmp_path / "etc")
    docker = tmp_path / "bin/docker"
    docker.write_text("#!/bin/sh\nexit 0\n")
    docker.chmod(0o755)
    batch = await _collect(ctx)
    assert _by(batch, "container.engine_present")["docker"] == 0.0
    status = _by(batch, "container.engine_status")
    assert set(status) == {"docker"}  # nothing said of engines with no trace at all
    assert str(status["docker"]).startswith(
        f"no daemon answers: no dockerd runs and nothing listens at {tmp_path}/no-docker.sock"
    )
    results = _evaluate(batch)
    assert [r.verdict.code for r in results if r.verdict is not None] == []


async def test_moptd_status_says_a_cli_alone_is_no_engine(tmp_path, capsys):
    ctx = _ctx(tmp_path, PASTE / "containerd-v3-dropin/etc")
    docker = tmp_path / "bin/docker"
    docker.write_text("#!/bin/sh\nexit 0\n")
    docker.chmod(0o755)
    store = SignalStore(clock=VirtualClock(0))
    store.ingest("container", await _collect(ctx), t=0)
    view = container_view(store)
    assert list(view) == ["docker"]  # containerd's config alone, no binary, no socket: no line
    assert view["docker"]["answers"] is False
    render.print_status({"containers": view, "collectors": []})
    out = " ".join(capsys.readouterr().out.split())
    assert "Container engine docker: no daemon answers: no dockerd runs" in out
    assert "a CLI or a socket file alone is no engine" in out


def _evaluate(batch: Batch) -> list:
    """The container rule over the batch on a GPU host (the nvidia module loaded)."""
    loaded = load_rules([RULES])
    assert loaded.errors == []
    store = SignalStore(clock=VirtualClock(0))
    gpu_host = Batch()
    gpu_host.add("driver.module_loaded", "node", 1.0, (("module", "nvidia"),))
    store.ingest("driver", gpu_host, t=0)
    store.ingest("container", batch, t=0)
    return evaluate(loaded.ruleset, store, 1)


# --- a real dockerd ---------------------------------------------------------------------


def _start_dockerd(root: Path, *extra: str) -> subprocess.Popen[bytes]:
    dockerd = require_tool("dockerd")
    if os.geteuid() != 0:
        if os.environ.get("MOPTD_REQUIRE_TOOLS"):
            pytest.fail("dockerd needs root in CI")
        pytest.skip("dockerd needs root")
    sock = root / "docker.sock"
    argv = [
        dockerd,
        "--data-root", str(root / "data"),
        "--exec-root", str(root / "exec"),
        "--pidfile", str(root / "docker.pid"),
        "-H", f"unix://{sock}",
        "--config-file", str(root / "daemon.json"),
        # no networking to set up: nothing here runs a container
        "--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-forward=false",
        "--ip-masq=false", "--userland-proxy=false",
        *extra,
    ]  # fmt: skip
    with (root / "dockerd.log").open("wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    return _answering(proc, sock, root / "dockerd.log", "dockerd", 60.0, 0.3)


def _answering(
    proc: subprocess.Popen[bytes], sock: Path, log: Path, what: str, timeout: float, every: float
) -> subprocess.Popen[bytes]:
    """The engine once its API answers /_ping; stopped, and the test skipped (failed in CI),
    when it exits or does not answer in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if engine_socket.get(sock, "/_ping", 1.0) == b"OK":
                return proc
        except engine_socket.EngineUnreachable:
            time.sleep(every)
    _stop(proc)
    tail = log.read_text(errors="replace")[-1500:]
    if os.environ.get("MOPTD_REQUIRE_TOOLS"):
        pytest.fail(f"{what} did not start:\n{tail}")
    pytest.skip(f"{what} cannot start here:\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def engine_root() -> Iterator[Path]:
    # a short path: the socket's must fit in sockaddr_un (108 bytes)
    root = Path(f"/tmp/moptd-engine-{os.getpid()}")
    root.mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "extra", "daemon_json", "code"),
    [
        # Debian's dockerd with its default runtimes (runc): a GPU host whose containers
        # will not see the GPUs
        ("default runtimes", (), {}, "CONTAINER_RUNTIME_NOT_CONFIGURED"),
        # the flag nvidia-ctk's docs mention as the alternative to daemon.json
        ("--add-runtime", ("--add-runtime", "nvidia=/usr/bin/true"), {}, None),
        # what `nvidia-ctk runtime configure --runtime=docker` writes to daemon.json
        (
            "daemon.json runtimes",
            (),
            {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}},
            None,
        ),
    ],
)
async def test_a_real_dockerd_is_asked(tmp_path, engine_root, how, extra, daemon_json, code):
    (engine_root / "daemon.json").write_text(json.dumps(daemon_json))
    proc = _start_dockerd(engine_root, *extra)
    try:
        ctx = _ctx(
            tmp_path,
            tmp_path / "etc",
            procfs=Path("/proc"),
            docker_socket=str(engine_root / "docker.sock"),
            docker_daemon_json=str(engine_root / "daemon.json"),
        )
        batch = await _collect(ctx)
    finally:
        _stop(proc)
    assert _by(batch, "container.engine_present")["docker"] == 1.0, how
    assert str(_by(batch, "container.engine_status")["docker"]).startswith(
        f"answers at {engine_root}/docker.sock (docker "
    )
    expected = 0.0 if code else 1.0
    assert _by(batch, "container.nvidia_runtime_configured")["docker"] == expected
    # CDI on or off (docker 28 turns it on), no spec on disk: the runtime decides
    assert _by(batch, "container.cdi_enabled")["docker"] in (0.0, 1.0)
    results = _evaluate(batch)
    codes = [r.verdict.code for r in results if r.verdict is not None]
    assert codes == ([code] if code else [])


@pytest.mark.slow
async def test_daemon_json_edited_but_docker_not_restarted(tmp_path, engine_root):
    """The running daemon's word counts: a daemon.json naming nvidia that dockerd has not
    loaded yet is a docker without the runtime."""
    (engine_root / "daemon.json").write_text("{}")
    proc = _start_dockerd(engine_root)
    try:
        (engine_root / "daemon.json").write_text(
            json.dumps({"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}})
        )
        ctx = _ctx(
            tmp_path,
            tmp_path / "etc",
            procfs=Path("/proc"),
            docker_socket=str(engine_root / "docker.sock"),
            docker_daemon_json=str(engine_root / "daemon.json"),
        )
        batch = await _collect(ctx)
    finally:
        _stop(proc)
    assert _by(batch, "container.nvidia_runtime_configured")["docker"] == 0.0
    assert _by(batch, "container.config_valid")[str(engine_root / "daemon.json")] == 1.0


# --- a real podman API service ----------------------------------------------------------


def _start_podman(root: Path) -> subprocess.Popen[bytes]:
    podman = require_tool("podman")
    sock = root / "podman.sock"
    argv = [
        podman,
        "--root", str(root / "storage"),
        "--runroot", str(root / "run"),
        "--tmpdir", str(root / "tmp"),
        "--storage-driver", "vfs",  # no image is pulled or run: nothing to mount
        "system", "service", "--time=0", f"unix://{sock}",
    ]  # fmt: skip
    with (root / "podman.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    return _answering(proc, sock, root / "podman.log", "podman system service", 30.0, 0.2)


@pytest.mark.slow
@pytest.mark.parametrize("with_spec", [False, True])
async def test_a_real_podman_is_asked(tmp_path, engine_root, with_spec):
    """Podman has no nvidia runtime by default and injects CDI devices natively: with a
    CDI spec on disk containers see the GPUs, without one they do not."""
    from tests.test_container_collector import CDI_SPEC  # nvidia-ctk's shape, trimmed

    cdi = tmp_path / "cdi"
    cdi.mkdir()
    if with_spec:
        (cdi / "nvidia.yaml").write_text(CDI_SPEC.format(v="580.159.04"))
    proc = _start_podman(engine_root)
    try:
        ctx = _ctx(
            tmp_path,
            tmp_path / "etc",
            procfs=Path("/proc"),
            podman_socket=str(engine_root / "podman.sock"),
            cdi_dirs=[str(cdi)],
        )
        batch = await _collect(ctx)
    finally:
        _stop(proc)
    assert _by(batch, "container.engine_present")["podman"] == 1.0
    assert str(_by(batch, "container.engine_status")["podman"]).startswith(
        f"answers at {engine_root}/podman.sock (podman "
    )
    assert _by(batch, "container.nvidia_runtime_configured")["podman"] == 0.0
    assert _by(batch, "container.cdi_enabled")["podman"] == 1.0
    codes = [r.verdict.code for r in _evaluate(batch) if r.verdict is not None]
    assert codes == ([] if with_spec else ["CONTAINER_RUNTIME_NOT_CONFIGURED"])
