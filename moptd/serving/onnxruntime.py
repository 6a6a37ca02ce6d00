"""ONNX Runtime's execution-provider lines: a CUDA or TensorRT provider that did not load.

onnxruntime's Python binding does not fail when a GPU provider cannot be created: it logs
and goes on with the providers left, so a session asked for CUDA runs on the CPU, 10-100x
slower, and nothing else says so (docs/runbooks/ONNXRUNTIME_CPU_FALLBACK.md). The lines:

- ``[W:onnxruntime:...] Failed to create CUDAExecutionProvider`` (onnxruntime_pybind_state.cc,
  CreateExecutionProviderInstance): the provider was asked for and left out;
- ``[E:onnxruntime:...] TryGetProviderInfo_CUDA ... Failed to load library
  libonnxruntime_providers_cuda.so with error: libcublasLt.so.11: cannot open shared object
  file`` (provider_bridge_ort.cc), or Windows' ``LoadLibrary failed with error 126 ...
  onnxruntime_providers_cuda.dll``: why, the library the loader did not find;
- ``EP Error ... when using [...]`` then ``Falling back to [...] and retrying.``
  (onnxruntime_inference_collection.py): session creation failed and is retried with the
  fallback list, the CPU alone or still CUDA;
- ``Applied providers: ['CPUExecutionProvider'], with options: ...``: the providers of a
  session as insightface's model zoo prints them.

Each becomes a ``serving.ep_fallback`` record: ``provider`` (cuda, tensorrt, ... or ""),
``kind`` (create_failed, library_missing, retry, applied), ``to`` ("cpu" when the session
is left with the CPU provider alone, "gpu" when a GPU provider is still in the list, ""
when the line cannot say) and ``library`` (the missing shared object, or "").
"""

from __future__ import annotations

import re

from moptd.serving.logrecord import LogRecord, MessageParser

STREAM = "serving.ep_fallback"

# "CUDAExecutionProvider" -> "cuda"; onnxruntime's provider names as its Python API spells them
_CREATE = re.compile(r"Failed to create (?P<ep>[A-Za-z]{1,40})ExecutionProvider")
_LOAD = re.compile(
    r"Failed to load library \S*?onnxruntime_providers_(?P<ep>[a-z_]{1,40})\.so"
    r"(?: with error: (?P<lib>[^\s:]{1,200}): cannot open shared object file)?"
)
_DLL = re.compile(
    r'LoadLibrary failed with error (?P<code>\d+) "[^"]{0,200}" when trying to load '
    r'"[^"]{0,400}?onnxruntime_providers_(?P<ep>[a-z_]{1,40})\.dll"'
)
_RETRY = re.compile(r"Falling back to \[(?P<eps>[^\[\]]{0,400})\] and retrying")
_APPLIED = re.compile(r"Applied providers: \[(?P<eps>[^\[\]]{0,400})\]")
_NAME = re.compile(r"'(?P<ep>[A-Za-z]{1,40})ExecutionProvider'")
# The providers that run on an NVIDIA GPU: the TensorRT provider is loaded beside the CUDA
# provider's library, so with CUDA gone none of them is left.
_NVIDIA = frozenset({"cuda", "tensorrt", "nvtensorrtrtx"})


def _provider(name: str) -> str:
    return name.lower()


def _to(eps: str) -> str:
    names = {_provider(m.group("ep")) for m in _NAME.finditer(eps)}
    if not names:
        return ""
    return "cpu" if names <= {"cpu"} else "gpu"


def _record(provider: str, kind: str, to: str, library: str = "") -> LogRecord:
    return LogRecord(STREAM, {"provider": provider, "kind": kind, "to": to, "library": library})


def _after_cuda(provider: str) -> str:
    """Where a session goes once ``provider`` is out: without CUDA, no NVIDIA provider is
    left; without TensorRT, the CUDA provider may still take the graph (cannot say)."""
    return "cpu" if provider == "cuda" else ""


def _create_failed(msg: str) -> LogRecord | None:
    m = _CREATE.search(msg)
    if m is None:
        return None
    provider = _provider(m.group("ep"))
    return _record(provider, "create_failed", _after_cuda(provider))


def _library_missing(msg: str) -> LogRecord | None:
    m = _LOAD.search(msg)
    if m is not None:
        provider = m.group("ep")
        return _record(provider, "library_missing", _after_cuda(provider), m.group("lib") or "")
    m = _DLL.search(msg)
    if m is not None:
        provider = m.group("ep")
        return _record(provider, "library_missing", _after_cuda(provider))
    return None


def _retry(msg: str) -> LogRecord | None:
    m = _RETRY.search(msg)
    return None if m is None else _record("", "retry", _to(m.group("eps")))


def _applied(msg: str) -> LogRecord | None:
    m = _APPLIED.search(msg)
    if m is None:
        return None
    to = _to(m.group("eps"))
    return _record("", "applied", to) if to else None


# (cheap substring, parser), for moptd.serving.logparse
LOG_PARSERS: tuple[tuple[str, MessageParser], ...] = (
    ("onnxruntime_providers_", _library_missing),
    ("ExecutionProvider", _create_failed),
    ("Falling back to [", _retry),
    ("Applied providers: [", _applied),
)
