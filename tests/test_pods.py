"""Pods on a Kubernetes node: the cgroup's pod UID joined with the kubelet's /var/log/pods
directory names (moptd/proc/pods.py), on layouts other people captured
(tests/fixtures/kubernetes-pods/SOURCE.md), into per-process GPU series and Xid attribution."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from moptd.clock import VirtualClock
from moptd.collector import CollectorContext
from moptd.collectors.nvml import NvmlCollector
from moptd.daemon.exporter import TextRenderer
from moptd.kernel.attribution import Attributor
from moptd.kernel.logparse import parse_kernel_log
from moptd.proc.info import parse_cgroup
from moptd.proc.pods import MAX_NAME, RESCAN_SECONDS, PodIndex, PodName, parse_pod_dir
from moptd.store import SignalStore
from tests.conftest import FIXTURES

PODS = FIXTURES / "kubernetes-pods"
LISTING = (PODS / "ls-var-log-pods-cka.txt").read_text().split()
CRIO = (PODS / "cgroup-v1-crio-systemd.txt").read_text()
KIND = (PODS / "cgroup-v1-kind-cgroupfs.txt").read_text()
RECORDING = FIXTURES / "h200" / "nvml_recording_h200.jsonl"  # a real run: pid 622 on GPU 0
XID119 = FIXTURES / "kernel-peers" / "gpud-dmesg-with-xid-119.log"  # pid=2024380


def static_pod_cgroup() -> tuple[str, str]:
    """The cgroup v2 line of a process in the static pod of the netdata tree, and the
    pod's config hash (SOURCE.md: the tree's slice and scope under the systemd driver's
    fixed parents)."""
    tree = (PODS / "cgls-containerd-static-pod.txt").read_text().splitlines()
    names = [line.rsplit("── ", 1)[1] for line in tree]
    slice_ = next(n for n in names if n.startswith("kubepods-burstable-pod") and "_" not in n)
    scope = names[names.index(slice_) + 1]
    line = f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/{scope}\n"
    return line, slice_.removeprefix("kubepods-burstable-pod").removesuffix(".slice")


def pod_log_tree(root: Path) -> Path:
    pods = root / "var" / "log" / "pods"
    for name in LISTING:
        (pods / name / name.split("_")[1].split("-")[0]).mkdir(parents=True)
    return pods


def test_the_captured_cgroups_give_the_pod_uid() -> None:
    crio = parse_cgroup(CRIO)
    assert crio.pod_uid == "a5c1f8d5-1919-434d-add7-4afaafdaef89"
    assert crio.container_runtime == "cri-o"
    assert parse_cgroup(KIND).pod_uid == "e4b97838-73cc-4b94-9f3a-88153d3c8e31"
    line, config_hash = static_pod_cgroup()
    # a static pod's UID is the kubelet's config hash: 32 hex digits, no dashes
    assert parse_cgroup(line).pod_uid == config_hash == "187bff14cccb94f179e943eacce55bb3"
    assert parse_cgroup(line).container_runtime == "containerd"


def test_the_kubelet_listing_names_every_pod(tmp_path: Path) -> None:
    index = PodIndex(pod_log_tree(tmp_path))
    assert index.lookup("0c17e655-c491-43f6-b012-0eab0c7f8071") == PodName(
        "kube-system", "kube-proxy-25w94"
    )
    assert index.lookup("415ED7D85341035184628DF29257FA2F") == PodName(
        "kube-system", "kube-scheduler-master"
    )
    assert len(index.pods) == len(LISTING) == 6
    assert index.problem == ""
    assert index.lookup("a5c1f8d5-1919-434d-add7-4afaafdaef89") is None  # another node's pod


def test_a_new_pod_is_found_after_the_rescan_interval(tmp_path: Path) -> None:
    clock = VirtualClock(100.0)
    pods = pod_log_tree(tmp_path)
    index = PodIndex(pods, clock=clock.now)
    uid = "a5c1f8d5-1919-434d-add7-4afaafdaef89"
    assert index.lookup(uid) is None
    (pods / f"kube-system_calico-node-hx7cw_{uid}").mkdir()
    assert index.lookup(uid) is None  # not listed again at once: a miss costs one scan
    clock.advance(RESCAN_SECONDS)
    assert index.lookup(uid) == PodName("kube-system", "calico-node-hx7cw")


def test_the_index_is_bounded_and_says_so(tmp_path: Path) -> None:
    index = PodIndex(pod_log_tree(tmp_path), max_pods=4)
    index.scan()
    assert len(index.pods) == 4
    assert "more than 4 pods" in index.problem
    gone = PodIndex(tmp_path / "nowhere")
    assert gone.lookup("0c17e655-c491-43f6-b012-0eab0c7f8071") is None
    assert gone.problem.endswith("no such directory; pods are named by UID only")


def test_what_is_not_a_pod_directory() -> None:
    assert parse_pod_dir("0c17e655-c491-43f6-b012-0eab0c7f8071") is None  # before 1.14
    assert parse_pod_dir("kube-system_kube-proxy-25w94") is None
    assert parse_pod_dir("kube-system_Kube_0c17e655-c491-43f6-b012-0eab0c7f8071") is None
    assert parse_pod_dir("a_b_c_0c17e655-c491-43f6-b012-0eab0c7f8071") is None


_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
_UIDS = st.uuids().map(str) | st.from_regex(r"[0-9a-f]{32}", fullmatch=True)


@given(_LABEL, _LABEL, _UIDS)
def test_pod_dir_names_read_back(namespace: str, name: str, uid: str) -> None:
    assert parse_pod_dir(f"{namespace}_{name}_{uid}") == (uid, PodName(namespace, name))


@given(st.text(max_size=2 * MAX_NAME))
def test_pod_dir_parser_never_raises(text: str) -> None:
    parsed = parse_pod_dir(text)
    if parsed is not None:
        assert "_" not in parsed[1].namespace + parsed[1].name


def proc_tree(root: Path, pid: int, cgroup: str) -> Path:
    """A procfs root holding one process: this test process's own comm, cmdline and status
    under the given pid, and the given cgroup."""
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    for name in ("comm", "cmdline", "status"):
        (d / name).write_bytes(Path(f"/proc/{os.getpid()}/{name}").read_bytes())
    (d / "cgroup").write_text(cgroup)
    return root / "proc"


def kube_proxy_cgroup() -> str:
    # SOURCE.md: the CRI-O capture's pod UID replaced by kube-proxy-25w94's from the listing,
    # in the systemd driver's underscore form (no one capture holds both)
    captured = "a5c1f8d5_1919_434d_add7_4afaafdaef89"
    listed = "0c17e655_c491_43f6_b012_0eab0c7f8071"
    return CRIO.replace(captured, listed)


def test_an_xid_names_the_pod_of_its_process(tmp_path: Path) -> None:
    """A real Xid 119 line names pid 2024380; that pid's cgroup puts it in a pod the
    kubelet's directory names: the Xid event says kube-system/kube-proxy-25w94."""
    procfs = proc_tree(tmp_path, 2024380, kube_proxy_cgroup())
    attributor = Attributor(procfs=procfs, pods=PodIndex(pod_log_tree(tmp_path)))
    record = next(r for r in parse_kernel_log(XID119.read_text()) if "Xid" in r.text)
    (event,) = attributor.events(record)
    assert event.fields["pid"] == 2024380
    assert event.fields["pod_uid"] == "0c17e655-c491-43f6-b012-0eab0c7f8071"
    assert (event.fields["namespace"], event.fields["pod"]) == ("kube-system", "kube-proxy-25w94")
    # without the pod directory moptd still gives the UID, and no name it does not know
    bare = Attributor(procfs=procfs, pods=PodIndex(tmp_path / "nowhere"))
    (event,) = bare.events(record)
    assert event.fields["pod_uid"] == "0c17e655-c491-43f6-b012-0eab0c7f8071"
    assert "pod" not in event.fields


def test_per_process_gpu_series_name_the_pod(tmp_path: Path) -> None:
    """The NVML collector over a real H200 recording whose GPU 0 runs pid 622, that pid in
    a static pod (the netdata cgroup layout, its config hash replaced by
    kube-scheduler-master's from the listing): /metrics names pod and namespace on every
    per-process series, so `sum by (namespace, pod)` works in Prometheus."""
    line, config_hash = static_pod_cgroup()
    procfs = proc_tree(tmp_path, 622, line.replace(config_hash, "415ed7d85341035184628df29257fa2f"))
    clock = VirtualClock(1_795_969_300.0)
    store = SignalStore(clock)
    opts = {
        "backend": "recorded",
        "recording": str(RECORDING),
        "xid_events": False,
        "slow_interval": 1.0,
        "pod_log_dir": str(pod_log_tree(tmp_path)),
    }
    nvml = NvmlCollector(CollectorContext(options=opts, clock=clock, procfs=procfs))
    renderer = TextRenderer()

    async def until_the_process_shows() -> list[str]:
        # the recording's fourth slow read holds the process, then it exits
        await nvml.start()
        try:
            for _ in range(20):
                store.ingest("nvml", await nvml.collect())
                text = renderer.render(store.snapshot()).decode()
                lines = [x for x in text.splitlines() if x.startswith("moptd_gpu_process_")]
                if lines:
                    return lines
                await nvml.settle()
                clock.advance(1)
        finally:
            await nvml.stop()
        return []

    lines = asyncio.run(until_the_process_shows())
    assert lines, "the recording's process reached /metrics"
    for x in lines:
        assert 'namespace="kube-system"' in x, x
        assert 'pid="622"' in x, x
        assert 'pod="kube-scheduler-master"' in x, x


def test_explain_names_the_pod_where_it_is_known() -> None:
    from moptd.cli.explain_compact import _who

    who = {"pid": 2024380, "process": "python3", "pod_uid": "0c17e655-c491-43f6-b012-0eab0c7f8071"}
    assert _who(who) == "pid 2024380 python3 (pod 0c17e655-c491-43f6-b012-0eab0c7f8071)"
    named = {**who, "pod": "kube-proxy-25w94", "namespace": "kube-system"}
    assert _who(named) == "pid 2024380 python3 (pod kube-system/kube-proxy-25w94)"
