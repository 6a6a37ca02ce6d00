"""Durations with units, as operators write them: 500ms, 15s, 5m, 1h, 1d, 1h30m."""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str | int | float) -> float:
    """Seconds in a duration; a bare number is seconds. Raises ValueError with the reason."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        if not math.isfinite(text):
            raise ValueError(f"duration must be a finite number: {text}")
        if text < 0:
            raise ValueError(f"duration must not be negative: {text}")
        return float(text)
    s = str(text).strip()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"duration must be a finite number: {s}")
        if value < 0:
            raise ValueError(f"duration must not be negative: {s}")
        return value
    pos = 0
    total = 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise ValueError(
            f"not a duration: {s!r} (use a number of seconds or e.g. 500ms, 15s, 5m, 1h)"
        )
    return total


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    out = []
    rest = round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(out) or "0s"
