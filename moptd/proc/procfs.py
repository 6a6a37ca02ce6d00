"""Parsers for the /proc files the host collector and bundle replay both read.

Each takes the file's text and returns plain numbers; malformed lines are skipped, never
raised on, because a half-written or foreign file must not take a collector down.
"""

from __future__ import annotations

import re
from collections.abc import Collection

_MEMINFO_LINE = re.compile(r"^(\w[\w()]*):\s+([0-9]+)(?:\s+kB)?\s*$", re.ASCII)
_INT = re.compile(r"-?[0-9]+")


def _int(text: str) -> int | None:
    """An ASCII decimal integer (str.isdigit would also accept '¹' and other digits)."""
    return int(text) if _INT.fullmatch(text) else None


# What str.splitlines splits on besides "\n" (a real /proc file has none of them; `in`
# for each is 20 times faster than a regular expression's character class over vmstat).
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def _lines_holding(text: str, keys: Collection[str] | None) -> list[str]:
    """The lines of `text` (as str.splitlines cuts them) that may concern `keys`: every
    line when keys is None, else those holding one of the keys, in order. The host
    collector wants four of meminfo's fifty lines and two of vmstat's two hundred every
    second; splitting each line was most of its CPU (issue 32). str.find, not a regular
    expression: an alternation of the keys tried at every offset cost as much as the split."""
    if (
        keys is None
        or not all(k and "\n" not in k for k in keys)  # no line could hold such a key
        or any(c in text for c in _OTHER_BREAKS)
    ):
        return text.splitlines()
    starts: set[int] = set()  # where each line holding a key begins
    for key in keys:
        at = text.find(key)
        while at >= 0:
            starts.add(text.rfind("\n", 0, at) + 1)
            end = text.find("\n", at)
            at = -1 if end < 0 else text.find(key, end)
    lines: list[str] = []
    for start in sorted(starts):
        end = text.find("\n", start)
        lines.append(text[start:] if end < 0 else text[start:end])
    return lines


def parse_meminfo(text: str, keys: Collection[str] | None = None) -> dict[str, int]:
    """/proc/meminfo -> bytes by key (values in kB are converted); only `keys` when given,
    which skips the lines that hold none of them."""
    out: dict[str, int] = {}
    for line in _lines_holding(text, keys):
        if keys is not None and line.partition(":")[0].strip() not in keys:
            continue
        m = _MEMINFO_LINE.match(line.strip())
        if m:
            value = int(m.group(2))
            out[m.group(1)] = value * 1024 if line.rstrip().endswith("kB") else value
    return out


def parse_keyvalue_ints(text: str, keys: Collection[str] | None = None) -> dict[str, int]:
    """/proc/vmstat and kin: 'key value' lines -> ints; only `keys` when given (vmstat has
    some 190 lines, and parsing each number cost most of the host collector's time)."""
    out: dict[str, int] = {}
    for line in _lines_holding(text, keys):
        parts = line.split()
        if len(parts) != 2 or (keys is not None and parts[0] not in keys):
            continue
        value = _int(parts[1])
        if value is not None:
            out[parts[0]] = value
    return out


def parse_cpu_times(text: str) -> tuple[float, float] | None:
    """/proc/stat 'cpu' line -> (busy, total) jiffies, or None if absent."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = line.split()[1:]
            try:
                values = [float(x) for x in fields[:10]]
            except ValueError:
                return None
            if len(values) < 4:
                return None
            idle = values[3] + (values[4] if len(values) > 4 else 0.0)  # idle + iowait
            total = sum(values[:8])  # guest time is already counted in user/nice
            return total - idle, total
    return None


def parse_btime(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("btime "):
            value = line.split()[1:2]
            if value:
                return _int(value[0])
    return None


def parse_loadavg(text: str) -> tuple[float, float, float] | None:
    parts = text.split()
    try:
        return float(parts[0]), float(parts[1]), float(parts[2])
    except (IndexError, ValueError):
        return None


def parse_int(text: str) -> int | None:
    return _int(text.strip())


def parse_df(text: str) -> list[dict[str, object]]:
    """`df -P` output -> [{filesystem, size, used, available, mount}] in bytes."""
    out: list[dict[str, object]] = []
    lines = text.splitlines()
    if not lines:
        return out
    header = lines[0].split()
    block = 1024
    if len(header) > 1 and header[1].endswith("-blocks"):
        block = _int(header[1].split("-")[0]) or 1024
    for line in lines[1:]:
        parts = line.split()
        if len(parts) < 6:
            continue
        numbers = [_int(parts[i]) for i in (1, 2, 3)]
        if any(n is None for n in numbers):
            continue
        size_b, used_b, avail_b = (n * block for n in numbers if n is not None)
        out.append(
            {
                "filesystem": parts[0],
                "size": size_b,
                "used": used_b,
                "available": avail_b,
                "mount": " ".join(parts[5:]),
            }
        )
    return out
