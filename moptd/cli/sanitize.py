"""One sanitiser between evidence and a terminal (issue 30, item 4).

Kernel records, serving logs and pasted tickets are untrusted: an ESC in them is a
clear-screen, a cursor move or an OSC 52 clipboard write when printed raw, and a bidi
override reorders what the reader sees. ``for_terminal`` shows each such character escaped
(``\\x1b``, ``\\u202e``) in every string of a view before a renderer gets it; ``--json`` never
goes through it, so scripts get the exact text. Newline and tab stay: they cannot move the
cursor anywhere a line break cannot. Idempotent: what it writes is printable ASCII.
"""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

# C0 controls but tab and newline, DEL, C1 controls (0x9b is a one-byte CSI), bidi overrides,
# embeddings and isolates
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
T = TypeVar("T")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape_text(text: str) -> str:
    """The text with every control and bidi character shown as its escape."""
    return _UNSAFE.sub(_escape, text)


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
