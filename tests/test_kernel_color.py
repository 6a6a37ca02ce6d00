"""dmesg --color=always pastes (issue 29, item 5): the colour is taken off and the records
read as plain dmesg's. tests/fixtures/kernel-color/SOURCE.md: the real util-linux dmesg
rendering a public capture."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.bundle.classify import split
from moptd.bundle.intake import read_inputs
from moptd.diagnose.loader import default_rules_dir, load_rules
from moptd.diagnose.replay import replay_timeline
from moptd.kernel.attribution import records_to_events
from moptd.kernel.logparse import parse_kernel_log

COLOR = Path(__file__).parent / "fixtures" / "kernel-color"
PLAIN = Path(__file__).parent / "fixtures" / "incidents" / "api-mismatch-dmesg-515-510"


def _texts(name: str) -> list[str]:
    return [r.text for r in parse_kernel_log((COLOR / name).read_text())]


def test_coloured_dmesg_reads_as_the_plain_capture():
    plain = parse_kernel_log((PLAIN / "kernel" / "dmesg.txt").read_text())
    recs = parse_kernel_log((COLOR / "dmesg-color.txt").read_text())
    assert [(r.text, r.uptime, r.fmt) for r in recs] == [(r.text, r.uptime, r.fmt) for r in plain]
    assert "\x1b" not in recs[0].text
    [ev] = records_to_events(recs)
    assert ev.stream == "kernel.api_mismatch"
    assert (ev.fields["client_version"], ev.fields["kernel_version"]) == ("515.48.07", "510.73.05")


def test_coloured_dmesg_t_is_dated():
    [rec] = parse_kernel_log((COLOR / "dmesg-T-color.txt").read_text())
    assert rec.fmt == "dmesg-T"
    assert rec.t is not None
    assert rec.text.startswith("NVRM: API mismatch: the client has the version 515.48.07")


def test_a_coloured_paste_is_a_kernel_log_and_diagnosed(tmp_path: Path):
    for name in ("dmesg-color.txt", "dmesg-T-color.txt"):
        sections = split((COLOR / name).read_text())
        assert [s.kind for s in sections] == ["kernel-log"], name
    paste = tmp_path / "ticket.txt"
    paste.write_bytes((COLOR / "dmesg-color.txt").read_bytes())
    loaded = load_rules([default_rules_dir()])
    report = replay_timeline(read_inputs([str(paste)]), loaded.ruleset)
    assert {(f["code"], f["subject"]) for f in report.findings} >= {
        ("DRIVER_VERSION_MISMATCH", "node")
    }


_SGR = st.sampled_from(["", "\x1b[32m", "\x1b[0m", "\x1b[33m", "\x1b[1;31m"])


@settings(max_examples=200, deadline=None)
@given(_SGR, _SGR, _SGR)
def test_colour_around_the_stamp_and_prefix_changes_nothing(a: str, b: str, c: str):
    # where dmesg puts it: before the stamp, after it, around the subsystem prefix
    msg = "NVRM: API mismatch: the client has the version 515.48.07, but"
    [rec] = parse_kernel_log(f"{a}[ 7386.259769] {b}{c}{msg[:6]}{b}{msg[6:]}")
    assert rec.text == msg
    assert rec.uptime == 7386.259769
