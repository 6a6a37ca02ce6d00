"""nvidia.ko failing its own init with no NVRM text (issue 29, item 3): the NVLink core
registered and unregistered with no NVRM line between is a load failure; a good load, or an
unload after one, is not.

Logs: tests/fixtures/incidents/nvidia-ko-silent-init-loop-popos (ollama/ollama#11932) and
clean-boot-nvswitch-550-gpud (a clean NVSwitch boot), each with its SOURCE.md.
"""

from __future__ import annotations

from pathlib import Path

from moptd.kernel.logparse import read_kernel_log
from moptd.kernel.patterns import KernelMatcher

INCIDENTS = Path(__file__).parent / "fixtures" / "incidents"


def _streams(name: str) -> list[str]:
    m = KernelMatcher()
    recs = read_kernel_log(INCIDENTS / name / "kernel" / "dmesg.txt")
    return [x.stream for r in recs for x in m.feed(r.text)]


def test_each_silent_init_cycle_is_a_load_failure():
    # three Unregistered lines; the first closes a cycle that began before the paste
    assert _streams("nvidia-ko-silent-init-loop-popos") == ["kernel.module_load_failure"] * 2


def test_a_clean_boot_has_no_load_failure():
    assert "kernel.module_load_failure" not in _streams("clean-boot-nvswitch-550-gpud")
    assert "kernel.module_load_failure" not in _streams("a100x8-hung-rank-on-gpfs-gpu-fine")
