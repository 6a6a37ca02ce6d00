"""One sanitiser between evidence and a terminal (issue 30, item 4).

What it escapes is moptd.termsafe's (C0/C1 controls, DEL, bidi controls; tab and newline
stay). ``for_terminal`` applies it to every string of a view (dicts, lists, tuples,
dataclasses) before a renderer gets it; ``--json`` never goes through it, so scripts get the
exact text (json.dump writes every control character as a \\u escape of its own).
``TerminalStream`` applies it to everything written to stderr (moptd.cli.main wraps it):
an error message that quotes evidence (a file name from a tarball, a value from a pasted
file) is escaped without each call site knowing. Idempotent: what it writes is printable
(a backslash is not escaped, so an escape it wrote reads back as itself).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any, TextIO, TypeVar

from moptd.termsafe import escape_text

__all__ = ["TerminalStream", "escape_text", "for_terminal"]
T = TypeVar("T")


def for_terminal(value: T) -> T:
    """A copy of a view (dicts, lists, tuples, dataclasses of them) with every string escaped."""
    return _walk(value)  # type: ignore[no-any-return]


def _walk(value: Any) -> Any:
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, dict):
        return {_walk(k): _walk(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_walk(v) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: _walk(getattr(value, f.name)) for f in fields(value)})
    return value


class TerminalStream:
    """A text stream that escapes what is written to it. ``raw`` is the stream below, for
    the one writer that means its control bytes (the replay progress line's erase)."""

    def __init__(self, stream: TextIO) -> None:
        self.raw = stream

    def write(self, text: str) -> int:
        self.raw.write(escape_text(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)
