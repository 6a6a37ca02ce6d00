"""One recognised serving-log line (``LogRecord``), the parts a line parser is made of, and
the record splitter (``split_record``) that every line goes through first.

Kept apart from logparse.py so an engine module (moptd/serving/engines/) can declare the
parsers of its own log lines without importing the parser that runs them.

Why split first: a serving log holds text its emitters did not write. The uvicorn access
log prints the request line a client chose (``GET /v1/EngineDeadError``), and request
logging prints prompts and model output. A catalog message is matched against the message
of a record only, never against its prefix, and never in a record that carries user text.
The record formats are those of /work/shared/reference/emitters.md (each emitter's logging
source): vLLM V0/V1, SGLang (no level), PyTorch's c10 logging, NCCL, TensorRT and
TensorRT-LLM, Triton (glog), ONNX Runtime, uvicorn and Python's default logging.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LogRecord:
    stream: str  # serving.<kind>, an event stream of the catalog
    fields: dict[str, object] = field(default_factory=dict)


# A parser of one log message (the line without its prefix): its record, or None.
MessageParser = Callable[[str], LogRecord | None]


def number(text: str | None) -> float:
    """A number as a log line prints it (``1,024``), 0 when the line left it out."""
    return float(text.replace(",", "")) if text else 0.0


@dataclass(frozen=True, slots=True)
class Head:
    """A log line split into who wrote it and what it says.

    emitter: vllm, sglang, pytorch, nccl, tensorrt, trtllm, triton, onnxruntime, uvicorn,
    python (Python's default logging format), or "" (no prefix: a traceback line, a
    progress bar, a raw exception). level: ERROR, CRITICAL, FATAL, WARNING, INFO, DEBUG, or
    "" where the format has none (SGLang's default, a raw line). user_text: the record
    carries text a client chose (an access-log line, a logged prompt or output): never
    evidence of anything."""

    emitter: str
    level: str
    logger: str  # the emitter's source file or logger name, as the prefix gives it
    message: str
    proc: str = ""  # the process tag vLLM or Ray puts in front: "EngineCore_DP0 pid=12"
    stamp: str = ""  # the record's time as printed (records of one multi-line message share it)
    user_text: bool = False


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# A log read back through a collector carries the collector's prefix first: the journal's
# (`journalctl -u vllm`: "Mar 03 10:00:00 host vllm[123]: ", -o short-iso
# "2025-03-03T10:00:00+0000 host vllm[123]: ") or docker's (`docker logs --timestamps`:
# "2025-04-06T07:55:21.108632509Z "). The emitter's own record follows unchanged.
_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_COLLECTOR = (
    rf"(?:(?:{_MONTHS}) [ \d]\d \d\d:\d\d:\d\d "
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)? )"
    r"(?:[\w.-]{1,64} [\w.@/-]{1,64}(?:\[\d{1,10}\])?: )?"
)
# docker compose's "service-1  | " (a log viewer's bare "  | " column too, vllm#6042) and
# a process tag: vLLM's "(EngineCore_DP0 pid=12) ",
# V0 workers' "(VllmWorker rank=2 pid=225) ", Ray's "(RayWorkerWrapper pid=9, ip=10.0.0.1) "
# and torchrun's "[rank3]: " in front of each line a rank prints (its --tee / log prefix).
# Ray puts its actor's tag in front of vLLM's own: "(VLLM pid=1) (VllmWorkerProcess pid=2) "
# (flashinfer#362); the inner one, the process that logged, is kept.
# A multi-node launcher's host column (pdsh, DeepSpeed's runner: "worker-1: ", nccl#1029):
# a lower-case host name with a digit or a hyphen, so no exception class ("RuntimeError: ")
# or word ("Last error: ") is taken for one.
_HOST_COLUMN = r"(?:(?=[a-z0-9.-]{0,62}[0-9-])[a-z][a-z0-9.-]{0,62}: )?"
_OUTER = re.compile(
    _HOST_COLUMN + r"(?:[\w.-]{0,80} +\| )?"
    rf"(?:{_COLLECTOR})?"
    r"(?:\[rank\d{1,6}\]: )?"
    r"(?:\((?P<proc>[^()\n]{0,80}?pid=\d{1,10}[^()\n]{0,60})\) ){0,2}"
)
_LEVELS = "DEBUG|INFO|WARNING|ERROR|CRITICAL"
_LETTER = {"E": "ERROR", "W": "WARNING", "I": "INFO", "V": "DEBUG", "F": "FATAL", "D": "DEBUG"}
_FORMATS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # vLLM: V1 "LEVEL MM-DD HH:MM:SS [file:line] msg", V0 "LEVEL MM-DD HH:MM:SS file:line] msg"
    (
        "vllm",
        re.compile(
            rf"(?P<level>{_LEVELS}) (?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) "
            r"\[?(?P<logger>[^\]:\s]{1,200}):\d{1,7}\] ?(?P<msg>.*)"
        ),
    ),
    # uvicorn (in front of vLLM and SGLang): "INFO:     127.0.0.1:5000 - \"GET / HTTP/1.1\" 200"
    ("uvicorn", re.compile(rf"(?P<level>{_LEVELS}):(?P<sp> +)(?P<msg>.*)")),
    # Python's logging.basicConfig: "ERROR:root:msg"
    ("python", re.compile(rf"(?P<level>{_LEVELS}):(?P<logger>[\w.]{{1,200}}):(?P<msg>.*)")),
    # SGLang: "[2026-12-05 08:00:00 DP0 TP0] msg", no level
    (
        "sglang",
        re.compile(
            r"\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)(?: [A-Z_]{1,12}\d{1,5})*\] "
            r"(?P<msg>.*)"
        ),
    ),
    # PyTorch's c10 logging: "[rank0]:[E219 12:00:00.123456789 ProcessGroupNCCL.cpp:629] msg",
    # older "[E ProcessGroupNCCL.cpp:474] msg"
    (
        "pytorch",
        re.compile(
            r"(?:\[rank\d{1,6}\]:)?\[(?P<letter>[EWIF])(?P<stamp>\d{3,4} \d\d:\d\d:\d\d\.\d+)?"
            r"(?: \d{1,10})? ?(?P<logger>[\w.]{1,200}\.(?:cpp|cc|h|hpp|cu)):\d{1,7}\] ?(?P<msg>.*)"
        ),
    ),
    # NCCL: "host:pid:tid [dev] [file:line (func) ]NCCL WARN msg"
    (
        "nccl",
        re.compile(
            r"(?:\S{1,64} )?[\w.-]{1,255}:\d{1,10}:\d{1,10} \[\d{1,4}\] "
            r"(?:(?P<logger>[\w./-]{1,200}):\d{1,7} (?:\(\w{1,100}\) )?)?"
            r"NCCL (?P<level>WARN|INFO|TRACE|ABORT) ?(?P<msg>.*)"
        ),
    ),
    # TensorRT's Python logger "[08/01/2022-15:41:44] [TRT] [E] msg", trtexec "[E] [TRT] msg"
    (
        "tensorrt",
        re.compile(
            r"(?:\[(?P<stamp>\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d)\] )?"
            r"(?:\[TRT\] \[(?P<letter>[EWIVF])\]|\[(?P<letter2>[EWIVF])\] \[TRT\]) ?(?P<msg>.*)"
        ),
    ),
    # TensorRT-LLM: "[TensorRT-LLM][ERROR] msg", "<stamp> [TRT-LLM] [E] [rank] msg", and the
    # PyTorch backend's "<stamp> [TRT-LLM] [RANK 0] [E] msg" (TensorRT-LLM#5389)
    (
        "trtllm",
        re.compile(
            r"(?:\[?(?P<stamp>[\d/: .-]{8,40})\]? )?(?:\[TensorRT-LLM\](?:\[[^\]]{0,20}\])?"
            r"\[(?P<level>ERROR|WARNING|INFO|DEBUG|VERBOSE|TRACE)\]"
            r"|\[TRT-LLM\] (?:\[RANK \d{1,6}\] )?\[(?P<letter>[EWIVF])\]) ?(?P<msg>.*)"
        ),
    ),
    # ONNX Runtime: "2024-03-27 06:33:23.219728338 [E:onnxruntime:Default, file.cc:123 Func] msg"
    (
        "onnxruntime",
        re.compile(
            r"(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{1,9}) \[(?P<letter>[VIWEF]):onnxruntime:"
            r"[^,\]]{0,100},? ?(?P<logger>[\w.]{1,200})?(?::\d{1,7})?[^\]]{0,200}\] ?(?P<msg>.*)"
        ),
    ),
    # glog, as Triton writes it: "E1220 01:42:16.589091 100348 model_lifecycle.cc:818] msg"
    (
        "triton",
        re.compile(
            r"(?P<letter>[EWIF])(?P<stamp>\d{3,4} \d\d:\d\d:\d\d\.\d+) +\d{1,10} "
            r"(?P<logger>[\w.]{1,200}):\d{1,7}\] ?(?P<msg>.*)"
        ),
    ),
)
# uvicorn's access log: `%(client_addr)s - "%(request_line)s" %(status_code)s`; the request
# line runs to the last `HTTP/x" NNN`, whatever quotes the path holds.
# SGLang puts its stamp in front and keeps uvicorn's level: "[2025-09-03 18:33:31] INFO:  ..."
_ACCESS = re.compile(
    rf'(?:(?:{_LEVELS}):\s+)?\S{{0,300}} - ".{{0,8192}} HTTP/\d(?:\.\d)?" \d{{3}}\b'
)
# Request logging (vLLM's request_logger.py / V0 entrypoints/logger.py, SGLang's
# --log-requests): the prompt, the parameters and the output a client sent or steered.
_REQUEST_LOG = (
    "Received request ",
    "Generated response ",
    "Request details",
    "Receive: obj=",
    "Finish: obj=",
    "Finish: meta_info=",
)
_UVICORN_LEVEL = re.compile(rf"(?P<level>{_LEVELS}):\s+")
_REQUEST_LOGGERS = frozenset({"logger.py", "request_logger.py"})
MAX_SPLIT_CHARS = 65536


def split_record(line: str) -> Head:
    """The line's emitter, level, logger and message; bounded: a longer line is cut first."""
    text = line[:MAX_SPLIT_CHARS]
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    text = text.rstrip("\r\n")
    outer = _OUTER.match(text)
    proc = ""
    body = text
    if outer is not None and outer.end():
        proc = outer.group("proc") or ""
        body = text[outer.end() :]
    for emitter, pattern in _FORMATS:
        m = pattern.match(body)
        if m is None:
            continue
        g = m.groupdict()
        letter = g.get("letter") or g.get("letter2")
        level = _LETTER[letter] if letter else (g.get("level") or "")
        msg = g["msg"]
        user = _user_text(emitter, g.get("logger") or "", msg)
        if emitter == "sglang" and not user:
            # uvicorn's own records behind SGLang's stamp carry uvicorn's level
            inner = _UVICORN_LEVEL.match(msg)
            if inner is not None:
                level, msg = inner.group("level"), msg[inner.end() :]
        return Head(emitter, level, g.get("logger") or "", msg, proc, g.get("stamp") or "", user)
    return Head("", "", "", body, proc, "", _ACCESS.match(body) is not None)


def _user_text(emitter: str, logger: str, msg: str) -> bool:
    if emitter in ("uvicorn", "vllm", "python", "sglang") and " HTTP/" in msg:
        if _ACCESS.match(msg) is not None:
            return True
    if logger in _REQUEST_LOGGERS or emitter in ("vllm", "sglang", "python", ""):
        return msg.startswith(_REQUEST_LOG)
    return False
