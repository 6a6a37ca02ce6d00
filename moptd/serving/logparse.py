"""Recognise the serving-engine log lines that carry diagnostic weight.

Each line is first split into its record (``split_record``: emitter, level, logger,
message); the parsers below read the message only, and a record that carries text a client
chose (an access-log line, a logged prompt or output) is never read at all: a request for
``/v1/EngineDeadError`` is no engine death. Each recognised message becomes a
``LogRecord(stream, fields)``; the stream names are the event streams of
moptd/catalog/serving.py. The lines only one engine writes (its periodic
stats line) are parsed in its module under moptd/serving/engines/, this module holds the
rest. Lines are tested against cheap substrings before any regex, since a busy server
writes an access-log line per request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from moptd.serving.engines import log_parsers
from moptd.serving.errorrecords import ErrorTracker
from moptd.serving.logrecord import Head, LogRecord, MessageParser, number, split_record
from moptd.serving.onnxruntime import LOG_PARSERS as ONNXRUNTIME_PARSERS
from moptd.serving.oom import bare_fields, bare_oom, parse_oom

# vLLM's prefix: V1 ``(Proc pid=N) LEVEL MM-DD HH:MM:SS [file:line] ``, V0
# ``LEVEL MM-DD HH:MM:SS file:line] ``; in a paste often behind docker compose's
# ``service-1  | `` and with the process name coloured.
_PREFIX = re.compile(
    r"^(?:\x1b\[[0-9;]*m)?(?:[\w.-]+ +\| )?(?:\x1b\[[0-9;]*m)?"
    r"(?:\((?P<proc>[A-Za-z0-9_]+) pid=(?P<pid>\d+)\)(?:\x1b\[[0-9;]*m)? )?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[?(?P<file>[^\]:\s]+):(?P<line>\d+)\] )?(?P<msg>.*)$"
)
_KV_SIZE = re.compile(r"(?P<dev>[A-Z+ a-z]+?) KV cache size: (?P<tokens>[\d,]+) tokens")
_MAX_CONC = re.compile(
    r"Maximum concurrency for (?P<per_req>[\d,]+) tokens per request: (?P<conc>[\d.,]+)x"
)
_KV_MEM = re.compile(r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB")
_GRAPH_DONE = re.compile(
    r"Graph capturing finished in (?P<secs>[\d.]+) secs?, took (?P<gib>[\d.]+) GiB"
)
_VERSION = re.compile(
    r"(?:vLLM server version (?P<a>[\w.+-]+)|Initializing a V1 LLM engine \(v(?P<b>[\w.+-]+)\)"
    r"|^\s*\S.*\bversion (?P<c>\d+\.\d+\.\d+\S*)\s*$)"
)
_ACCESS = re.compile(r'\d+ - "(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) \S+ HTTP/1\.[01]" \d{3}')
_WATCHDOG = re.compile(r"\[Watchdog\]\s*Dumped stack to (?P<path>\S+) due to (?P<why>.*)")
_SHM = re.compile(r"No available shared memory broadcast block found in (?P<secs>\d+) seconds?")
# "(exit code: N)" since 0.10; earlier releases print none
# V1's "Worker proc VllmWorker-1 died unexpectedly" (v1/executor/multiproc_executor.py) and
# V0's watchdog "Worker VllmWorkerProcess pid 1159 died, exit code: -6"
# (executor/multiproc_worker_utils.py, vllm#6042)
_WORKER_DIED = re.compile(
    r"Worker proc (?P<name>\S+) died unexpectedly(?: \(exit code: (?P<code>-?\d+)\))?"
    r"|Worker (?P<v0name>\S+) pid \d{1,10} died, exit code: (?P<v0code>-?\d+)"
)


def split_prefix(line: str) -> tuple[dict[str, str], str]:
    """vLLM's ``(Proc pid=N) LEVEL MM-DD HH:MM:SS [file:line] message`` prefix, if any."""
    m = _PREFIX.match(line)
    if m is None:  # the pattern ends in .*, so only a line with odd characters gets here
        return {}, line
    head = {k: v for k, v in m.groupdict().items() if v is not None and k != "msg"}
    return head, m.group("msg")


def _kv_capacity(msg: str) -> LogRecord | None:
    size = _KV_SIZE.search(msg)
    conc = _MAX_CONC.search(msg)
    if size is None and conc is None:
        return None
    out: dict[str, object] = {}
    if size is not None:
        out["tokens"] = number(size.group("tokens"))
    if conc is not None:
        out["max_concurrency"] = number(conc.group("conc"))
        out["tokens_per_request"] = number(conc.group("per_req"))
    return LogRecord("serving.kv_capacity", out)


def _kv_memory(msg: str) -> LogRecord | None:
    """vLLM's profiling result: nothing (or less than nothing) left for the KV cache means
    the engine refuses to start (it raises 'No available memory for the cache blocks')."""
    m = _KV_MEM.search(msg)
    if m is None or number(m.group("gib")) > 0:
        return None
    return LogRecord("serving.startup_error", {"kind": "kv_no_memory"})


def _graphs(msg: str) -> LogRecord | None:
    if "Enforce eager set" in msg:
        return LogRecord("serving.cuda_graphs", {"state": "disabled", "reason": "enforce_eager"})
    if "Cudagraph is disabled under eager mode" in msg:
        return LogRecord("serving.cuda_graphs", {"state": "disabled", "reason": "eager_mode"})
    if "Setting cudagraph_mode to NONE" in msg or "Disabling CUDA Graphs" in msg:
        return LogRecord("serving.cuda_graphs", {"state": "disabled", "reason": "overridden"})
    m = _GRAPH_DONE.search(msg)
    if m is not None:
        return LogRecord(
            "serving.cuda_graphs",
            {"state": "captured", "reason": "", "memory_bytes": number(m.group("gib")) * 2**30},
        )
    return None


def _engine_dead(msg: str) -> LogRecord | None:
    for needle, kind in (
        ("EngineDeadError", "engine_dead_error"),
        # EngineDeadError's own message (v1/engine/exceptions.py), where the class is not named
        ("EngineCore encountered an issue", "engine_dead_error"),
        ("EngineCore encountered a fatal error", "engine_core_fatal"),
        ("engine core exited unexpectedly", "engine_core_exited"),
        ("AsyncLLM output_handler failed", "output_handler_failed"),
        ("Engine core initialization failed", "engine_init_failed"),
        ("EngineCore failed to start", "engine_init_failed"),
        # V0's API server when its MQLLMEngine process never came up
        # (vllm/entrypoints/openai/api_server.py, 0.6-0.10)
        ("Engine process failed to start", "engine_init_failed"),
        # TensorRT-LLM's executor worker (tensorrt_llm/executor/worker.py, logged) and its
        # proxy (executor/proxy.py, raised): the LLM API / trtllm-serve never came up
        ("Failed to initialize executor on rank", "engine_init_failed"),
        ("Executor worker returned error", "engine_init_failed"),
        ("Executor worker died during initialization", "engine_init_failed"),
        # Ray's message for an actor whose worker process died (ray/exceptions.py
        # ActorDiedError), as vLLM's Ray executor logs it for its RayWorkerWrapper actors
        ("The actor is dead because its worker process has died", "ray_actor_died"),
        # SGLang's per-process fatal handlers and the SIGQUIT a dying child sends its parent
        # (scheduler.py, detokenizer_manager.py, tokenizer_manager.py, entrypoints/engine.py)
        ("Scheduler hit an exception", "sglang_scheduler"),
        ("TpModelWorkerClient hit an exception", "sglang_tp_worker"),
        ("DetokenizerManager hit an exception", "sglang_detokenizer"),
        ("TokenizerManager hit an exception", "sglang_tokenizer"),
        ("Received sigquit from a child process", "sglang_child_failed"),
        # an older engine.py spelt it "child proces." (sglang#3685)
        ("It usually means the child failed", "sglang_child_failed"),
        # 0.8's engine core on an exception it cannot survive, before it signals its parent
        # (v1/engine/core.py), and the SIGUSR1 handlers that then stop the engine
        # (v1/engine/core_client.py, v1/executor/multiproc_executor.py "MulitprocExecutor got")
        ("EngineCore hit an exception", "engine_core_fatal"),
        ("Got fatal signal from worker processes", "worker_died"),
        ("got fatal signal from worker processes", "worker_died"),
        ("It usually means one child failed", "sglang_child_failed"),
        # SGLang's KV-pool and request-slot allocators when nothing is left to evict
        # (managers/schedule_batch.py "Prefill out of memory. ..." then exit(1) in 0.1-0.4;
        # mem_cache/common.py "Out of memory. ..." / "Prefill out of memory. ..." and
        # "alloc_req_slots runs out of memory" raised as RuntimeError since): nothing in the
        # scheduler catches them, the scheduler dies and SIGQUITs the server (sglang#26265,
        # #34676, #10408). KV-cache accounting, not a CUDA allocation.
        ("of memory. Try to lower your batch size", "sglang_kv_pool_exhausted"),
        ("alloc_req_slots runs out of memory", "sglang_kv_pool_exhausted"),
    ):
        if needle in msg:
            return LogRecord("serving.engine_dead", {"kind": kind})
    m = _WORKER_DIED.search(msg)
    if m is not None:
        return LogRecord("serving.engine_dead", {"kind": "worker_died"})
    if _STARTUP_METHOD_FAILED.search(msg) is not None:
        return LogRecord("serving.engine_dead", {"kind": "engine_init_failed"})
    return None


def _hang(msg: str) -> LogRecord | None:
    m = _WATCHDOG.search(msg)
    if m is not None:
        return LogRecord("serving.hang", {"kind": "watchdog_dump", "seconds": 0.0})
    m = _SHM.search(msg)
    if m is not None:
        seconds = number(m.group("secs"))
        return LogRecord("serving.hang", {"kind": "shm_broadcast", "seconds": seconds})
    if "Watchdog caught collective operation timeout" in msg or (
        "NCCL" in msg and ("timeout" in msg.lower() or "timed out" in msg)
    ):
        return LogRecord("serving.hang", {"kind": "nccl_timeout", "seconds": 0.0})
    if "watchdog timeout (" in msg or "Watchdog timeout (" in msg:  # SGLang's (utils/watchdog.py)
        return LogRecord("serving.hang", {"kind": "watchdog_timeout", "seconds": 0.0})
    if "RPC call to" in msg and "timed out" in msg:
        return LogRecord("serving.hang", {"kind": "rpc_timeout", "seconds": 0.0})
    return None


def _startup_error(msg: str) -> LogRecord | None:
    for needle, kind in (
        ("Can't load tokenizer", "tokenizer"),
        ("Failed to load the tokenizer", "tokenizer"),
        # transformers' MistralCommonBackend, which vLLM >= 0.12 picks for tokenizer_mode auto
        ("No tokenizer file found in directory", "tokenizer"),
        ("Address already in use", "port_in_use"),
        ("error while attempting to bind on address", "port_in_use"),
        ("not enough GPU memory", "oom_on_load"),
        # The engine was given too little memory for its KV cache: no OOM, the fix is more.
        ("No available memory for the cache blocks", "kv_no_memory"),
        ("larger than the maximum number of tokens that can be stored in KV cache", "kv_too_small"),
        ("KV cache is needed, which is larger than the available KV cache memory", "kv_too_small"),
        # SGLang's KV pool (max_total_num_tokens <= 0), model_runner.py
        ("Not enough memory. Please try to increase --mem-fraction-static", "kv_no_memory"),
        ("is less than desired GPU memory utilization", "gpu_memory_taken"),
        # vllm/config (ModelConfig's max_model_len check): "User-specified max_model_len (N)
        # is greater than the derived max_model_len (max_position_embeddings=M ...)", a
        # ValueError (a pydantic "Value error, ..." since the config became a dataclass).
        ("is greater than the derived max_model_len", "max_model_len_too_long"),
    ):
        if needle in msg:
            return LogRecord("serving.startup_error", {"kind": kind})
    return _quantization_refused(msg)


# vLLM's quantization check (vllm/model_executor/model_loader, `_verify_quantization`): "The
# quantization method fp8 is not supported for the current GPU. Minimum capability: 89.
# Current capability: 86."; compressed-tensors' scheme check words it "Quantization scheme is
# not supported for the current GPU. Min capability: 80. Current capability: 75." (printed
# as a tuple of three strings in some releases).
_QUANT_REFUSED = re.compile(
    r"not supported for\W{0,6}the current GPU\.\W{0,6}(?:Minimum|Min) capability:"
)


def _quantization_refused(msg: str) -> LogRecord | None:
    if _QUANT_REFUSED.search(msg) is None:
        return None
    return LogRecord("serving.startup_error", {"kind": "quantization_unsupported"})


# Chat requests refused while the server runs: the tokenizer has no chat template and none
# was given. vLLM's text (vllm/entrypoints/chat_utils.py, since transformers 4.44 dropped
# the default template), raised as ValueError or, in newer releases,
# ChatTemplateResolutionError, logged by the chat endpoint ("Error in preprocessing prompt
# inputs") and answered with HTTP 400.
_CHAT_TEMPLATE_MISSING = "default chat template is no longer allowed"


def _request_error(msg: str) -> LogRecord | None:
    if _CHAT_TEMPLATE_MISSING in msg:
        return LogRecord("serving.request_error", {"kind": "chat_template_missing"})
    return None


def _oom(msg: str) -> LogRecord | None:
    oom = parse_oom(msg)
    if oom is not None:
        return LogRecord("serving.cuda_oom", oom.fields())
    form = bare_oom(msg)
    return None if form is None else LogRecord("serving.cuda_oom", bare_fields(form))


# V0's multiprocessing executor when a worker raises in a method the engine calls to start
# (vllm/executor/multiproc_worker_utils.py: "Exception in worker %s while processing method
# %s"; LLMEngine's init calls init_device, load_model, determine_num_available_blocks and
# initialize_cache on every worker and does not survive one failing): the engine does not
# start (flashinfer#362). The same line for another method is a wrapper of the traceback.
_STARTUP_METHOD_FAILED = re.compile(
    r"Exception in worker \S{1,80} while processing method "
    r"(?:init_device|load_model|determine_num_available_blocks|initialize_cache)\b"
)
# Records that say nothing failed: an error record is never read as one of them.
_NO_FAILURE = frozenset({"serving.version", "serving.lifecycle"})
# NCCL's CUDACHECK when a CUDA call in NCCL fails (src/include/checks.h: WARN("Cuda failure
# '%s'", cudaGetErrorString(err)); "Cuda failure 1 'invalid argument'" since 2.19): the
# CUDA runtime's own "out of memory", as for "CUDA error: out of memory" (nccl#962, #1235).
_NCCL_OOM = re.compile(r"Cuda failure (?:\d{1,4} )?'out of memory'")


def _nccl_oom(msg: str) -> LogRecord | None:
    if _NCCL_OOM.search(msg) is not None:
        return LogRecord("serving.cuda_oom", bare_fields("cuda_runtime"))
    return None


# TensorRT's allocator when cudaMalloc fails ("[defaultAllocator.cpp::allocate::31] Error
# Code 1: Cuda Runtime (out of memory)") and its deserialiser then ("Error Code 2:
# OutOfMemory (Requested size was N bytes.)"), as TensorRT-LLM's runtime logs them loading
# an engine too large for the free memory (guidance-ai/llgtrt#7): a CUDA OOM, and the
# "Failed to deserialize cuda engine" that follows is its consequence.
_TRT_OOM = ("Cuda Runtime (out of memory)", "Error Code 2: OutOfMemory")


def _trt_oom(msg: str) -> LogRecord | None:
    if any(needle in msg for needle in _TRT_OOM):
        return LogRecord("serving.cuda_oom", bare_fields("tensorrt"))
    return None


# CUDA errors that are neither an OOM nor the engine's own (substring, kind). The texts are
# the CUDA runtime's (cudaGetErrorString, as PyTorch's C10_CUDA_CHECK prints it), PyTorch's
# arch check (torch/cuda/__init__.py) and TensorRT's plan deserialiser.
_CUDA_ERRORS = (
    ("an illegal memory access was encountered", "illegal_address"),
    ("cudaErrorIllegalAddress", "illegal_address"),
    # the driver API's name of it (cuGetErrorName), as TensorFlow/XLA, JAX and cupy print it
    # ("failed to query event: CUDA_ERROR_ILLEGAL_ADDRESS: ...", googlecolab/colabtools#2170)
    ("CUDA_ERROR_ILLEGAL_ADDRESS", "illegal_address"),
    # cudaErrorMisalignedAddress (716): a load or store at an address not aligned for its
    # width, sticky like an illegal address (driver_types.h words both alike); the same
    # finding ("RuntimeError: CUDA error: misaligned address", verl-project/verl#3558)
    ("misaligned address", "illegal_address"),
    ("no kernel image is available for execution on the device", "no_kernel_image"),
    ("is not compatible with the current PyTorch installation", "arch_not_in_build"),
    # Triton's (or torch.compile's) JIT: the ptxas it ships does not know this GPU's
    # architecture (triton#8539: sm_121a on a DGX Spark; vLLM's troubleshooting page for
    # "Value 'sm_110a' is not defined", vllm#31338). TensorFlow prints the same ptxas text
    # as a warning and falls back to the driver's JIT: no failure (_PTXAS_FALLBACK).
    ("is not defined for option 'gpu-name'", "ptxas_arch_unknown"),
    ("CUDA driver version is insufficient for CUDA runtime version", "driver_too_old"),
    ("The NVIDIA driver on your system is too old", "driver_too_old"),
    # cudaErrorCompatNotSupportedOnDevice (804): the user-mode driver in use (a forward-
    # compatibility libcuda, or one upgraded without reloading the module) is newer than the
    # loaded kernel driver, on a GPU that cannot bridge that: a newer loaded driver is the
    # fix (vllm#5510, onnxruntime#21435)
    ("forward compatibility was attempted on non supported HW", "driver_too_old"),
    # cudaErrorUnsupportedPtxVersion (222): PTX from a toolchain newer than the driver's JIT
    # (driver_types.h; NVIDIA's answer in NVIDIA/nvbandwidth#61)
    ("the provided PTX was compiled with an unsupported toolchain", "driver_too_old"),
    # cudaErrorSystemNotReady (802) / CUDA_ERROR_SYSTEM_NOT_READY: on an NVSwitch system the
    # NVLink fabric is not initialised (fabric manager down); rules/driver/fabric-manager
    ("system not yet initialized", "system_not_ready"),
    ("CUDA_ERROR_SYSTEM_NOT_READY", "system_not_ready"),
    ("engine plan file is not compatible with this version of TensorRT", "trt_engine_version"),
    ("engine plan file is generated on an incompatible device", "trt_engine_device"),
    # TensorRT's serialisation check, 7 to 10 ("coreReadArchive.cpp (38) - Serialization Error
    # in verifyHeader", "stdVersionRead == kSERIALIZATION_VERSION failed.")
    ("Version tag does not match", "trt_engine_version"),
    # The plan names a plugin this runtime has not registered (TensorRT-LLM's own plugin
    # library of another release, or not loaded): "getPluginCreator could not find plugin:
    # Gemmtensorrt_llm version: 1", then "Cannot deserialize plugin since corresponding
    # IPluginCreator not found in Plugin Registry".
    ("could not find plugin", "trt_plugin_missing"),
    ("IPluginCreator not found in Plugin Registry", "trt_plugin_missing"),
    # Not a plan at all (another file, truncated download): no incompatibility.
    ("Magic tag does not match", "trt_not_a_plan"),
    ("magicTag == rt::kPLAN_MAGIC_TAG", "trt_not_a_plan"),
    # The consequence every reason above is followed by, alone when the reason went to
    # another log: TensorRT ("Deserialize the cuda engine failed", "Engine deserialization
    # failed") and TensorRT-LLM ("Failed to deserialize cuda engine", tllmRuntime.cpp).
    ("Failed to deserialize cuda engine", "trt_deserialize_failed"),
    ("Deserialize the cuda engine failed", "trt_deserialize_failed"),
    ("Engine deserialization failed", "trt_deserialize_failed"),
    # TensorRT 10's assertion in engine.cpp::deserializeEngine, the same consequence
    ("Assertion engine->deserialize(", "trt_deserialize_failed"),
)
# What the plan was built for against what reads it. TensorRT words it "expecting <this
# runtime / this GPU> got <the plan's>": InsightFace-REST#84 (runtime 8.2.3, plan 8.2.1),
# TensorRT#2177 (a GTX 1050 Ti, compute 6.1, reading a compute 8.6 plan).
_TRT_LIBRARY = re.compile(
    r"expecting library version (?P<runtime>\d{1,6}(?:\.\d{1,6}){0,5}) got "
    r"(?P<built>\d{1,6}(?:\.\d{1,6}){0,5})"
)
_TRT_COMPUTE = re.compile(
    r"expecting compute (?P<runtime>\d{1,3}\.\d{1,3}) got compute (?P<built>\d{1,3}\.\d{1,3})"
)
_TRT_TAG = re.compile(
    r"Current Version: (?P<runtime>\d{1,9}), Serialized Engine Version: (?P<built>\d{1,9})"
)
_TRT_PLUGIN = re.compile(r"could not find plugin:? (?P<built>\S{1,128}) version")
_TORCH_ARCH = re.compile(r"with CUDA capability (?P<runtime>sm_\d+) is not compatible")
_PTXAS_ARCH = re.compile(r"Value '(?P<runtime>sm_\w{1,8})' is not defined for option 'gpu-name'")
_PTXAS_FALLBACK = "fallback to the NVIDIA driver"
_CUDA_ERROR_DETAIL = {
    "trt_engine_version": (_TRT_LIBRARY, _TRT_TAG),
    "trt_engine_device": (_TRT_COMPUTE,),
    "trt_plugin_missing": (_TRT_PLUGIN,),
    "arch_not_in_build": (_TORCH_ARCH,),
    "ptxas_arch_unknown": (_PTXAS_ARCH,),
}


def _cuda_error(msg: str) -> LogRecord | None:
    for needle, kind in _CUDA_ERRORS:
        if needle in msg:
            if kind == "ptxas_arch_unknown" and _PTXAS_FALLBACK in msg:
                return None
            fields: dict[str, object] = {"kind": kind, "built": "", "runtime": ""}
            for pattern in _CUDA_ERROR_DETAIL.get(kind, ()):
                m = pattern.search(msg)
                if m is not None:
                    fields.update({k: v for k, v in m.groupdict().items() if v})
                    break
            return LogRecord("serving.cuda_error", fields)
    return None


def _started(msg: str) -> LogRecord | None:
    if "Starting vLLM server on" in msg or "Application startup complete" in msg:
        return LogRecord("serving.lifecycle", {"kind": "server_started"})
    # A requested stop (SIGTERM/SIGINT): vLLM then prints EngineDeadError while it tears
    # down, which is no engine death. An engine that died prints those lines first.
    if "shutdown triggered" in msg or "trigger received signal=SIG" in msg:
        return LogRecord("serving.lifecycle", {"kind": "shutdown_requested"})
    return None


# Lines vLLM prints only while its engine starts (the weights, torch.compile, the profiling
# and warm-up run). Meanwhile the engine core waits on its shared-memory queue for workers
# that are busy, and says so every 60 s ("No available shared memory broadcast block"):
# during start-up that is no hang.
_LOADING = (
    "Starting to load model",
    "Loading weights took",
    "Model loading took",
    "Dynamo bytecode transform time",
    "Compiling a graph for",
    "torch.compile took",
    "torch.compile takes",
    "Initial profiling/warmup run took",
    "init engine (profile, create kv cache, warmup model) took",
)


def _loading(msg: str) -> LogRecord | None:
    if any(needle in msg for needle in _LOADING):
        return LogRecord("serving.lifecycle", {"kind": "loading"})
    return None


def _version(msg: str) -> LogRecord | None:
    m = _VERSION.search(msg)
    if m is None:
        return None
    return LogRecord("serving.version", {"version": m.group("a") or m.group("b") or m.group("c")})


# (cheap substring that every matching message contains, parser)
_PARSERS: tuple[tuple[str, MessageParser], ...] = (
    *log_parsers(),  # the engines' own lines first (vLLM's stats line, SGLang's decode batch)
    *ONNXRUNTIME_PARSERS,  # execution providers that did not load (moptd/serving/onnxruntime.py)
    ("KV cache size", _kv_capacity),
    ("Available KV cache memory: -", _kv_memory),
    ("Available KV cache memory: 0", _kv_memory),
    ("Maximum concurrency", _kv_capacity),
    ("ager", _graphs),
    ("raph", _graphs),
    ("ngine", _engine_dead),
    ("died unexpectedly", _engine_dead),
    ("died, exit code", _engine_dead),
    ("actor is dead", _engine_dead),
    ("hit an exception", _engine_dead),
    ("output_handler failed", _engine_dead),
    ("fatal signal from worker", _engine_dead),
    ("child", _engine_dead),
    ("Try to lower your batch size", _engine_dead),  # before "out of memory": not CUDA's
    ("alloc_req_slots runs out", _engine_dead),
    ("atchdog timeout (", _hang),
    ("Watchdog", _hang),
    ("shared memory broadcast", _hang),
    ("NCCL", _hang),
    ("timed out", _hang),
    ("out of memory", _oom),
    ("Cuda Runtime (out of memory)", _trt_oom),
    ("Cuda failure", _nccl_oom),
    ("OutOfMemory (Requested size", _trt_oom),
    ("Failed to allocate memory for requested buffer", _oom),
    ("illegal memory access", _cuda_error),
    ("cudaErrorIllegalAddress", _cuda_error),
    ("CUDA_ERROR_ILLEGAL_ADDRESS", _cuda_error),
    ("misaligned address", _cuda_error),
    ("no kernel image", _cuda_error),
    ("option 'gpu-name'", _cuda_error),
    ("current PyTorch installation", _cuda_error),
    ("driver version is insufficient", _cuda_error),
    ("driver on your system is too old", _cuda_error),
    ("forward compatibility was attempted", _cuda_error),
    ("unsupported toolchain", _cuda_error),
    ("system not yet initialized", _cuda_error),
    ("CUDA_ERROR_SYSTEM_NOT_READY", _cuda_error),
    ("engine plan file", _cuda_error),
    ("Version tag does not match", _cuda_error),
    ("find plugin", _cuda_error),
    ("IPluginCreator", _cuda_error),
    ("agic", _cuda_error),
    ("eserializ", _cuda_error),
    # after the OOM and CUDA errors: TensorRT-LLM's "Failed to initialize executor on rank 0:
    # <cause>" names its cause in the same line, and a known cause is the finding
    ("xecutor", _engine_dead),
    ("while processing method", _engine_dead),
    ("tokenizer", _startup_error),
    ("already in use", _startup_error),
    ("bind on address", _startup_error),
    ("memory", _startup_error),
    ("stored in KV cache", _startup_error),
    ("derived max_model_len", _startup_error),
    ("current GPU", _startup_error),
    ("chat template", _request_error),
    ("KV cache is needed", _startup_error),
    ("Starting vLLM server", _started),
    ("startup complete", _started),
    ("shutdown", _started),
    ("load model", _loading),
    ("oading", _loading),
    ("Dynamo bytecode", _loading),
    ("Compiling a graph", _loading),
    ("torch.compile t", _loading),
    ("profiling/warmup", _loading),
    ("init engine", _loading),
    ("version", _version),
)


def parse_line(line: str) -> LogRecord | None:
    """The first diagnostic record a log line carries, or None."""
    return parse_head(split_record(line))


def parse_head(head: Head) -> LogRecord | None:
    """The first diagnostic record of a split line's message, or None; none for a record
    of user text (split_record bounds the line first: a runaway line keeps its head)."""
    if head.user_text:
        return None
    msg = head.message
    for needle, parser in _PARSERS:
        if needle in msg:
            rec = parser(msg)
            if rec is not None and not _only_a_warning(rec, head):
                return rec
    return None


def _only_a_warning(rec: LogRecord, head: Head) -> bool:
    """With VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 vLLM logs the max_model_len text as a WARNING
    and starts anyway (vllm#7080): only the raised error is a refusal."""
    return rec.fields.get("kind") == "max_model_len_too_long" and head.level == "WARNING"


@dataclass
class LogState:
    """What the log has said so far that later lines do not repeat (capacity, version)."""

    kv_tokens: float | None = None
    max_concurrency: float | None = None
    cuda_graphs: str = ""  # "", "disabled", "captured"
    version: str = ""
    started: bool = False
    shutting_down: bool = False  # a requested stop is under way: engine-death lines are noise
    # The log shows the engine starting (loading, compiling, profiling) and it has neither
    # said it listens nor reported a stats line since. A log that has shown neither (a
    # single pasted line, or a log followed from its middle) puts a hang line in phase
    # "unknown": the rule wants more than one shared-memory wait there.
    loading: bool = False
    last_stats: dict[str, object] = field(default_factory=dict)
    last_stats_t: float | None = None
    # The newest stats line of each engine ("all": an aggregated line), and the preemptions
    # the log has counted: V0's warning gives the cumulative count, V1's stats line those of
    # its interval. None until the log said anything about preemptions.
    stats_by_engine: dict[str, dict[str, object]] = field(default_factory=dict)
    preemptions_total: float | None = None
    # The current traceback went through vLLM's get_open_port or torch.distributed's store:
    # both bind an internal port (any free one), so its "Address already in use" is not the
    # serving port (vllm#11617).
    internal_bind: bool = False
    # The API server's access log answered a request (uvicorn: `IP:PORT - "GET /... HTTP/1.1"
    # 200`): it listens, so the engine behind it has started, whatever came before.
    answered: bool = False
    # Tracebacks in progress and the unclassified error messages so far (errorrecords.py)
    errors: ErrorTracker = field(default_factory=ErrorTracker)
    # The current traceback went through SGLang's scheduler process entry
    # (run_scheduler_process): its final line is the scheduler dying, whatever the error
    # (an exception before the entry's own handler, sglang#5762).
    scheduler_traceback: bool = False
    # ... and its first line was SGLang's own "Scheduler hit an exception" (an engine death
    # already): its final line is then quoted as the cause, unclassified where unknown
    traceback_reported: bool = False

    def record(self, line: str) -> LogRecord | None:
        """The record a line carries: what a parser classifies, else an error record no
        pattern knows (serving.unclassified_error), else None. Call after ``observe``.
        While the server stops on request its errors are the stop's own (vLLM prints
        EngineDeadError and cancelled tasks): not unclassified."""
        head = split_record(line)
        if head.user_text:
            return None
        msg = self.errors.error_message(head)
        rec = parse_head(head)
        if rec is not None and msg is not None and rec.stream in _NO_FAILURE:
            # an error whose text merely ends in "... NCCL version 2.18.1" (PyTorch's
            # DistBackendError, nccl#962) is the error, not a version announcement
            rec = None
        if rec is not None or msg is None or self.shutting_down:
            return rec
        if self.scheduler_traceback and self.errors.final:
            self.scheduler_traceback = False
            return LogRecord("serving.engine_dead", {"kind": "sglang_scheduler"})
        return self.errors.unclassified(head, msg)

    def finish(self) -> LogRecord | None:
        """At the end of a log that will not go on (a bundle, a paste): an error message
        still waiting for the lines that would say more is unclassified as it stands."""
        msg = self.errors.pending()
        if msg is None or self.shutting_down:
            return None
        return self.errors.unclassified(split_record(msg), msg)

    def observe(self, line: str) -> None:
        """Every line, parsed or not, before ``update``: the context a record needs."""
        if not self.answered and " HTTP/1." in line and _ACCESS.search(line[:1024]):
            self.answered = True
        if "Traceback (most recent call last)" in line:
            self.internal_bind = False
            self.scheduler_traceback = False
            self.traceback_reported = "hit an exception" in line
        if "in run_scheduler_process" in line:
            self.scheduler_traceback = not self.traceback_reported
        elif "get_open_port" in line or "_create_c10d_store" in line:
            self.internal_bind = True

    def update(self, rec: LogRecord, t: float | None = None) -> None:
        f = rec.fields
        if rec.stream == "serving.kv_capacity":
            if "tokens" in f:
                self.kv_tokens = float(f["tokens"])  # type: ignore[arg-type]
            if "max_concurrency" in f:
                self.max_concurrency = float(f["max_concurrency"])  # type: ignore[arg-type]
        elif rec.stream == "serving.cuda_graphs":
            self.cuda_graphs = str(f["state"])
        elif rec.stream == "serving.version" and not self.version:
            self.version = str(f["version"])
        elif rec.stream == "serving.lifecycle":
            kind = f.get("kind")
            if kind == "shutdown_requested":
                self.shutting_down = True
            elif kind == "loading":
                self.loading = True
            else:
                self.started, self.shutting_down, self.loading = True, False, False
        elif rec.stream == "serving.log_stats":
            self.last_stats = dict(f)
            self.last_stats_t = t
            self.loading = False  # an engine that reports its throughput is serving
            engine = str(f.get("engine", "0"))
            if engine == "all" or "all" in self.stats_by_engine:
                self.stats_by_engine.clear()
            if len(self.stats_by_engine) < 64 or engine in self.stats_by_engine:
                self.stats_by_engine[engine] = dict(f)
            interval = f.get("preemptions")
            if isinstance(interval, float):
                self.preemptions_total = (self.preemptions_total or 0.0) + interval
        elif rec.stream == "serving.preemption":
            total = f.get("total")
            if isinstance(total, float):
                self.preemptions_total = max(self.preemptions_total or 0.0, total)

    def phase(self) -> str:
        """loading, serving, or unknown while the log has shown no sign of either."""
        if self.loading:
            return "loading"
        served = self.started or self.answered or self.last_stats_t is not None
        return "serving" if served else "unknown"

    def event_fields(self, rec: LogRecord) -> dict[str, object]:
        """The fields of the event a record becomes, after `update(rec)`: a hang line
        says whether the engine was still starting when it was printed (phase)."""
        if rec.stream == "serving.hang":
            return {**rec.fields, "phase": self.phase()}
        if (
            rec.stream == "serving.startup_error"
            and rec.fields.get("kind") == "port_in_use"
            and self.internal_bind
        ):
            return {**rec.fields, "kind": "internal_port_in_use"}
        return dict(rec.fields)
