"""A small, fast parser for the Prometheus text exposition format (0.0.4).

prometheus_client's own parser takes about 8 ms for a real vLLM page; this one keeps only
what moptd reads (name, labels, value) and parses the same page in well under a
millisecond. It accepts the colons vLLM and SGLang put in metric names. A line that is not
a sample, a comment or blank makes the whole page invalid: a half-understood scrape is
worse than a failed one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import NamedTuple

from moptd.observations import Labels

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_NAME_RE = re.compile(_NAME)
_TIMESTAMP = re.compile(r"-?\d+")
# Possessive quantifiers: with a plain `(?:[^"\\]|\\.)*` the regex engine keeps a
# backtracking state per character, and one 6 MiB label value took 1 GiB and 4 s.
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]++|\\.)*+)"[ \t]*(,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_SPECIAL = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


class PromParseError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


class PromLimitError(PromParseError):
    """The page breaks a scrape limit (``ScrapeLimits``); ``limit`` names which."""

    def __init__(self, line: int, limit: str, message: str) -> None:
        super().__init__(line, f"{message} ({limit})")
        if not line:  # a limit on the page as a whole, found after its lines were read
            self.args = (f"{message} ({limit})",)
        self.limit = limit


class ScrapeLimits(NamedTuple):
    """Prometheus's scrape limits of the same names. A page that breaks one is refused
    whole, as Prometheus fails such a scrape: a page cut short would read as a healthy
    engine with fewer requests. 0 turns a limit off (``NO_LIMITS``: saved pages, tests);
    the configuration asks for a positive number."""

    sample_limit: int = 20000
    label_limit: int = 128
    label_name_length_limit: int = 256
    label_value_length_limit: int = 4096


NO_LIMITS = ScrapeLimits(0, 0, 0, 0)


class PromSample(NamedTuple):
    name: str
    labels: Labels
    value: float


# PromSample(...) runs the NamedTuple's __new__, a Python function: a tenth of a page's
# parse; tuple.__new__ makes the same PromSample without it
_new_sample = tuple.__new__


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], value)


def parse_labels(text: str, line: int = 0) -> Labels:
    """``a="1",b="x\\"y"`` -> (("a", "1"), ("b", 'x"y')), sorted."""
    out: list[tuple[str, str]] = []
    pos, end = 0, len(text)
    while pos < end:
        m = _LABEL.match(text, pos)
        if m is None:
            if text[pos:].strip() in ("", ","):
                break
            raise PromParseError(line, f"bad label set {{{text[:80]}}}")
        out.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    out.sort()
    return tuple(out)


def parse_value(text: str, line: int = 0) -> float:
    special = _SPECIAL.get(text)
    if special is not None:
        return special
    try:
        return float(text)
    except ValueError:
        raise PromParseError(line, f"bad sample value {text[:40]!r}") from None


# A page repeats the same few label sets on every scrape (model_name, engine, le=...), and
# the same names: remembering them is what keeps a scrape well under a millisecond.
# Both are bounded in entries and in what one entry may hold: a page whose label values
# change every scrape must not turn the caches into the memory leak they would then be.
_LABEL_CACHE: dict[str, Labels] = {}
_NAMES: set[str] = set()
_CACHE_MAX = 8192
_CACHED_BODY_MAX = 2048  # vLLM's longest label set (cache_config_info) is about 1 KiB
_CACHED_NAME_MAX = 256


def _labels_cached(body: str, line: int) -> Labels:
    got = _LABEL_CACHE.get(body)
    if got is None:
        got = parse_labels(body, line)
        if len(body) <= _CACHED_BODY_MAX:
            if len(_LABEL_CACHE) >= _CACHE_MAX:
                _LABEL_CACHE.clear()
            _LABEL_CACHE[body] = got
    return got


def _check_name(name: str, line: int) -> None:
    if name not in _NAMES:
        if _NAME_RE.fullmatch(name) is None:
            raise PromParseError(line, f"bad metric name {name[:80]!r}")
        if len(name) <= _CACHED_NAME_MAX:
            if len(_NAMES) >= _CACHE_MAX:
                _NAMES.clear()
            _NAMES.add(name)


def _check_labels(labels: Labels, body: str, limits: ScrapeLimits, line: int) -> None:
    if limits.label_limit and len(labels) > limits.label_limit:
        raise PromLimitError(
            line, "label_limit", f"{len(labels)} labels, more than {limits.label_limit}"
        )
    names, values = limits.label_name_length_limit, limits.label_value_length_limit
    # no label of a body shorter than both limits can break either: most lines stop here
    if (not names or len(body) <= names) and (not values or len(body) <= values):
        return
    for k, v in labels:
        if names and len(k) > names:
            raise PromLimitError(
                line, "label_name_length_limit", f"label name {k[:40]!r}... longer than {names}"
            )
        if values and len(v) > values:
            raise PromLimitError(
                line, "label_value_length_limit", f"value of label {k[:40]!r} longer than {values}"
            )


# vLLM's longest line (cache_config_info) is about 1 KiB. A longer line is not a metrics page,
# and refusing it bounds what one line can cost the parser (split, label list).
MAX_LINE = 64 << 10


def iter_samples(text: str, limits: ScrapeLimits = NO_LIMITS) -> Iterator[PromSample]:
    """The samples of a page in order; PromParseError (PromLimitError for a limit) names
    the first line at fault."""
    sample_limit = limits.sample_limit
    count = 0
    label_checks = limits.label_limit or limits.label_name_length_limit
    label_checks = label_checks or limits.label_value_length_limit
    # The two caches' hits and parse_value are inlined below (a replay parses hundreds of
    # thousands of lines; the calls were a third of the parse): what misses goes through
    # _labels_cached, _check_name and parse_value as before, so every error is theirs.
    cached_labels, names, special = _LABEL_CACHE.get, _NAMES, _SPECIAL.get
    for lineno, raw in enumerate(text.split("\n"), 1):
        if len(raw) > MAX_LINE:
            raise PromParseError(lineno, f"line longer than {MAX_LINE} characters")
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            close = line.rfind("}")
            if close < brace:
                raise PromParseError(lineno, f"not a sample: {line[:80]!r}")
            name = line[:brace].rstrip()
            body = line[brace + 1 : close]
            labels = cached_labels(body)
            if labels is None:
                labels = _labels_cached(body, lineno)
            if label_checks:
                _check_labels(labels, body, limits, lineno)
            rest = line[close + 1 :].split()
        else:
            rest = line.split()
            name, labels = rest.pop(0), ()
        if len(rest) != 1 and (len(rest) != 2 or not _TIMESTAMP.fullmatch(rest[1])):
            raise PromParseError(lineno, f"not a sample: {line[:80]!r}")
        if name not in names:
            _check_name(name, lineno)
        count += 1
        if sample_limit and count > sample_limit:
            raise PromLimitError(lineno, "sample_limit", f"more than {sample_limit} samples")
        value = special(rest[0])
        if value is None:
            try:
                value = float(rest[0])
            except ValueError:
                raise PromParseError(lineno, f"bad sample value {rest[0][:40]!r}") from None
        yield _new_sample(PromSample, (name, labels, value))


def parse(text: str, limits: ScrapeLimits = NO_LIMITS) -> list[PromSample]:
    """Every sample of a page. Raises PromParseError naming the first bad line."""
    return list(iter_samples(text, limits))
