"""The sanitiser between evidence and a terminal (moptd.termsafe, moptd.cli.sanitize).

What it guarantees, for any string:
- its output holds no C0 control but tab and newline (none at all with newline=False),
  no DEL, no C1 control and no bidi control (marks, embeddings, overrides, isolates);
- printable text (anything else, non-ASCII letters and a backslash included) is unchanged;
- it is idempotent: escaping what it wrote changes nothing;
- it loses nothing: each escape reads back (as a Python string escape) to the character.
"""

from __future__ import annotations

import io
import logging
import re
import sys

from hypothesis import given
from hypothesis import strategies as st

from moptd.cli.sanitize import TerminalStream, for_terminal
from moptd.daemon.sdnotify import JournalPrefixFormatter, TimestampFormatter
from moptd.termsafe import escape_text, is_safe

BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029{BIDI}]")
UNSAFE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{BIDI}]")
HOSTILE = st.sampled_from(
    ["\x1b[2J", "\x1b]52;c;AAAA\x07", "\x9b31m", "\u202e", "\r", "\b", "\x00", "\x7f", "\x85"]
)
# text with the hostile pieces mixed in (any code point but surrogates)
TEXT = st.lists(st.one_of(st.text(), HOSTILE)).map("".join)


@given(TEXT)
def test_output_holds_no_control_but_tab_and_newline(text):
    out = escape_text(text)
    assert not UNSAFE.search(out)
    assert is_safe(out)
    line = escape_text(text, newline=False)
    assert not UNSAFE_LINE.search(line.replace("\t", ""))
    assert "\n" not in line


@given(st.text().filter(lambda t: not UNSAFE.search(t)))
def test_printable_text_is_unchanged(text):
    assert escape_text(text) == text


@given(TEXT)
def test_idempotent(text):
    once = escape_text(text)
    assert escape_text(once) == once
    line = escape_text(text, newline=False)
    assert escape_text(line, newline=False) == line


@given(TEXT.filter(lambda t: "\\" not in t))
def test_each_escape_reads_back(text):
    # without a backslash of its own, the escaped text is the original as a Python literal
    out = escape_text(text, newline=False)
    assert out.encode("latin-1", "backslashreplace").decode("unicode_escape") == text


def test_what_it_shows():
    assert escape_text("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert escape_text("\x9b32m\u202eX\u202c") == "\\x9b32m\\u202eX\\u202c"
    assert escape_text("tab\tnew\nline") == "tab\tnew\nline"
    assert escape_text("new\nline", newline=False) == "new\\x0aline"
    # letters of any script, and what looks like an escape, stay as written
    assert escape_text("GPU の温度 \\x1b Ü") == "GPU の温度 \\x1b Ü"


@given(st.recursive(TEXT, lambda inner: st.lists(inner) | st.dictionaries(TEXT, inner)))
def test_for_terminal_reaches_every_string(view):
    def strings(v):
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for k, x in v.items():
                yield k
                yield from strings(x)
        elif isinstance(v, list):
            for x in v:
                yield from strings(x)

    assert all(not UNSAFE.search(s) for s in strings(for_terminal(view)))


def test_stderr_stream_escapes_and_passes_the_rest_through():
    raw = io.StringIO()
    stream = TerminalStream(raw)
    print("moptd: bad member ../\x1b[2J\u202e.txt", file=stream)  # type: ignore[arg-type]
    assert raw.getvalue() == "moptd: bad member ../\\x1b[2J\\u202e.txt\n"
    assert stream.raw is raw
    assert stream.getvalue() == raw.getvalue()  # anything else is the stream's


def test_daemon_log_record_is_one_line_without_controls():
    """The daemon's log (a terminal or journald) quotes kernel records: a newline in one is
    no journal record of its own, with a priority it chose, and an ESC moves no cursor."""
    record = logging.LogRecord(
        "moptd.kernel", logging.WARNING, __file__, 1, "record %s",
        ("Xid 79\x1b[2J\n<0>moptd: ALL GPUS HEALTHY \u202e",), None,
    )
    for formatter in (JournalPrefixFormatter("%(message)s"), TimestampFormatter("%(message)s")):
        out = formatter.format(record)
        assert "\n" not in out
        assert not UNSAFE.search(out)
        assert "\\x1b[2J\\x0a<0>moptd: ALL GPUS HEALTHY \\u202e" in out
    try:
        raise ValueError("bad \x1b]52;c;AAAA\x07")
    except ValueError:
        record.exc_info = sys.exc_info()
    out = JournalPrefixFormatter("%(message)s").format(record)
    assert not UNSAFE.search(out)
    assert out.splitlines()[-1] == "<4>ValueError: bad \\x1b]52;c;AAAA\\x07"
