"""Error records no pattern classifies: never silent (UNCLASSIFIED_ERROR).

An error record is a record at ERROR, CRITICAL or FATAL, or the final line of a Python
traceback (``module.SomeError: message``). The tracker follows tracebacks over lines (their
frames are no error records of their own, whatever level vLLM's NewLineFormatter repeats on
them) and the lines that continue an exception's message under the same prefix. What the
parsers classify is not unclassified; what an emitter catalog calls benign
(moptd/catalog/emitters/) is not either. The rest becomes a ``serving.unclassified_error``
record quoting the message, with the distinct messages so far deduplicated, counted and
bounded, so a finding can quote them all without the log growing its memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from moptd.catalog.emitters import BENIGN, lookup
from moptd.serving.logrecord import Head, LogRecord

STREAM = "serving.unclassified_error"
ERROR_LEVELS = frozenset({"ERROR", "CRITICAL", "FATAL"})
MAX_DISTINCT = 64  # distinct messages counted; past it they are counted as "others"
QUOTED = 5  # distinct messages a record's summary quotes
QUOTE_CHARS = 240
# A traceback's final line: an exception class (dotted) and its message, or the bare name.
_EXC_LINE = re.compile(
    r"[A-Za-z_][\w.]{0,200}(?:Error|Exception|Exit|Interrupt|Fault|Failure|Group|Warning)"
    r"(?:: .*)?$"
)
_TB_START = "Traceback (most recent call last)"
# pydantic's ValidationError says what failed on the lines under its first: "1 validation
# error for ModelConfig", then (after the field's name, where there is one) "  Value error,
# User-specified max_model_len ..." (vLLM's config checks since its configs became pydantic
# dataclasses). The indented detail is the message; "For further information visit ..." is
# pydantic's link, never it.
_DETAIL_BELOW = re.compile(r"\d+ validation errors? for \S+$")
_FIELD_NAME = re.compile(r"[\w.\[\]-]{1,100}$")
_PYDANTIC_LINK = "For further information visit"
_FRAME = re.compile(r'\s*File "(?:[^"]{0,400}/)?(?P<file>[^"/]{1,200})", line \d+')
_CHAIN = (
    "During handling of the above exception",
    "The above exception was the direct cause",
)
# Which catalogs a record of an emitter is matched against: its own, and those whose
# strings arrive inside other emitters' messages (a CUDA string inside PyTorch's error,
# PyTorch's exception inside vLLM's traceback, NCCL's result inside PyTorch's).
_EMBEDDED = ("pytorch", "cuda", "nccl", "python")
_SERVING = ("vllm", "sglang", "tensorrt", "trtllm", "triton", "onnxruntime", "uvicorn")
_CATALOGS = {e: (e, *_EMBEDDED) for e in _SERVING} | {"triton": ("triton", "trtllm", *_EMBEDDED)}


def _catalogs_of(emitter: str) -> tuple[str, ...]:
    return _CATALOGS.get(emitter) or (*_SERVING, *_EMBEDDED)


@dataclass
class ErrorTracker:
    in_traceback: bool = False
    traceback_emitter: str = ""
    frame_file: str = ""  # the file of the traceback's innermost frame so far
    tail: tuple[str, ...] = ()  # the prefix of the last final line: its message goes on under it
    seen: dict[str, int] = field(default_factory=dict)
    others: int = 0
    final: bool = False  # the last error message was a traceback's final line
    # a final line whose message is on the lines under it (_DETAIL_BELOW): it waits for
    # them, and is the message itself where they do not come
    header: str = ""
    field_lines: int = 0

    def error_message(self, head: Head) -> str | None:
        """The message of an error record, or None; follows tracebacks across lines."""
        msg = head.message.strip()
        key = (head.proc, head.stamp, head.logger, head.level) if head.stamp else ()
        if self.header:
            return self._detail(head, msg)
        if _TB_START in msg:
            self.in_traceback, self.tail = True, ()
            self.traceback_emitter, self.frame_file = head.emitter, ""
            return None
        if self.in_traceback:
            frame = _FRAME.match(head.message)
            if frame is not None:
                self.frame_file = frame.group("file")
            if not msg or head.message[:1] in " \t" or msg.startswith(_CHAIN):
                return None
            if _EXC_LINE.match(msg) is not None:
                self.in_traceback, self.tail = False, key
                self.final = True
                if _DETAIL_BELOW.search(msg) is not None:
                    self.header, self.field_lines = msg, 0
                    return None
                return msg
            if head.emitter and head.level not in ERROR_LEVELS:
                return None  # another process's record between the frames
            self.in_traceback = False
        headless = _FRAME.match(head.message) if not head.emitter else None
        if headless is not None:
            # a traceback's frame with no record prefix and no "Traceback" line above it
            # (a paste cut inside the traceback, TensorRT-LLM#7706): its final line follows
            self.in_traceback, self.traceback_emitter, self.tail = True, "", ()
            self.frame_file = headless.group("file")
            return None
        if msg.startswith(_CHAIN):
            # the line between two chained exceptions, under the prefix of the first one's
            # final line (vLLM repeats ERROR on every line: rhymes-ai/Aria#24): no error itself
            self.in_traceback, self.tail = False, ()
            return None
        if head.level in ERROR_LEVELS and head.message[:1] in (" ", "\t"):
            # a frame or a source line of a traceback whose first line the log does not
            # hold (a paste that starts inside it): what follows may be its final line
            self.in_traceback, self.traceback_emitter = True, head.emitter
            return None
        if key and key == self.tail:
            return None  # the exception's message goes on over lines under one prefix
        self.tail, self.final = (), False
        return msg if head.level in ERROR_LEVELS and msg else None

    def _detail(self, head: Head, msg: str) -> str | None:
        """The message of a ValidationError: its first indented detail line, else (the
        detail never came) its first line."""
        if msg and head.message[:1] in " \t" and not msg.startswith(_PYDANTIC_LINK):
            self.header = ""
            return msg
        if _FIELD_NAME.match(msg) is not None and self.field_lines < 3:
            self.field_lines += 1
            return None
        header, self.header = self.header, ""
        return header

    def pending(self) -> str | None:
        """A ValidationError's first line still waiting for its detail when the log ends."""
        header, self.header = self.header, ""
        return header or None

    def unclassified(self, head: Head, msg: str) -> LogRecord | None:
        """The record of an unclassified error message, None for a benign one."""
        emitter = head.emitter or self.traceback_emitter
        known = lookup(_catalogs_of(emitter), msg)
        if known is not None and known.code == BENIGN:
            return None
        quote = msg[:QUOTE_CHARS]
        if quote in self.seen:
            self.seen[quote] += 1
        elif len(self.seen) < MAX_DISTINCT:
            self.seen[quote] = 1
        else:
            self.others += 1
        return LogRecord(
            STREAM,
            {
                "emitter": emitter or "python",
                "level": head.level or "traceback",
                "file": (self.frame_file if self.final else "") or head.logger or "-",
                "message": quote,
                "distinct": float(len(self.seen) + (1 if self.others else 0)),
                "messages": self.summary(),
            },
        )

    def summary(self) -> str:
        """The most frequent distinct messages, quoted with their counts, bounded."""
        top = sorted(self.seen.items(), key=lambda kv: -kv[1])[:QUOTED]
        parts = [f'"{m}" x{n}' for m, n in top]
        rest = len(self.seen) - len(top) + (1 if self.others else 0)
        if rest > 0:
            parts.append(f"and {rest} more distinct")
        return "; ".join(parts)
