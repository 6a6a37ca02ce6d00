"""Cross-layer causes (issue 21 item 2): the engine's GPUs as signals, the links between
findings (moptd.diagnose.links), their load errors, and explain's grouping by them.

The kernel lines are real: leptonai/gpud's Xid 79 excerpt (tests/fixtures/kernel-only-gpu).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.cli.cmd_explain import add_related
from moptd.cli.explain_order import incidents
from moptd.clock import VirtualClock
from moptd.diagnose.lifecycle import Lifecycle
from moptd.diagnose.links import link_findings, serving_gpus
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.model import Finding
from moptd.kernel.attribution import records_to_events
from moptd.kernel.logparse import parse_kernel_log
from moptd.observations import Batch, labels_of
from moptd.serving.signals import (
    MAX_VISIBLE,
    cuda_environ,
    fill_engine_gpus,
    visible_gpus,
)
from moptd.store import SignalStore

FIXTURES = Path(__file__).parent / "fixtures"
XID79 = (FIXTURES / "kernel-only-gpu" / "gpud_sxid_readme_xid79.txt").read_text()
UUID = "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"  # the excerpt's "GPU at PCI" line


# --- the engine's GPUs ------------------------------------------------------------------


def test_cuda_environ_keeps_only_the_cuda_variables():
    block = (
        b"PATH=/usr/bin\0HF_TOKEN=secret\0CUDA_VISIBLE_DEVICES=2,3\0CUDA_DEVICE_ORDER=PCI_BUS_ID\0"
    )
    assert cuda_environ(block) == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert cuda_environ(b"CUDA_VISIBLE_DEVICES=0\n") == {"CUDA_VISIBLE_DEVICES": "0"}


def test_indices_count_only_in_pci_bus_order():
    # CUDA's default order is FASTEST_FIRST: its 0 need not be NVML's 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == [
        "0",
        "1",
    ]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": f"{UUID}, GPU-8932"}) == [UUID, "GPU-8932"]


def test_visible_devices_stop_at_the_first_entry_cuda_cannot_use():
    env = {"CUDA_VISIBLE_DEVICES": "0,-1,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert visible_gpus(env) == ["0"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "MIG-GPU-x/1/0"}) == []  # no whole GPU
    assert visible_gpus({}) == []


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_cuda_environ_takes_any_bytes(data: bytes):
    env = cuda_environ(data)
    assert set(env) <= {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"}
    gpus = visible_gpus(env)
    assert len(gpus) <= MAX_VISIBLE
    assert all(g.isdigit() or g.startswith("GPU-") for g in gpus)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20000))
def test_visible_gpus_is_bounded_on_any_text(text: str):
    gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": text, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert len(gpus) <= MAX_VISIBLE
    assert all(len(g) <= 100 for g in gpus)


def store_with(batch: Batch, t: float = 100.0) -> SignalStore:
    store = SignalStore(clock=VirtualClock(t))
    store.ingest("test", batch, t)
    return store


def test_the_engines_gpus_from_nvml_process_list_and_uuid_prefix():
    b = Batch()
    fill_engine_gpus(b, "serving:main", [10, 11], {"CUDA_VISIBLE_DEVICES": "GPU-b6c3b2be"})
    b.add("process.gpu_memory", "process:11", 1e9, labels_of(gpu="3"))
    b.add("process.gpu_memory", "process:99", 1e9, labels_of(gpu="5"))  # not the engine's
    b.add("gpu.util", "gpu:1", 0.5)
    b.describe("gpu:1", uuid=UUID)
    store = store_with(b)
    assert serving_gpus(store, "serving:main", 100.0) == {"gpu:1", "gpu:3"}
    # five minutes later the samples are stale: nothing is known
    assert serving_gpus(store, "serving:main", 100.0 + 301) == set()


def test_an_ambiguous_uuid_prefix_names_no_gpu():
    b = Batch()
    fill_engine_gpus(b, "serving:main", [], {"CUDA_VISIBLE_DEVICES": "GPU-b"})
    for gpu, uuid in (("gpu:0", UUID), ("gpu:1", "GPU-b0000000-0000-0000-0000-000000000000")):
        b.add("gpu.util", gpu, 0.5)
        b.describe(gpu, uuid=uuid)
    assert serving_gpus(store_with(b), "serving:main", 100.0) == set()


# --- links ------------------------------------------------------------------------------


def firing(rule: str, subject: str, code: str, at: float) -> Finding:
    return Finding(
        rule, subject, code, "critical", "firing", pending_since=at, first_seen=at, last_seen=at
    )


def kernel_store(t: float) -> SignalStore:
    """The real Xid 79 excerpt as the kernel collector stores it, and an engine whose
    CUDA_VISIBLE_DEVICES names the UUID that excerpt gives."""
    store = SignalStore(clock=VirtualClock(t))
    store.add_events(records_to_events(parse_kernel_log(XID79), {}, default_time=t - 60))
    b = Batch()
    fill_engine_gpus(b, "serving:vllm", [], {"CUDA_VISIBLE_DEVICES": UUID})
    store.ingest("serving", b, t)
    return store


LINKS = load_rules([default_rules_dir()]).ruleset.links


def test_a_stall_after_the_xid_of_its_gpu_is_linked_both_ways():
    t = 1000.0
    store = kernel_store(t)
    life = Lifecycle()
    gpu = firing("gpu-lost", "gpu:0000:91:00.0", "GPU_LOST", t - 60)
    stall = firing("serving-scheduler-stall", "serving:vllm", "SCHEDULER_STALL", t)
    life.findings = {(f.rule, f.subject): f for f in (gpu, stall)}
    link_findings(LINKS, life.findings, life.history, store, t)
    assert stall.caused_by == {
        "code": "GPU_LOST",
        "subject": "gpu:0000:91:00.0",
        "rule": "gpu-lost",
        "link": "serving-after-gpu-fault",
        "since": t - 60,
    }
    assert gpu.consequences == [
        {
            "code": "SCHEDULER_STALL",
            "subject": "serving:vllm",
            "rule": "serving-scheduler-stall",
            "link": "serving-after-gpu-fault",
        }
    ]
    assert stall.to_json()["caused_by"]["code"] == "GPU_LOST"
    assert "caused_by" not in gpu.to_json()
    assert "consequences" not in stall.to_json()


def test_a_cause_that_resolved_long_before_is_not_linked():
    t = 5000.0
    store = kernel_store(t)
    life = Lifecycle()
    old = firing("gpu-lost", "gpu:0000:91:00.0", "GPU_LOST", 100.0)
    old.state, old.resolved_at = "resolved", t - 601  # over 10 minutes before
    life.history.append(old)
    stall = firing("serving-engine-dead", "serving:vllm", "ENGINE_DEAD", t)
    life.findings = {(stall.rule, stall.subject): stall}
    link_findings(LINKS, life.findings, life.history, store, t)
    assert stall.caused_by is None
    old.resolved_at = t - 599
    link_findings(LINKS, life.findings, life.history, store, t)
    assert stall.caused_by is not None
    assert stall.caused_by["subject"] == "gpu:0000:91:00.0"


def test_a_pending_cause_is_no_cause_yet():
    t = 1000.0
    store = kernel_store(t)
    gpu = firing("gpu-lost", "gpu:0000:91:00.0", "GPU_LOST", t - 60)
    gpu.state, gpu.first_seen = "pending", None
    stall = firing("serving-engine-dead", "serving:vllm", "ENGINE_DEAD", t)
    findings = {(f.rule, f.subject): f for f in (gpu, stall)}
    link_findings(LINKS, findings, [], store, t)
    assert stall.caused_by is None


# --- the rule language's links: load errors -----------------------------------------------


def load_text(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "x.rules.yaml"
    path.write_text(textwrap.dedent(text))
    return [str(e) for e in load_rules([path]).errors]


def test_a_link_naming_an_unknown_code_is_refused_with_its_line(tmp_path: Path):
    errors = load_text(
        tmp_path,
        """\
        schema: moptd.rules/v1
        links:
          - id: x
            title: x
            consequence: [ENGINE_DEAD]
            cause: [GPU_LOST, NOT_A_CODE]
            join: serving_gpus
        """,
    )
    assert errors
    assert all(e.startswith(f"{tmp_path / 'x.rules.yaml'}:") for e in errors)
    assert any(":6: " in e and "NOT_A_CODE" in e for e in errors), errors


def test_a_link_whose_condition_does_not_compile_is_refused(tmp_path: Path):
    errors = load_text(
        tmp_path,
        """\
        schema: moptd.rules/v1
        links:
          - id: x
            title: x
            consequence: [ENGINE_DEAD]
            cause: [GPU_LOST]
            join: serving_gpus
            if: gpu.temperature > 90
        """,
    )
    assert any(":8: link x: if: " in e and "not usable in a serving rule" in e for e in errors)


def test_a_code_that_is_its_own_cause_is_refused(tmp_path: Path):
    errors = load_text(
        tmp_path,
        """\
        schema: moptd.rules/v1
        links:
          - id: x
            title: x
            consequence: [ENGINE_DEAD]
            cause: [ENGINE_DEAD]
            join: serving_gpus
        """,
    )
    assert any(":6: link x: ENGINE_DEAD is both cause and consequence" in e for e in errors)


def test_a_within_that_is_no_duration_is_refused(tmp_path: Path):
    errors = load_text(
        tmp_path,
        """\
        schema: moptd.rules/v1
        links:
          - id: x
            title: x
            consequence: [ENGINE_DEAD]
            cause: [GPU_LOST]
            join: serving_gpus
            within: 1 minute
        """,
    )
    assert any(":8: links.0.within: '1 minute' is not a duration" in e for e in errors), errors


def test_an_unknown_join_and_a_missing_key_are_refused(tmp_path: Path):
    errors = load_text(
        tmp_path,
        """\
        schema: moptd.rules/v1
        links:
          - id: x
            title: x
            consequence: [ENGINE_DEAD]
            cause: [GPU_LOST]
            join: same_rack
          - id: y
            title: y
            cause: [GPU_LOST]
            join: serving_gpus
        """,
    )
    assert any(":7: " in e and "same_rack" in e for e in errors), errors
    assert any("links.1" in e and "consequence" in e for e in errors), errors


# --- explain --------------------------------------------------------------------------------


def view_findings() -> list[dict[str, object]]:
    gpu = {
        "code": "GPU_LOST",
        "subject": "gpu:0000:91:00.0",
        "rule": "gpu-lost",
        "severity": "critical",
        "state": "firing",
        "summary": "lost",
    }
    stall = {
        "code": "SCHEDULER_STALL",
        "subject": "serving:vllm",
        "rule": "serving-scheduler-stall",
        "severity": "critical",
        "state": "firing",
        "summary": "stalled",
        "caused_by": {
            "code": "GPU_LOST",
            "subject": "gpu:0000:91:00.0",
            "rule": "gpu-lost",
            "link": "serving-after-gpu-fault",
        },
    }
    other = {**gpu, "subject": "gpu:3", "summary": "another GPU lost"}
    return [stall, other, gpu]


def test_explain_puts_the_linked_cause_first_and_the_stall_under_it():
    found = incidents(view_findings())
    roots = [(i.root["code"], i.root["subject"]) for i in found]
    assert ("SCHEDULER_STALL", "serving:vllm") not in roots
    # one block: the two lost GPUs read the same (twins), the stall under the one it names
    (block,) = found
    assert block.root["subject"] == "gpu:0000:91:00.0"
    assert [g["subject"] for g in block.group] == ["gpu:0000:91:00.0", "gpu:3"]
    assert [c["code"] for c in block.consequences] == ["SCHEDULER_STALL"]


def test_related_findings_follow_the_link_across_subjects():
    findings = view_findings()
    add_related(findings)
    stall, other, gpu = findings
    assert [(r["code"], r["link"]) for r in stall["related"]] == [("GPU_LOST", "cause")]
    assert [(r["code"], r.get("link")) for r in gpu["related"]] == [
        ("SCHEDULER_STALL", "consequence")
    ]
    assert other["related"] == []


def test_related_keeps_the_daemons_same_subject_findings_and_adds_the_link():
    findings = view_findings()
    stored = {"id": 7, "code": "GPU_RESET_REQUIRED", "subject": "gpu:0000:91:00.0"}
    findings[2]["related"] = [stored]
    add_related(findings)
    assert [r["code"] for r in findings[2]["related"]] == ["SCHEDULER_STALL", "GPU_RESET_REQUIRED"]


def test_the_collector_reads_the_cuda_variables_of_a_real_process():
    import subprocess
    import sys

    from moptd.collectors.serving import _environ

    env = {"CUDA_VISIBLE_DEVICES": UUID, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "SECRET": "x"}
    # the child says it runs: before its exec, /proc/PID/environ is still this process's
    script = "import time; print('ready', flush=True); time.sleep(30)"
    with subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == b"ready\n"
            got = _environ(Path("/proc"), child.pid)
        finally:
            child.kill()
    assert got == {"CUDA_VISIBLE_DEVICES": UUID, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert _environ(Path("/proc"), 2**22 + 1) is None  # no such process: unknown, no error


def test_an_untimed_replay_gives_no_time_for_when_the_cause_fired():
    from moptd.diagnose.replay import _undate

    entry: dict[str, object] = {
        "first_seen": 219.4,
        "last_seen": 230.0,
        "caused_by": {"code": "GPU_LOST", "since": 219.4},
    }
    _undate(entry, "kernel boot")
    assert entry["first_seen"] is None
    assert entry["caused_by"] == {"code": "GPU_LOST", "since": None}
