"""The emitter catalogs (moptd/catalog/emitters/*.yaml): every message cites a source and
maps to an existing code or to benign with a why, and the serving log parsers agree with
them: a message a catalog maps to a code is classified by moptd.serving.logparse into a
record whose rule raises that code, a benign one is never quoted as unclassified."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from moptd.catalog.emitters import (
    BENIGN,
    PER_XID,
    CatalogError,
    Message,
    catalogs,
    parse,
)
from moptd.catalog.emitters import emitter as one_catalog
from moptd.diagnose.codes import CODES
from moptd.kernel.attribution import records_to_events
from moptd.kernel.logparse import parse_kernel_log
from moptd.serving.logparse import LogState, parse_head
from moptd.serving.logrecord import Head, split_record

SERVING = (
    "vllm",
    "sglang",
    "pytorch",
    "nccl",
    "cuda",
    "tensorrt",
    "trtllm",
    "triton",
    "onnxruntime",
)
# (stream, kind or "") -> the code of the rule that reads it (rules/serving/*.rules.yaml)
RULE_OF = {
    ("serving.engine_dead", ""): "ENGINE_DEAD",
    ("serving.cuda_oom", ""): "CUDA_OOM",
    ("serving.hang", ""): "SCHEDULER_STALL",
    ("serving.hang", "nccl_timeout"): "NCCL_COLLECTIVE_TIMEOUT",
    ("serving.startup_error", "gpu_memory_taken"): "GPU_MEMORY_OCCUPIED_AT_START",
    ("serving.startup_error", "max_model_len_too_long"): "MAX_MODEL_LEN_EXCEEDS_MODEL_CONTEXT",
    ("serving.startup_error", "quantization_unsupported"): "QUANTIZATION_UNSUPPORTED_ON_GPU",
    ("serving.request_error", "chat_template_missing"): "CHAT_TEMPLATE_MISSING",
    ("serving.ep_fallback", ""): "ONNXRUNTIME_CPU_FALLBACK",
    ("serving.startup_error", "kv_no_memory"): "KV_CACHE_CAPACITY_INSUFFICIENT",
    ("serving.startup_error", "kv_too_small"): "KV_CACHE_CAPACITY_INSUFFICIENT",
    ("serving.cuda_error", "illegal_address"): "CUDA_ILLEGAL_ADDRESS",
    ("serving.cuda_error", "no_kernel_image"): "CUDA_ARCH_UNSUPPORTED",
    ("serving.cuda_error", "driver_too_old"): "CUDA_DRIVER_TOO_OLD",
    ("serving.cuda_error", "system_not_ready"): "FABRIC_MANAGER_NOT_READY",  # fabric-manager.rules
}
ENTRIES = [(e.id, m) for e in catalogs().values() for m in e.messages]
# the kernel- and host-side catalogs are checked against the kernel parsers (below)
_HOST_SIDE = ("nvidia-kernel", "linux-kernel", "nvidia-container-toolkit")
_HOST_SIDE += ("nvidia-persistenced", "nvidia-fabricmanager")
SERVING_ENTRIES = [(e, m) for e, m in ENTRIES if e not in _HOST_SIDE]
# Codes of /work/shared/spec/diagnosis-codes.md (2026-12-05 additions) that a catalog maps to
# while moptd.diagnose.codes lacks them yet; docs/accuracy.md lists their messages as
# catalogued, not yet matched. Remove a code here once it is in codes.py.
SPEC_ONLY = frozenset({"FABRIC_MANAGER_NOT_READY"}) - frozenset(CODES)


def test_every_serving_emitter_has_a_catalog() -> None:
    assert set(SERVING) <= set(catalogs())


@pytest.mark.parametrize(("emitter", "msg"), ENTRIES, ids=lambda v: getattr(v, "text", v)[:50])
def test_every_message_cites_a_source_and_maps_to_a_code(emitter: str, msg: object) -> None:
    assert msg.source.strip()  # type: ignore[attr-defined]
    code = msg.code  # type: ignore[attr-defined]
    known = code in (BENIGN, PER_XID) or code in CODES or code in SPEC_ONLY
    assert known, f"{emitter}: unknown code {code}"
    if code in (BENIGN, PER_XID):
        assert msg.why.strip()  # type: ignore[attr-defined]


def _code_of(emitter: str, text: str) -> str | None:
    return _code_of_head(Head(emitter, "", "", text))


def _code_of_head(head: Head) -> str | None:
    rec = parse_head(head)
    if rec is None:
        return None
    kind = str(rec.fields.get("kind", ""))
    if rec.stream == "serving.cuda_error" and kind.startswith("trt_"):
        return "TRT_ENGINE_INCOMPATIBLE"
    return RULE_OF.get((rec.stream, kind)) or RULE_OF.get((rec.stream, ""))


@pytest.mark.parametrize(
    ("emitter", "msg"), SERVING_ENTRIES, ids=lambda v: getattr(v, "text", v)[:50]
)
def test_the_parsers_agree_with_the_catalog(emitter: str, msg: object) -> None:
    if msg.match != "substring":  # type: ignore[attr-defined]
        pytest.skip("a regex entry has no literal text to feed the parser")
    text = msg.text  # type: ignore[attr-defined]
    code = msg.code  # type: ignore[attr-defined]
    if code in (BENIGN, "UNCLASSIFIED_ERROR"):
        if code == BENIGN:  # as an ERROR record of its emitter, never quoted
            state = LogState()
            line = f"ERROR 12-05 08:00:00 [x.py:1] {text}" if emitter == "vllm" else text
            rec = state.record(line)
            assert rec is None or rec.stream != "serving.unclassified_error"
        else:  # quoted, so no parser may read it as a code: else the entry is stale
            read_as = _code_of(emitter, text)
            assert read_as is None, f"{emitter}: {text!r} is read as {read_as}: update the entry"
        return
    assert _code_of(emitter, text) == code, f"{emitter}: {text!r} is not read as {code}"
    if msg.seen:  # type: ignore[attr-defined]
        # and on the real line the catalog names (its emitter's record prefix and context)
        path, _, number = msg.seen.rpartition(":")  # type: ignore[attr-defined]
        line = (REPO / path).read_text(encoding="utf-8").splitlines()[int(number) - 1]
        assert msg.found_in(line), f"{msg.seen} does not carry {text!r}"  # type: ignore[attr-defined]
        assert _code_of_head(split_record(line)) == code, f"{line!r} is not read as {code}"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("emitter: x\nname: X\nrecord: r\nread: []\nmessages: []\n", "'read'"),
        (
            "emitter: x\nname: X\nrecord: r\nread: [{repo: a, ref: b, how: fetch}]\n"
            "messages: [{text: t, code: benign, source: s}]\n",
            "'why'",
        ),
        (
            "emitter: x\nname: X\nrecord: r\nread: [{repo: a, ref: b, how: fetch}]\n"
            "messages: [{text: t, code: X, source: s, colour: red}]\n",
            "'colour'",
        ),
        (
            "emitter: x\nname: X\nrecord: r\nread: [{repo: a, ref: b, how: fetch}]\n"
            "messages: [{text: t, code: X}]\n",
            "'source'",
        ),
        (
            "emitter: x\nname: X\nrecord: r\nread: [{repo: a, ref: b, how: fetch}]\n"
            "messages: [{text: t, code: X, source: s, seen: /etc/passwd:1}]\n",
            "'seen'",
        ),
        (
            "emitter: x\nname: X\nrecord: r\nread: [{repo: a, ref: b, how: fetch}]\n"
            "messages: [{text: t, code: per-xid, source: s}]\n",
            "'why'",
        ),
    ],
)
def test_a_bad_catalog_is_refused_naming_file_entry_and_key(text: str, key: str) -> None:
    with pytest.raises(CatalogError, match=key) as exc:
        parse(text, "bad.yaml")
    assert "bad.yaml" in str(exc.value)


def _unmatched() -> list[tuple[str, str, str, str]]:
    rows = []
    for emitter, msg in KERNEL_ENTRIES:
        reason = NOT_YET_MATCHED.get((emitter, msg.text))
        if reason is None and emitter in NOT_READ and msg.code != BENIGN:
            reason = NOT_READ[emitter]
        if reason is not None:
            rows.append((emitter, msg.text, msg.code, reason))
    return rows


def test_the_coverage_tables_in_docs_accuracy_are_current() -> None:
    """Both generated blocks of docs/accuracy.md: the coverage by emitter and the messages
    catalogued but not yet matched (from NOT_YET_MATCHED and NOT_READ below)."""
    import os
    import re

    from moptd.catalog.emitters import coverage_table, unmatched_table

    rows = _unmatched()
    counts = {e: sum(1 for r in rows if r[0] == e) for e in KERNEL_SIDE}
    blocks = {
        "emitter-coverage": coverage_table(counts),
        "emitter-unmatched": unmatched_table(rows),
    }
    doc = Path(__file__).parent.parent / "docs" / "accuracy.md"
    text = doc.read_text()
    for name, want in blocks.items():
        block = re.compile(rf"(<!-- {name}:start -->\n)(.*?)(<!-- {name}:end -->)", re.S)
        m = block.search(text)
        assert m is not None, f"docs/accuracy.md lacks the {name} markers"
        if os.environ.get("MOPTD_UPDATE_GOLDEN"):
            text = text[: m.start(2)] + want + text[m.end(2) :]
            continue
        assert m.group(2) == want, f"{name} stale: MOPTD_UPDATE_GOLDEN=1 regenerates it"
    if os.environ.get("MOPTD_UPDATE_GOLDEN"):
        doc.write_text(text)


# --- the kernel- and host-side emitters -------------------------------------------------------
# Each catalogued message of these emitters is fed to moptd's kernel path (logparse ->
# patterns -> unclassified, via records_to_events) on a real line: the catalog's `seen:`
# line (tests/fixtures, copied from public logs; the four lines before and after it come
# along, for the multi-line messages, SXid follow-ups and the lines that say why the
# "RmInitAdapter failed!" after them happens), else the catalog text itself, after the
# record's fixed prefix. What the parser makes of that line, mapped to the code of the rule
# that reads it, must equal the catalog's code; a benign message must raise no finding.
KERNEL_SIDE = _HOST_SIDE
PREFIX = {"nvidia-kernel": "NVRM: "}
REPO = Path(__file__).parent.parent
# Emitters whose records no moptd parser reads yet: every message they map to a code is
# "catalogued, not yet matched" (docs/accuracy.md), and a benign one raises nothing.
NOT_READ: dict[str, str] = {}
# Kernel messages the parsers do not yet read as their catalog says, each with what they do
# instead. Strict: a message the parsers come to read right fails here until it is removed.
NOT_YET_MATCHED = {
    ("nvidia-kernel", "Failed to initialize device"): "no captured line, and the text alone "
    "lacks the record's start, the NVSwitch's name (\"%s: Failed to initialize device : %d\", "
    "nvidia-nvswitchN), by which moptd knows a GPU emitter: alone it raises nothing",
}
NON_FINDING = frozenset({"kernel.sxid_detail"})
KERNEL_ENTRIES = [(e, m) for e, m in ENTRIES if e in KERNEL_SIDE]


def _line_of(emitter: str, msg: Message) -> tuple[str, str]:
    """(the text fed to the parser, the target line): the `seen` line with the four before
    and after it, or the catalog text after the record's fixed prefix."""
    if msg.seen:
        path, _, number = msg.seen.rpartition(":")
        lines = (REPO / path).read_text(encoding="utf-8").splitlines()
        n = int(number)
        target = lines[n - 1]
        assert msg.found_in(target), f"{msg.seen} does not carry {msg.text!r}"
        return "\n".join(lines[max(0, n - 5) : n + 4]), target
    if msg.match != "substring":
        pytest.fail(f"{emitter}: a regex entry needs a `seen` line to be checked on")
    # NV_PRINTF / NV_DEV_PRINTF records (the RM, src/nvidia/) start "NVRM: " (then, by
    # RmMsgPrefix, the function name); the other sources print their own prefix, which the
    # catalog text carries where it is fixed
    prefix = PREFIX.get(emitter, "") if msg.source.startswith("src/nvidia/") else ""
    text = msg.text if msg.text.startswith(prefix) else prefix + msg.text
    return text, text


def kernel_codes(block: str, target: str) -> set[str]:
    """The codes the rules raise from the events of ``target`` (read within ``block``)."""
    [rec] = parse_kernel_log(target) or [None]
    own = (rec.text if rec is not None else target).split("\n", 1)[0].strip()
    codes: set[str] = set()
    for ev in records_to_events(parse_kernel_log(block)):
        if own not in ev.text or ev.stream in NON_FINDING:
            continue
        codes |= _codes_of_event(ev.stream, ev.fields)
    return codes


# The daemons' own logs (moptd.kernel.daemon_log, read by the daemon_logs collector): the
# line is parsed as a record of the emitter's own journal or log (a bare message, as
# `journalctl -o cat` prints it, is the unit's); nvidia-container-cli's messages carry the
# CLI's name before them wherever an engine passes them on.
DAEMONS = ("nvidia-container-toolkit", "nvidia-persistenced", "nvidia-fabricmanager")


def daemon_codes(emitter: str, target: str) -> set[str]:
    from moptd.kernel.daemon_log import CONTAINER_CLI, Reader, parse_daemon_log

    if emitter == CONTAINER_CLI and "nvidia-container-cli: " not in target:
        target = "nvidia-container-cli: " + target
    recs = parse_daemon_log(target, emitter)
    assert recs, f"{emitter}: {target!r} is not read as a record"
    assert {r.emitter for r in recs} == {emitter}
    return {str(ev.fields["diagnosis"]) for ev in Reader().events(recs, "test", 0.0)}


def _codes_of_event(stream: str, f: dict[str, object]) -> set[str]:
    if stream == "kernel.xid":
        return {PER_XID, *f.get("diagnoses", ())}  # type: ignore[misc]
    if stream == "kernel.module_load_failure":
        module = f.get("module")
        return {
            "DRIVER_NOT_LOADED"
            if module == "nvidia"
            else "UVM_NOT_LOADED"
            if module == "nvidia_uvm"
            else "AUX_MODULE_LOAD_FAILURE"
        }
    # (stream, field, value, the drivers the rule reads it from or None for any) -> code:
    # rules/hardware/pcie-fatal, nvswitch; rules/driver/pcie-aer, nvlink-kernel
    by_field = {
        ("kernel.sxid", "fatal", True, None): "NVSWITCH_FATAL_ERROR",
        ("kernel.sxid", "fatal", False, None): "NVLINK_ERROR",
        ("kernel.pcie_aer", "severity", "fatal", None): "PCIE_FATAL_ERROR",
        ("kernel.pcie_aer", "severity", "nonfatal", ("nvidia", "pcieport")): "UNCLASSIFIED_ERROR",
        ("kernel.pcie_recovery", "outcome", "failed", None): "PCIE_FATAL_ERROR",
        ("kernel.pcie_recovery", "outcome", "no_handler", ("nvidia",)): "UNCLASSIFIED_ERROR",
    }
    if any(s == stream for s, *_ in by_field):
        return {
            code
            for (s, key, value, drivers), code in by_field.items()
            if s == stream
            and f.get(key) == value
            and (drivers is None or f.get("driver") in drivers)
        }
    code = KERNEL_RULE_OF.get(stream)
    return {code} if code else set()


# stream -> the code of the rule that reads it (rules/driver, rules/hardware, rules/host)
KERNEL_RULE_OF = {
    "kernel.gpu_fallen_off_bus": "GPU_LOST",
    "kernel.gpu_init_failed": "GPU_INIT_FAILED",
    "kernel.api_mismatch": "DRIVER_VERSION_MISMATCH",
    "kernel.gsp_error": "GSP_FIRMWARE_ERROR",
    "kernel.oom_kill": "HOST_OOM_KILL",
    "kernel.secure_boot_refused": "SECURE_BOOT_BLOCKED",
    "kernel.unclassified": "UNCLASSIFIED_ERROR",
    # rules/driver/host-kernel.rules.yaml, nvlink-kernel.rules.yaml
    "kernel.host_fault": "UNCLASSIFIED_ERROR",
    "kernel.nccl_segfault": "UNCLASSIFIED_ERROR",
    "kernel.peermem_error": "UNCLASSIFIED_ERROR",
    "kernel.nvlink_rx_detect_failure": "NVLINK_ERROR",
}


def _kernel_params() -> list[object]:
    out = []
    for emitter, msg in KERNEL_ENTRIES:
        reason = NOT_YET_MATCHED.get((emitter, msg.text))
        if reason is None and emitter in NOT_READ and msg.code != BENIGN:
            reason = NOT_READ[emitter]
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(emitter, msg, marks=marks, id=f"{emitter}:{msg.text[:40]}"))
    return out


def test_every_kernel_side_emitter_has_a_catalog() -> None:
    assert set(KERNEL_SIDE) <= set(catalogs())


@pytest.mark.parametrize(("emitter", "msg"), _kernel_params())
def test_the_kernel_parsers_agree_with_the_catalog(emitter: str, msg: Message) -> None:
    block, target = _line_of(emitter, msg)
    got = daemon_codes(emitter, target) if emitter in DAEMONS else kernel_codes(block, target)
    if msg.code == BENIGN:
        assert got == set(), f"{emitter}: benign {msg.text!r} raises {sorted(got)}"
    else:
        assert msg.code in got, f"{emitter}: {msg.text!r} is read as {sorted(got) or 'nothing'}"


def test_the_not_yet_matched_list_names_only_catalogued_messages() -> None:
    known = {(e, m.text) for e, m in KERNEL_ENTRIES}
    assert set(NOT_YET_MATCHED) <= known
    assert set(NOT_READ) <= set(KERNEL_SIDE)


def test_rescoring_the_corpus_keeps_the_coverage_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/score_corpus.py rewrites docs/accuracy.md from the corpus; the coverage section
    this test generates sits in the same file and must come through a rescore unchanged."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("score_corpus", REPO / "bench/score_corpus.py")
    assert spec is not None
    assert spec.loader is not None
    scorer = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "score_corpus", scorer)  # its dataclasses look it up
    spec.loader.exec_module(scorer)
    doc = (REPO / "docs" / "accuracy.md").read_text()
    start, end = doc.index("## Coverage by emitter"), doc.index("## Per bundle")
    out = tmp_path / "accuracy.md"
    out.write_text(doc)
    assert scorer.keep_coverage(doc[:start] + doc[end:], out) == doc


def test_one_emitters_catalog_is_its_entry_in_the_whole_set() -> None:
    """emitter(id) reads one file where it can (a replay reads the two kernel catalogs,
    not sixteen): the same catalog as the whole set's, also where the file is named
    otherwise than its emitter (tensorrt-llm.yaml declares trtllm), and None for an id no
    file declares."""
    whole = catalogs()
    assert "trtllm" in whole
    for eid, em in whole.items():
        assert one_catalog(eid) == em
    assert one_catalog("tensorrt-llm") is None
    assert one_catalog("no-such-emitter") is None


def test_every_string_the_driver_returns_is_catalogued_with_its_names_code() -> None:
    """cuda.yaml against what libcuda.so.1 itself returned on a GPU host
    (tests/fixtures/cuda-driver/, tools/cuda_driver_strings.py): every CUresult the
    catalog names has the name the driver gives it, every string the driver returns is
    catalogued, and with the code of the name's entry, or the name's entry says which code
    it is in substance (a name no captured line carries is not read yet; the string is)."""
    capture = REPO / "tests" / "fixtures" / "cuda-driver" / "cuda_driver_strings_580.159.04.json"
    values = json.loads(capture.read_text(encoding="utf-8"))["values"]
    by_text = {m.text: m for m in catalogs()["cuda"].messages}
    assert len(values) >= 100
    for v in values:
        assert v["name"] in (v["catalog_name"], None), v
        if v["string"] is None:  # newer than this driver
            continue
        assert v["string"] in by_text, f"libcuda's string for {v['catalog_name']} not catalogued"
        string, name = by_text[v["string"]], by_text[v["catalog_name"]]
        assert string.code == name.code or f"{string.code} in substance" in name.why, v
