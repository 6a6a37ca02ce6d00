"""The production checklist's pre-start gates (docs/doctor.md): the model's files load as
their formats define them, and an engine-build directory has room.

Only headers are read, never weights: a safetensors file's 8-byte length and JSON header,
checked against the file's size (a truncated download fails here, not after minutes of
loading), and tokenizer.json parsed as JSON. ``checklist_gates`` is what a managed start
runs; ``moptd doctor`` shows the same results.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moptd.serving.gates import GateResult
from moptd.serving.spec import Managed

# safetensors refuses a header above 100 MB (MAX_HEADER_SIZE in safetensors/src/tensor.rs)
SAFETENSORS_HEADER_MAX = 100_000_000
TOKENIZER_JSON_MAX = 256 * 2**20  # the largest public tokenizer.json files are ~30 MB
# Bytes per element of the safetensors dtypes (safetensors/src/tensor.rs, Dtype); the
# sub-byte ones (F4, F6_*) pack several elements a byte and are not size-checked.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "C64": 8,
    "F64": 8, "I64": 8, "U64": 8,
}  # fmt: skip
# Decoder layers of the Llama-style naming most HF checkpoints use; other layouts (vision
# towers, GPT-2's transformer.h.N) are not counted.
_LAYER = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\.")
BUILD_SPACE_FACTOR = 2.0  # a TensorRT-LLM checkpoint plus the engine, each about the weights


class HeaderError(ValueError):
    """A file that does not parse as its format defines it; the message names the file."""


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    path: Path
    tensors: dict[str, tuple[str, tuple[int, ...], int, int]]  # name -> dtype, shape, begin, end
    metadata: dict[str, str]


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """The header of a safetensors file, checked as the format defines it: 8 bytes of
    little-endian length N, N bytes of JSON, then a byte buffer the tensors' data_offsets
    index entirely, without holes or overlaps (huggingface/safetensors, README "Format")."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise HeaderError(f"{path}: {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > SAFETENSORS_HEADER_MAX:
            raise HeaderError(f"{path}: header length {n} above safetensors' 100 MB limit")
        if 8 + n > size:
            raise HeaderError(f"{path}: header length {n} runs past the file's {size} bytes")
        raw = f.read(n)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"{path}: header is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"{path}: header is not a JSON object")
    meta = doc.pop("__metadata__", {})
    if not isinstance(meta, dict):
        raise HeaderError(f"{path}: __metadata__ is not an object")
    tensors = {name: _tensor(path, name, info) for name, info in doc.items()}
    _check_buffer(path, tensors, size - 8 - n)
    return SafetensorsHeader(path, tensors, {str(k): str(v) for k, v in meta.items()})


def _tensor(path: Path, name: str, info: Any) -> tuple[str, tuple[int, ...], int, int]:
    if not isinstance(info, dict):
        raise HeaderError(f"{path}: tensor {name!r}: not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise HeaderError(f"{path}: tensor {name!r}: dtype missing")
    if not isinstance(shape, list) or not all(_uint(d) for d in shape):
        raise HeaderError(f"{path}: tensor {name!r}: shape is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_uint, offsets))):
        raise HeaderError(f"{path}: tensor {name!r}: data_offsets is not [begin, end]")
    begin, end = offsets
    if begin > end:
        raise HeaderError(f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] reversed")
    width = DTYPE_BYTES.get(dtype)
    if width is not None:
        count = 1
        for d in shape:
            count *= d
        if count * width != end - begin:
            raise HeaderError(
                f"{path}: tensor {name!r}: {dtype} {shape} is {count * width} bytes, "
                f"data_offsets span {end - begin}"
            )
    return dtype, tuple(shape), begin, end


def _uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_buffer(
    path: Path, tensors: dict[str, tuple[str, tuple[int, ...], int, int]], buffer: int
) -> None:
    spans = sorted((t[2], t[3], name) for name, t in tensors.items())
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            what = "overlaps the tensor before it" if begin < pos else "leaves a hole before it"
            raise HeaderError(f"{path}: tensor {name!r} at byte {begin} {what}")
        pos = end
    if pos > buffer:
        raise HeaderError(
            f"{path}: truncated: the header indexes {pos} bytes of tensor data, the file "
            f"holds {buffer} (an interrupted download or copy)"
        )
    if pos < buffer:
        raise HeaderError(f"{path}: {buffer - pos} bytes after the last tensor (not indexed)")


def read_tokenizer_json(path: Path) -> dict[str, Any]:
    """tokenizer.json as the tokenizers library writes it: a JSON object with a model."""
    size = path.stat().st_size
    if size > TOKENIZER_JSON_MAX:
        raise HeaderError(f"{path}: {size} bytes, above {TOKENIZER_JSON_MAX} (not checked)")
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise HeaderError(f"{path}: not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise HeaderError(f"{path}: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise HeaderError(f"{path}: no 'model' object (not a tokenizers tokenizer.json)")
    return doc


def check_tokenizer_loads(model_dir: Path) -> GateResult:
    tok = model_dir / "tokenizer.json"
    if not tok.is_file():
        return GateResult(
            "tokenizer_loads", True, "", "no tokenizer.json (other formats: not read)"
        )
    try:
        doc = read_tokenizer_json(tok)
        config = model_dir / "tokenizer_config.json"
        if config.is_file():
            _read_json_object(config)
    except (HeaderError, OSError) as exc:
        return GateResult("tokenizer_loads", False, "TOKENIZER_MISSING", str(exc))
    model = doc["model"]
    return GateResult(
        "tokenizer_loads", True, "", f"{model.get('type', '?')}, {_vocab_size(model)} tokens"
    )


def _vocab_size(model: dict[str, Any]) -> int:
    vocab = model.get("vocab")
    return len(vocab) if isinstance(vocab, dict | list) else 0


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"{path}: not a JSON object")
    return doc


def check_weights_load(model_dir: Path) -> GateResult:
    """Every safetensors file's header, the shard index's files, and the decoder layers
    config.json counts against the tensors the headers name."""
    files = sorted(p for p in model_dir.iterdir() if p.suffix == ".safetensors" and p.is_file())
    if not files:
        return GateResult(
            "weights_load", True, "", "no safetensors files (other formats: not read)"
        )
    try:
        headers = [read_safetensors_header(p) for p in files]
        _check_index(model_dir, headers)
        layers = _check_layers(model_dir, headers)
    except (HeaderError, OSError) as exc:
        return GateResult("weights_load", False, "", str(exc))
    tensors = sum(len(h.tensors) for h in headers)
    total = sum(h.path.stat().st_size for h in headers)
    detail = f"{len(files)} safetensors file(s), {tensors} tensors, {human_size(total)}"
    return GateResult("weights_load", True, "", detail + (f", {layers} layers" if layers else ""))


def _check_index(model_dir: Path, headers: list[SafetensorsHeader]) -> None:
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        return
    weight_map = _read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise HeaderError(f"{index}: no weight_map object")
    names = {h.path.name: h for h in headers}
    for tensor, shard in weight_map.items():
        header = names.get(str(shard))
        if header is None:
            raise HeaderError(f"{index}: tensor {tensor!r} is in {shard}, which is missing")
        if tensor not in header.tensors:
            raise HeaderError(f"{index}: tensor {tensor!r} is not in {shard}'s header")


def _check_layers(model_dir: Path, headers: Iterable[SafetensorsHeader]) -> int:
    """config.json's num_hidden_layers against the model.layers.N tensors. More layers
    than configured is allowed (DeepSeek-V3 stores its multi-token-prediction layer after
    the last decoder layer); a missing one is a broken or mixed checkpoint."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        return 0
    config = _read_json_object(config_path)
    text = config.get("text_config")
    want = (text if isinstance(text, dict) else config).get("num_hidden_layers")
    if not isinstance(want, int) or isinstance(want, bool) or want < 0:
        return 0
    found = {int(m.group(1)) for h in headers for name in h.tensors if (m := _LAYER.match(name))}
    if not found:
        return 0
    missing = sorted(set(range(want)) - found)
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        raise HeaderError(
            f"{config_path}: num_hidden_layers {want}, the weights lack layer(s) {shown}"
        )
    return want


def human_size(n: float) -> str:
    """Bytes as people read them: GiB from 1 GiB up, else MiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def weights_bytes(model_dir: Path) -> int:
    return sum(
        p.stat().st_size
        for p in model_dir.rglob("*")
        if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".gguf")
    )


def check_build_space(build_dir: Path, model_dir: Path | None) -> GateResult:
    """Room to build a TensorRT-LLM engine: its checkpoint (the weights converted, one file
    per rank) and the engine (which embeds the weights unless stripped) both land there."""
    probe = build_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return GateResult("engine_build_space", False, "", f"{build_dir}: {exc.strerror}")
    free = st.f_bavail * st.f_frsize
    if model_dir is None or not model_dir.is_dir():
        return GateResult(
            "engine_build_space", True, "", f"{build_dir}: {human_size(free)} free (no model)"
        )
    need = BUILD_SPACE_FACTOR * weights_bytes(model_dir)
    ok = free >= need
    return GateResult(
        "engine_build_space",
        ok,
        "" if ok else "DISK_SPACE_LOW",
        f"{build_dir}: {human_size(free)} free, a build needs {human_size(need)} "
        f"({BUILD_SPACE_FACTOR:g} x the weights)",
    )


def checklist_gates(m: Managed, build_dir: Path | None = None) -> list[GateResult]:
    """The checklist's gates for a managed start (run after gates.run_gates)."""
    out: list[GateResult] = []
    if m.model_dir is not None and m.model_dir.is_dir():
        out.append(check_tokenizer_loads(m.model_dir))
        out.append(check_weights_load(m.model_dir))
    if build_dir is not None:
        out.append(check_build_space(build_dir, m.model_dir))
    return out
