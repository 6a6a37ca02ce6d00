"""The systemd serving path for real: a Debian 12 rootfs booted with systemd-nspawn.

A copy of the cached rootfs (scripts/debootstrap-rootfs.sh; the cache is never changed)
gets polkit (the moptd user starts its unit through 50-moptd.rules) and moptd from a
wheel built here, installed offline into /opt/moptd. Booted, it runs `moptd
install-service` and moptd.service with a managed `moptd-serving@demo.service`: a stand-in
that prints a captured vLLM start-up log verbatim to stdout (so the lines reach the
journal) and serves a captured vLLM /metrics page. Then moptd restarts, with api.group set
to a group of its own, while the unit runs, and `systemctl reload moptd` works on a rootfs
without procps. Checked: the env file, no PORT_CONFLICT, no
chown warning, the log-based signals (vLLM's version and the CUDA-graphs line come only
from the log), the socket's group, and the daemon's RSS and task count (printed: the
figures behind MemoryMax= / TasksMax= in systemd/moptd.service).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import FIXTURES, REPO, require_tool

# setup builds the wheel, fetches its dependencies and boots a machine: minutes, not 120 s
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOTFS = Path(os.environ.get("MOPTD_ROOTFS", "/var/cache/moptd-ci/bookworm-rootfs"))
DEB_CACHE = Path(os.environ.get("MOPTD_NSPAWN_DEBS", "/var/cache/moptd-ci/nspawn-debs"))
# polkitd and what Debian 12's minbase lacks for it; the cached rootfs has no polkit.
POLKIT_DEBS = (
    "polkitd",
    "libpolkit-gobject-1-0",
    "libpolkit-agent-1-0",
    "libduktape207",
    "libglib2.0-0",
    "libpam-systemd",
    "xml-core",
    "sgml-base",
)
DEPS = (  # pyproject.toml [project] dependencies, as wheels for the machine's Python 3.11
    "aiohttp>=3.12.14",
    "prometheus-client>=0.24",
    "nvidia-ml-py>=12.560.30",
    "jsonschema>=4.18",
    "pyyaml>=6",
    "rich>=13",
)
UNIT = "moptd-serving@demo.service"
MANAGED = """collectors:
  serving:
    managed:
      name: demo
      backend: systemd
      device: cpu
      port: 8000
      probes: [health]
      command: [/bin/sh, /srv/standin/serve.sh]
"""
STANDIN = """#!/bin/sh
cat /srv/standin/log.txt
exec python3 -m http.server --bind 127.0.0.1 --directory /srv/standin 8000
"""


def unavailable(reason: str) -> None:
    if os.environ.get("MOPTD_REQUIRE_TOOLS"):
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


def sh(argv: list[str], timeout: float = 300) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, f"{argv}: {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


def polkit_debs() -> Path:
    if DEB_CACHE.is_dir() and len(list(DEB_CACHE.glob("*.deb"))) >= len(POLKIT_DEBS):
        return DEB_CACHE
    DEB_CACHE.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["apt-get", "download", *POLKIT_DEBS],
        cwd=DEB_CACHE,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if r.returncode != 0:
        unavailable(f"apt-get download of polkit's packages failed: {r.stderr[-300:]}")
    return DEB_CACHE


def nspawn_run(root: Path, binds: list[str], command: str) -> str:
    """A command in the (not booted) rootfs, as root."""
    argv = ["systemd-nspawn", "-q", "--register=no", "--keep-unit", "-D", str(root)]
    return sh([*argv, *(f"--bind-ro={b}" for b in binds), "sh", "-c", command])


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    if os.geteuid() != 0:
        unavailable("needs root (systemd-nspawn)")
    require_tool("systemd-nspawn")
    require_tool("nsenter")
    if not (ROOTFS / ".moptd-rootfs-complete").is_file():
        unavailable(f"no rootfs at {ROOTFS} (scripts/debootstrap-rootfs.sh builds it)")
    work = tmp_path_factory.mktemp("nspawn")
    root = work / "root"
    sh(["cp", "-a", str(ROOTFS), str(root)])
    wheels, house = work / "wheel", work / "wheelhouse"
    sh([sys.executable, "-m", "build", "--wheel", "--outdir", str(wheels), str(REPO)])
    sh([sys.executable, "-m", "pip", "download", "-q", "-d", str(house), *DEPS])
    (wheel,) = wheels.glob("moptd-*.whl")
    nspawn_run(root, [f"{polkit_debs()}:/debs"], "dpkg -i /debs/*.deb >/dev/null")
    nspawn_run(
        root,
        [f"{house}:/wheelhouse", f"{wheels}:/wheels"],
        "python3 -m venv /opt/moptd && /opt/moptd/bin/pip install -q --no-index "
        f"--find-links /wheelhouse /wheels/{wheel.name}",
    )
    standin = root / "srv/standin"
    standin.mkdir(parents=True)
    shutil.copy(FIXTURES / "vllm-cpu/vllm_cpu_metrics_idle.txt", standin / "metrics")
    shutil.copy(FIXTURES / "vllm-cpu/vllm_cpu_server_log.txt", standin / "log.txt")
    (standin / "health").write_text("")
    (standin / "serve.sh").write_text(STANDIN)
    (standin / "serve.sh").chmod(0o755)
    boot = subprocess.Popen(
        [
            "systemd-nspawn",
            "-q",
            "--register=no",
            "--keep-unit",
            "--boot",
            "--machine=moptd-nspawn-test",
            "--private-network",
            "--console=passive",
            "-D",
            str(root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        leader = wait_for_leader(boot.pid)
        inside(leader, "systemctl is-system-running --wait || true", timeout=120)
        yield root, leader
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(boot.pid, signal.SIGTERM)  # nspawn --boot: an orderly poweroff
        try:
            boot.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(boot.pid, signal.SIGKILL)
            boot.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def wait_for_leader(nspawn_pid: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children")
        with contextlib.suppress(OSError):
            pids = children.read_text().split()
            if pids:
                return int(pids[0])
        time.sleep(0.2)
    raise AssertionError("systemd-nspawn started no init")


def inside(leader: int, command: str, timeout: float = 120) -> str:
    return sh(["nsenter", "-t", str(leader), "-a", "sh", "-c", command], timeout)


def metrics(leader: int) -> str:
    return inside(
        leader,
        "python3 -c 'import urllib.request,sys;"
        'sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:9477/metrics")'
        ".read().decode())'",
    )


def wait_until(what: str, check: object, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert callable(check)
        if check():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def serving_info(leader: int) -> str:
    lines = [x for x in metrics(leader).splitlines() if x.startswith("moptd_serving_info{")]
    return lines[0] if lines else ""


def test_managed_serving_under_systemd_survives_a_moptd_restart(machine) -> None:  # type: ignore[no-untyped-def]
    root, leader = machine
    # docs/install.md, "One host, with systemd", as written
    inside(leader, "/opt/moptd/bin/moptd install-service")
    with (root / "etc/moptd/moptd.yaml").open("a") as fh:
        fh.write(MANAGED)
    inside(leader, "/opt/moptd/bin/moptd config --config /etc/moptd/moptd.yaml >/dev/null")
    inside(leader, "systemctl enable --now moptd.service", timeout=90)

    wait_until(
        "the unit active",
        lambda: "active" == inside(leader, f"systemctl is-active {UNIT} || true").strip(),
    )
    env = inside(leader, "cat /var/lib/moptd/serving/demo.env")
    assert "SERVING_CMD=/bin/sh /srv/standin/serve.sh" in env
    # the version is in the log only (vLLM's /metrics page has none)
    wait_until("the log's version", lambda: 'version="0.32.0"' in serving_info(leader))

    # api.group of its own: a group moptd is given by a drop-in, as docs/install.md says
    inside(leader, "groupadd --system gpu-ops && useradd --system -G gpu-ops gpuop")
    inside(
        leader,
        "mkdir -p /etc/systemd/system/moptd.service.d && printf '[Service]\\n"
        "SupplementaryGroups=gpu-ops\\n' > /etc/systemd/system/moptd.service.d/api-group.conf"
        " && sed -i 's/^  group: moptd$/  group: gpu-ops/' /etc/moptd/moptd.yaml"
        " && systemctl daemon-reload",
    )
    unit_pid = inside(leader, f"systemctl show {UNIT} -p MainPID --value").strip()
    since = inside(leader, "date +%s").strip()
    inside(leader, "systemctl restart moptd.service", timeout=90)

    wait_until(
        "the log's version after the restart", lambda: 'version="0.32.0"' in serving_info(leader)
    )
    assert inside(leader, f"systemctl show {UNIT} -p MainPID --value").strip() == unit_pid
    # log-based signals from lines printed before this moptd started: the finding shows from
    # the first rule tick after the serving collector has read them (not at once)
    wait_until(
        "CUDA_GRAPHS_DISABLED from the log after the restart",
        lambda: 'moptd_finding_active{code="CUDA_GRAPHS_DISABLED"' in metrics(leader),
        timeout=30,
    )
    text = metrics(leader)
    assert 'code="PORT_CONFLICT"' not in text
    assert "moptd_serving_log_stats_age_seconds{" in text
    journal = inside(leader, "journalctl -u moptd.service -o cat --no-pager")
    assert "cannot give" not in journal
    assert "serving demo not started" not in journal
    assert f"{UNIT} is active" in inside(
        leader, f"journalctl -u moptd.service -o cat --no-pager --since @{since}"
    )
    status = json.loads(inside(leader, "/opt/moptd/bin/moptd serving status --json || true"))
    assert "PORT_CONFLICT" not in json.dumps(status)
    assert inside(leader, "stat -c %G /run/moptd/api.sock").strip() == "gpu-ops"
    # a member of api.group reaches the API over the socket
    health = inside(
        leader,
        "setpriv --reuid=gpuop --regid=gpuop --init-groups python3 -c '"
        'import socket; s=socket.socket(socket.AF_UNIX); s.connect("/run/moptd/api.sock");'
        's.sendall(b"GET /v1/health HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n");'
        "print(s.recv(200).decode().splitlines()[0])'",
    )
    assert " 200 " in health

    pid = inside(leader, "systemctl show moptd.service -p MainPID --value").strip()
    # `systemctl reload` on a host without procps (Debian's minbase has no /bin/kill, which
    # the unit's ExecReload= was): moptd's own `moptd reload` sends the SIGHUP (issue 34)
    assert inside(leader, "ls /bin/kill /usr/bin/kill 2>/dev/null || true").strip() == ""
    since = inside(leader, "date +%s").strip()
    inside(leader, "systemctl reload moptd.service", timeout=60)
    wait_until(
        "the rules reloaded after systemctl reload",
        lambda: re.search(
            r"reloaded \d+ rules from \d+ files",
            inside(leader, f"journalctl -u moptd.service -o cat --no-pager --since @{since}"),
        ),
        timeout=30,
    )
    assert inside(leader, "systemctl show moptd.service -p MainPID --value").strip() == pid
    assert inside(leader, "systemctl is-active moptd.service").strip() == "active"
    rss = inside(leader, f"grep -E '^(VmRSS|VmHWM|Threads)' /proc/{pid}/status")
    procs = inside(
        leader,
        "cat /sys/fs/cgroup/system.slice/moptd.service/cgroup.procs "
        "2>/dev/null || cat /sys/fs/cgroup/unified/system.slice/"
        "moptd.service/cgroup.procs 2>/dev/null || true",
    )
    print(f"moptd under systemd: {' '.join(rss.split())}; processes: {len(procs.split())}")
    hwm_kib = int(rss.split("VmHWM:")[1].split()[0])
    assert hwm_kib < 1024 * 1024 // 4  # a quarter of MemoryMax=1G
    assert int(rss.split("Threads:")[1].split()[0]) < 256 // 4
