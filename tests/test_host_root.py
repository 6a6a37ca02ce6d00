"""paths.host_root: in a container the host's / is mounted at /host (deploy/kubernetes), and
the host's files are read under it as the host would resolve them: /var/run is a link to
/run on Debian, Ubuntu and RHEL hosts, and an absolute link must land under /host, not on
the container's own /run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.collector import MAX_SYMLINKS, CollectorContext, in_root
from moptd.collectors import registry
from moptd.collectors.host import HostCollector
from moptd.config import ConfigError, parse_config
from moptd.daemon.app import build_collectors


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    (root / "run/containerd").mkdir(parents=True)
    (root / "etc/containerd").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")  # as on the host: absolute
    (root / "etc/alt").symlink_to("../run/containerd")  # relative
    return root


def test_an_absolute_link_resolves_under_the_host_root(host: Path) -> None:
    ctx = CollectorContext(host_root=host, etc=host / "etc", procfs=host / "proc")
    assert ctx.host_path("/var/run/docker.sock") == host / "run/docker.sock"
    assert ctx.host_path("/etc/alt/containerd.sock") == host / "run/containerd/containerd.sock"
    assert ctx.host_path("/etc/containerd/config.toml") == host / "etc/containerd/config.toml"
    assert ctx.host_path("/") == host
    assert ctx.path_on_host(host / "run/docker.sock") == "/run/docker.sock"


def test_dotdot_and_link_loops_stay_inside(host: Path) -> None:
    assert in_root(host, Path("/../../etc/containerd")) == host / "etc/containerd"
    (host / "loop").symlink_to("/loop")
    resolved = in_root(host, Path("/loop/x"))
    assert resolved.is_relative_to(host)  # bounded: ELOOP's 40 links, then given up
    assert MAX_SYMLINKS == 40


def test_without_a_host_root_paths_are_as_before(tmp_path: Path) -> None:
    ctx = CollectorContext(etc=tmp_path / "etc")
    assert ctx.host_path("/var/run/docker.sock") == Path("/var/run/docker.sock")
    assert ctx.host_path("/etc/docker/daemon.json") == tmp_path / "etc/docker/daemon.json"
    assert ctx.path_on_host("/run/x") == "/run/x"


def test_a_root_set_on_its_own_wins_over_the_host_root(host: Path, tmp_path: Path) -> None:
    ctx = CollectorContext(host_root=host, procfs=Path("/proc"), etc=host / "etc")
    assert ctx.host_path("/proc/driver/nvidia/version") == Path("/proc/driver/nvidia/version")
    assert ctx.host_path("/etc/x") == host / "etc/x"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["..", ".", "a", "var", "run", "", "loop"]), max_size=12))
def test_in_root_never_leaves_the_root(parts: list[str]) -> None:
    root = Path(__file__).parent / "fixtures"  # a tree with no links out of it
    assert in_root(root, Path("/", *parts)).is_relative_to(root)


def test_config_derives_proc_sys_etc_dev_from_the_host_root() -> None:
    config = parse_config("paths:\n  host_root: /host\n", "t.yaml", registry())
    assert config.host_root == Path("/host")
    assert (config.procfs, config.sysfs) == (Path("/host/proc"), Path("/host/sys"))
    ctx = build_collectors(config)["container"][0].ctx
    assert (ctx.etc, ctx.devfs, ctx.host_root) == (
        Path("/host/etc"),
        Path("/host/dev"),
        Path("/host"),
    )
    default = parse_config("", "t.yaml", registry())
    assert (default.host_root, default.procfs, default.sysfs) == (
        Path("/"),
        Path("/proc"),
        Path("/sys"),
    )
    explicit = parse_config("paths:\n  host_root: /host\n  procfs: /proc\n", "t.yaml", registry())
    assert explicit.procfs == Path("/proc")  # hostPID's own /proc, when an operator wants it


def test_a_relative_host_root_names_the_key_and_line() -> None:
    with pytest.raises(ConfigError, match=r"t\.yaml:2: key 'paths\.host_root': must be an abs"):
        parse_config("paths:\n  host_root: host\n", "t.yaml", registry())


async def test_disk_space_of_a_host_path_is_read_under_the_host_root(host: Path) -> None:
    # "/" and the state dir, watched: their sizes are those of the file system under the
    # host root, labelled with the host's path
    ctx = CollectorContext(
        host_root=host,
        procfs=Path("/proc"),
        state_dir=Path("/var/lib/moptd"),
        global_options={"watch_paths": ["/"]},
    )
    collector = HostCollector(ctx)
    try:
        batch = await collector.collect()
    finally:
        await collector.stop()
    totals = {
        dict(s.labels)["path"]: s.value for s in batch.samples if s.signal == "node.disk_total"
    }
    st_host = os.statvfs(host)
    assert totals["/"] == st_host.f_blocks * st_host.f_frsize
    assert "/var/lib/moptd" not in totals  # absent under the host root: not an error
