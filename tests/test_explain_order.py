"""The reading order of `moptd explain`: causes before their consequences, then severity."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from moptd.cli.explain_order import NODE_CAUSES, SAME_SUBJECT, incidents
from moptd.cli.render_explain import print_explain
from moptd.diagnose.codes import CODES


def finding(code: str, subject: str, severity: str | None = None, **kw: object) -> dict:
    return {"code": code, "subject": subject, "severity": severity or CODES[code].severity, **kw}


def test_the_tables_name_only_known_codes():
    for cause, follow in [*NODE_CAUSES.items(), *SAME_SUBJECT.items()]:
        assert cause in CODES
        assert follow <= set(CODES), follow - set(CODES)
        assert cause not in follow


def test_node_wide_cause_first_then_severity():
    fs = [
        finding("POWER_CAPPED", "gpu:1"),
        finding("GPU_LOST", "gpu:0"),
        finding("UVM_NOT_LOADED", "node"),
        finding("DRIVER_VERSION_MISMATCH", "node"),
        finding("THERMAL_THROTTLE", "gpu:2"),
    ]
    order = [(i.root["code"], [c["code"] for c in i.consequences]) for i in incidents(fs)]
    assert order == [
        ("DRIVER_VERSION_MISMATCH", ["UVM_NOT_LOADED"]),
        ("GPU_LOST", []),
        ("THERMAL_THROTTLE", []),
        ("POWER_CAPPED", []),
    ]


def test_consequence_only_on_the_same_gpu_by_subject_or_bus_id():
    fs = [
        finding("GPU_RESET_REQUIRED", "gpu:0000:9b:00.0", pci_bus_id="0000:9b:00.0"),
        finding("GSP_FIRMWARE_ERROR", "gpu:4", pci_bus_id="0000:9b:00.0"),
        finding("GPU_RESET_REQUIRED", "gpu:5", pci_bus_id="0000:bb:00.0"),
    ]
    got = {i.root["subject"]: [c["subject"] for c in i.consequences] for i in incidents(fs)}
    assert got == {"gpu:4": ["gpu:0000:9b:00.0"], "gpu:5": []}


def test_twins_are_one_block_and_a_chain_has_one_root():
    fs = [finding("HW_SLOWDOWN", f"gpu:{i}", rule="r", path=["r/a"]) for i in range(3)]
    fs += [
        finding("SECURE_BOOT_BLOCKED", "node"),
        finding("MODULE_KERNEL_MISMATCH", "node"),
        finding("DRIVER_NOT_LOADED", "node"),
    ]
    out = incidents(fs)
    assert [len(i.group) for i in out] == [1, 3]
    assert out[0].root["code"] == "SECURE_BOOT_BLOCKED"
    assert sorted(c["code"] for c in out[0].consequences) == [
        "DRIVER_NOT_LOADED",
        "MODULE_KERNEL_MISMATCH",
    ]


def test_firing_before_resolved():
    fs = [
        finding("GPU_LOST", "gpu:0", state="resolved", resolved_at=2.0),
        finding("THERMAL_THROTTLE", "gpu:1", state="firing"),
    ]
    assert [i.root["code"] for i in incidents(fs)] == ["THERMAL_THROTTLE", "GPU_LOST"]


_text = st.text(max_size=30)
_value = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), _text, st.booleans())
_finding = st.fixed_dictionaries(
    {
        "code": st.sampled_from([*CODES, "NOT_A_CODE"]),
        "subject": st.one_of(_text, st.sampled_from(["node", "gpu:0", "gpu:0000:3b:00.0"])),
        "severity": st.one_of(st.sampled_from(["critical", "warning", "info"]), _text),
    },
    optional={
        "state": st.sampled_from(["firing", "resolved", "pending"]),
        "first_seen": st.one_of(st.none(), st.floats(0, 4e9)),
        "resolved_at": st.one_of(st.none(), st.floats(0, 4e9)),
        "pci_bus_id": st.one_of(st.none(), _text, st.just("0000:3b:00.0")),
        "summary": _text,
        "evidence": st.dictionaries(_text, _value, max_size=3),
        "actions": st.lists(_text, max_size=3),
        "path": st.lists(_text, max_size=2),
        "events": st.lists(
            st.fixed_dictionaries(
                {"t": st.floats(0, 4e9), "stream": _text, "text": _text},
                optional={"fields": st.dictionaries(_text, _value, max_size=3)},
            ),
            max_size=3,
        ),
        "attribution": st.lists(
            st.fixed_dictionaries({"pid": st.integers(1, 10**6)}, optional={"user": _text}),
            max_size=2,
        ),
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_finding, max_size=6), st.booleans())
def test_any_findings_render_without_a_crash(fs, verbose):
    buf = io.StringIO()
    print_explain(
        {"time": 0.0, "findings": fs},
        Console(file=buf, width=80, color_system=None),
        verbose=verbose,
    )
    text = buf.getvalue()
    assert (fs == []) == text.startswith("No active findings")


def test_status_ranks_findings_as_explain_does_and_never_wraps_when_piped(capsys) -> None:
    """`moptd status` lists the drill's findings (tests/fixtures/explain-drill, real
    captures) node-wide cause first, as explain does, each on one whole line when piped."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from moptd.cli.render_explain import print_status_findings

    repo = Path(__file__).parent.parent
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "moptd",
            "explain",
            "--json",
            "--bundle",
            "tests/fixtures/explain-drill",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings = json.loads(out.stdout)["findings"]
    findings.sort(key=lambda f: str(f["code"]))  # as unranked as the daemon's list may be
    print_status_findings({"findings": findings})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Findings: 23 active")
    assert "DRIVER_VERSION_MISMATCH  node" in lines[1]
    long = [ln for ln in lines if "NVRM" in ln or len(ln) > 80]
    assert long  # a summary longer than 80 columns, whole on its line
    assert len(lines) == 1 + len(findings)
