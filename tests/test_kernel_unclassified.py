"""UNCLASSIFIED_ERROR for kernel records (issue 29, item 1): what counts as a GPU
emitter's error record, and the bounded tally of distinct messages. Lines quoted from
public issues (named at each)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.kernel.attribution import records_to_events
from moptd.kernel.logparse import parse_kernel_log
from moptd.kernel.unclassified import MAX_DISTINCT, Tally, emitter_of, is_error

INCIDENTS = Path(__file__).parent / "fixtures" / "incidents"

# NVIDIA/open-gpu-kernel-modules#1125 (dmesg after resume)
DRM = (
    "[37804.462018] [drm:nv_drm_atomic_commit [nvidia_drm]] *ERROR* [nvidia-drm] "
    "[GPU ID 0x00000900] Failed to apply atomic modeset.  Error code: -11"
)
# rwth-i6/returnn#1500: classified (kernel.pcie_recovery), never unclassified
AER_GPU = "nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)"


def _streams(text: str) -> list[str]:
    return [e.stream for e in records_to_events(parse_kernel_log(text))]


def test_an_unknown_nvidia_drm_error_is_unclassified():
    [ev] = records_to_events(parse_kernel_log(DRM))
    assert ev.stream == "kernel.unclassified"
    assert ev.fields["emitter"] == "nvidia-drm"
    assert ev.subject == "node"


def test_a_classified_line_is_not_unclassified():
    assert _streams(AER_GPU) == ["kernel.pcie_recovery"]


def test_nvrm_level_decides_nothing_text_does():
    # nv_printf prints with KERN_CONT: every NVRM line arrives at warn (4)
    line = "NVRM: GPU 0000:0a:00.0: rm_init_adapter failed, device minor number 5"
    assert emitter_of(line) == "nvrm"
    assert is_error(4, line, "nvrm")
    assert not is_error(3, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07", "nvrm")


def test_the_module_signature_notice_is_benign():
    # the loader's permissive-mode notice: the module loaded (emitters.md section 11)
    line = (
        "nvidia: module verification failed: signature and/or required key missing - "
        "tainting kernel"
    )
    assert emitter_of(line) == "nvidia"
    assert not is_error(4, line, "nvidia")


def test_clean_boots_give_no_unclassified_record():
    for name in ("clean-boot-nvswitch-550-gpud", "kmsg-nvswitch-open-benign-gpud"):
        for log in (INCIDENTS / name).rglob("*"):
            if log.is_file() and log.parent.name == "kernel":
                assert "kernel.unclassified" not in _streams(log.read_text()), log


def test_the_tally_counts_shapes_and_is_bounded():
    t = Tally()
    t.add("node", "nvrm", "NVRM: a failed 0x10")
    quotes, more = t.add("node", "nvrm", "NVRM: a failed 0x20")
    assert quotes == '"NVRM: a failed 0x10" x2'
    assert more == 0
    for i in range(MAX_DISTINCT + 5):
        quotes, more = t.add("node", "nvrm", f"NVRM: failed {'x' * i}")
    assert quotes.count('" x') == MAX_DISTINCT
    assert more == 6


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.one_of(st.none(), st.integers(0, 7)))
def test_never_crashes(text: str, level: int | None):
    emitter = emitter_of(text)
    if emitter is not None:
        is_error(level, text, emitter)
    records_to_events(parse_kernel_log(text))


def test_the_benign_list_is_the_catalogs():
    """One declaration (moptd/catalog/emitters): a kernel catalog's benign message with a
    failure word in it is not quoted, and nothing outside the catalogs is benign."""
    from moptd.catalog.emitters import BENIGN as BENIGN_CODE
    from moptd.catalog.emitters import catalogs
    from moptd.kernel.unclassified import BENIGN, KERNEL_CATALOGS

    cats = catalogs()
    declared = {m for e in KERNEL_CATALOGS for m in cats[e].messages if m.code == BENIGN_CODE}
    assert set(BENIGN) == declared
    # the explain drill's line (tests/fixtures/explain-drill/kernel/dmesg.txt:41): "error",
    # "needs to be reset", yet only a notice that the Xid 119 lines around it are thinned out
    drill = INCIDENTS.parent / "explain-drill" / "kernel" / "dmesg.txt"
    line = drill.read_text().splitlines()[40]
    assert "Rate limiting GSP RPC error prints" in line
    assert "kernel.unclassified" not in _streams(line)
