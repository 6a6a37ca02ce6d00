"""What a terminal or a journal may be shown of an untrusted string (issue 30, item 4).

Kernel records, serving logs and pasted tickets are untrusted: an ESC in them is a
clear-screen, a cursor move or an OSC 52 clipboard write when printed raw, a C1 byte
(0x9b) is a one-byte CSI on some terminals, a carriage return or a backspace overwrites
what was written before it, and a bidi override reorders what the reader sees.
``escape_text`` shows each such character as its escape (``\\x1b``, ``\\x9b``, ``\\u202e``);
everything else, non-ASCII letters included, is left as it was.

The bottom of the layers (moptd.daemon's log formatter and moptd.cli's renderers both use
it); the CLI's view walker is moptd.cli.sanitize.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls (0x9b is a one-byte CSI), the bidi
# marks, embeddings, overrides and isolates (U+061C, U+200E-F, U+202A-E, U+2066-9), and
# the line and paragraph separators (a journal or a pager may break a line at them)
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape_text(text: str, *, newline: bool = True) -> str:
    """The text with every control and bidi character shown as its escape; with
    ``newline=False`` a newline too (one log record is one journal line)."""
    return (_UNSAFE if newline else _UNSAFE_LINE).sub(_escape, text)


def is_safe(text: str, *, newline: bool = True) -> bool:
    """True when escape_text would leave the text as it is."""
    return (_UNSAFE if newline else _UNSAFE_LINE).search(text) is None
