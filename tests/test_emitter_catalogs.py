"""The emitter catalogs (moptd/catalog/emitters/*.yaml): every message cites a source and
maps to an existing code or to benign with a why, and the serving log parsers agree with
them: a message a catalog maps to a code is classified by moptd.serving.logparse into a
record whose rule raises that code, a benign one is never quoted as unclassified."""

from __future__ import annotations

import pytest

from moptd.catalog.emitters import BENIGN, CatalogError, catalogs, parse
from moptd.diagnose.codes import CODES
from moptd.serving.logparse import LogState, parse_head
from moptd.serving.logrecord import Head

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
}
ENTRIES = [(e.id, m) for e in catalogs().values() for m in e.messages]


def test_every_serving_emitter_has_a_catalog() -> None:
    assert set(SERVING) <= set(catalogs())


@pytest.mark.parametrize(("emitter", "msg"), ENTRIES, ids=lambda v: getattr(v, "text", v)[:50])
def test_every_message_cites_a_source_and_maps_to_a_code(emitter: str, msg: object) -> None:
    assert msg.source.strip()  # type: ignore[attr-defined]
    code = msg.code  # type: ignore[attr-defined]
    assert code == BENIGN or code in CODES, f"{emitter}: unknown code {code}"
    if code == BENIGN:
        assert msg.why.strip()  # type: ignore[attr-defined]


def _code_of(emitter: str, text: str) -> str | None:
    rec = parse_head(Head(emitter, "", "", text))
    if rec is None:
        return None
    kind = str(rec.fields.get("kind", ""))
    if rec.stream == "serving.cuda_error" and kind.startswith("trt_"):
        return "TRT_ENGINE_INCOMPATIBLE"
    return RULE_OF.get((rec.stream, kind)) or RULE_OF.get((rec.stream, ""))


@pytest.mark.parametrize(("emitter", "msg"), ENTRIES, ids=lambda v: getattr(v, "text", v)[:50])
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
        return
    assert _code_of(emitter, text) == code, f"{emitter}: {text!r} is not read as {code}"


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
    ],
)
def test_a_bad_catalog_is_refused_naming_file_entry_and_key(text: str, key: str) -> None:
    with pytest.raises(CatalogError, match=key) as exc:
        parse(text, "bad.yaml")
    assert "bad.yaml" in str(exc.value)


def test_the_coverage_table_in_docs_accuracy_is_current() -> None:
    import os
    import re
    from pathlib import Path

    from moptd.catalog.emitters import coverage_table

    doc = Path(__file__).parent.parent / "docs" / "accuracy.md"
    text = doc.read_text()
    block = re.compile(
        r"(<!-- emitter-coverage:start -->\n)(.*?)(<!-- emitter-coverage:end -->)", re.S
    )
    m = block.search(text)
    assert m is not None, "docs/accuracy.md lacks the emitter-coverage markers"
    if os.environ.get("MOPTD_UPDATE_GOLDEN"):
        doc.write_text(text[: m.start(2)] + coverage_table() + text[m.end(2) :])
        return
    assert m.group(2) == coverage_table(), "stale: MOPTD_UPDATE_GOLDEN=1 regenerates it"
