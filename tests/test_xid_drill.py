"""The 3 a.m. drill (issue 16): one real kernel-log excerpt per class of Xid and driver
message, through the real path (kernel-log parser -> matcher -> attributed events -> the
shipped rules -> the finding lifecycle), must give the right code, subject, severity and
first action. The lines are public (tests/fixtures/kernel-drill/SOURCE.md); the expected
answers follow NVIDIA's Xid catalog (docs/reference/gpu-health-anchors.md §b) as written
in each case's comment, not what moptd happened to print.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache

import pytest

from moptd.clock import VirtualClock
from moptd.diagnose.engine import Reuse, evaluate
from moptd.diagnose.lifecycle import Lifecycle
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.model import Finding, RuleSet
from moptd.kernel.attribution import records_to_events
from moptd.kernel.logparse import parse_kernel_log
from moptd.observations import Batch, Event
from moptd.store import SignalStore
from tests.conftest import REPO

DRILL = REPO / "tests/fixtures/kernel-drill"
T0 = 1_800_000_000.0


@cache
def shipped_rules() -> RuleSet:
    loaded = load_rules([default_rules_dir()])
    assert not loaded.errors, loaded.errors
    return loaded.ruleset


def firing(log: str, gpus: Mapping[str, int] | None = None) -> list[Finding]:
    """The findings firing a minute after the lines arrived, evaluated every 15 s as the
    daemon does. A pasted line's own time is not the test's clock: it happens at T0."""
    records = parse_kernel_log((DRILL / log).read_text(encoding="utf-8"))
    events = [
        Event(e.stream, e.subject, T0, e.fields, e.text)
        for e in records_to_events(records, gpus or {}, default_time=T0)
    ]
    assert events, f"{log}: the parser found nothing"
    clock = VirtualClock(T0)
    store = SignalStore(clock=clock)
    for bus, index in (gpus or {}).items():
        batch = Batch()
        batch.describe(f"gpu:{index}", pci_bus_id=bus)
        store.ingest("test", batch, T0)
    store.add_events(events)
    life, reuse = Lifecycle(), Reuse()
    for step in range(5):
        t = T0 + 15 * step
        clock.set(t)
        life.update(evaluate(shipped_rules(), store, t, reuse=reuse), t)
    return sorted((f for f in life.findings.values() if f.state == "firing"), key=lambda f: f.code)


@dataclass(frozen=True)
class Want:
    code: str
    subject: str
    severity: str
    first_action: str  # how the first action starts: "kind: text"
    summary_has: tuple[str, ...] = ()
    never_action: tuple[str, ...] = ()  # action kinds the finding must not list


@dataclass(frozen=True)
class Case:
    log: str
    want: tuple[Want, ...]
    gpus: dict[str, int] = field(default_factory=dict)


DRAIN = "drain_node: kubectl drain $(hostname)"
CASES = {
    # 48 DBE: NVIDIA WORKFLOW_XID_48 (reset, SRAM threshold, field diag, RMA): drain first,
    # never "restart the application; the GPU can keep serving others".
    "xid48": Case(
        "xid48.log",
        (Want("ECC_UNCORRECTABLE", "gpu:0", "critical", DRAIN, ("Xid 48", "RMA")),),
        {"0000:07:00.0": 0},
    ),
    # 95 uncontained: RESET_GPU; other contexts may be corrupt: drain, reset, RMA on repeat.
    "xid95": Case(
        "xid95.log",
        (
            Want("ECC_UNCORRECTABLE", "gpu:0", "critical", DRAIN, ("Xid 95", "RMA")),
            Want("GPU_RESET_REQUIRED", "gpu:0", "critical", "drain_node: Stop scheduling"),
        ),
        {"0000:01:00.0": 0},
    ),
    # 94 contained: RESTART_APP; the GPU keeps serving the others (DCGM: WARN).
    "xid94": Case(
        "xid94.log",
        (
            Want(
                "ECC_UNCORRECTABLE",
                "gpu:0",
                "warning",
                "restart_serving: Restart the application",
                ("pid 7062",),
                ("drain_node",),
            ),
        ),
        {"0000:01:00.0": 0},
    ),
    # 63: IGNORE/IGNORE in NVIDIA's catalog, "reset gpu to activate": a pending remap.
    "xid63": Case(
        "xid63.log",
        (Want("ROW_REMAP_PENDING", "gpu:0", "warning", "drain_node: Stop scheduling"),),
        {"0000:10:1c.0": 0},
    ),
    # 64: RESET_GPU / CONTACT_SUPPORT; a remap failure is an RMA criterion.
    "xid64": Case(
        "xid64.log",
        (Want("ROW_REMAP_FAILURE", "gpu:0", "critical", DRAIN, ("Xid 64",)),),
        {"0000:07:00.0": 0},
    ),
    # 154 to Drain and Reset / GPU Reset Required: drain, then reset (never a reboot first).
    "xid154-drain-reset": Case(
        "xid154-drain-reset.log",
        (
            Want(
                "GPU_RESET_REQUIRED",
                "gpu:0",
                "critical",
                "drain_node: Stop scheduling",
                ("Drain and Reset",),
            ),
        ),
        {"0009:01:00.0": 0},
    ),
    "xid154-reset": Case(
        "xid154-reset.log",
        (
            Want(
                "GPU_RESET_REQUIRED",
                "gpu:0",
                "critical",
                "drain_node: Stop scheduling",
                ("GPU Reset Required",),
            ),
        ),
        {"0019:01:00.0": 0},
    ),
    # 74: WORKFLOW_NVLINK_ERR, a fatal link error: the summary names the link.
    "xid74": Case(
        "xid74.log",
        (Want("NVLINK_ERROR", "gpu:0", "critical", DRAIN, ("Xid 74", "link 14")),),
        {"0003:00:00.0": 0},
    ),
    # 144 Nonfatal: the line's severity decides; no GPU reset.
    "xid144-nonfatal": Case(
        "xid144-nonfatal.log",
        (
            Want(
                "NVLINK_ERROR",
                "gpu:0",
                "warning",
                "inspect: nvidia-smi nvlink -e -i 0",
                ("SAW_MVB", "Nonfatal", "link 0"),
                ("reset_gpu", "drain_node"),
            ),
        ),
        {"0000:04:00.0": 0},
    ),
    # 149 Fatal: a fatal NVLink5 error takes the GPU's NVLink traffic down: drain, reset.
    "xid149-fatal": Case(
        "xid149-fatal.log",
        (Want("NVLINK_ERROR", "gpu:0", "critical", DRAIN, ("NETIR_LINK_EVT", "link 8")),),
        {"0000:04:00.0": 0},
    ),
    # An Xid 13 is the application's (RESTART_APP); the GPU is fine.
    "xid13": Case(
        "xid13.log",
        (
            Want(
                "XID_APPLICATION_FAULT",
                "gpu:0",
                "warning",
                "restart_serving: Restart the process",
                (),
                ("reset_gpu", "drain_node"),
            ),
        ),
        {"0000:43:00.0": 0},
    ),
    # NVRM "API mismatch": a partial upgrade; the new module runs after a reboot.
    "api-mismatch": Case(
        "api-mismatch.log",
        (Want("DRIVER_VERSION_MISMATCH", "node", "critical", "reboot_node: After a driver"),),
    ),
    # RmInitAdapter on one GPU: that GPU (absent from NVML: named by its PCI address),
    # never a node-wide "the nvidia kernel module is not loaded".
    "rminitadapter": Case(
        "rminitadapter.log",
        (Want("GPU_INIT_FAILED", "gpu:0000:0a:00.0", "critical", DRAIN, ("0x24:0x72:1568",)),),
    ),
    # A Fatal SXid: the NVSwitch fabric needs a reset.
    "sxid-fatal": Case(
        "sxid-fatal.log",
        (Want("NVSWITCH_FATAL_ERROR", "node", "critical", DRAIN, ("20034", "nvidia-nvswitch1")),),
    ),
    # Fallen off the bus without an Xid (and the probe failing for that one device):
    # the GPU is lost (RESTART_BM); the module itself is loaded.
    "fallen-off-no-xid": Case(
        "fallen-off-no-xid.log",
        (Want("GPU_LOST", "gpu:0000:b3:00.0", "critical", DRAIN),),
    ),
    # nvidia-fs failing to load: GPUDirect Storage is gone, nvidia.ko and CUDA are not.
    "nvidia-fs": Case(
        "nvidia-fs.log",
        (
            Want(
                "AUX_MODULE_LOAD_FAILURE",
                "node",
                "warning",
                "update_software: Rebuild",
                ("nvidia_fs",),
            ),
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_drill(name: str) -> None:
    case = CASES[name]
    got = firing(case.log, case.gpus)
    assert [(f.code, f.subject, f.severity) for f in got] == sorted(
        (w.code, w.subject, w.severity) for w in case.want
    ), [(f.rule, f.code, f.subject, f.summary) for f in got]
    by_code = {f.code: f for f in got}
    for want in case.want:
        f = by_code[want.code]
        assert f.actions, f
        assert f.actions[0].startswith(want.first_action), f.actions
        for text in want.summary_has:
            assert text in f.summary, f.summary
        # fmt() renders a value the evidence lacked as "unknown" (a symbol may be unknown)
        assert "unknown" not in f.summary.replace("unknown symbol", ""), f.summary
        kinds = [a.split(":", 1)[0] for a in f.actions]
        for kind in want.never_action:
            assert kind not in kinds, f.actions


def test_every_drill_line_is_sourced() -> None:
    source = (DRILL / "SOURCE.md").read_text(encoding="utf-8")
    logs = sorted(p.name for p in DRILL.glob("*.log"))
    assert logs == sorted({c.log for c in CASES.values()})
    for log in logs:
        assert f"`{log}`" in source, log
