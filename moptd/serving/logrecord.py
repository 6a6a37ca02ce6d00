"""One recognised serving-log line (``LogRecord``) and the parts a line parser is made of.

Kept apart from logparse.py so an engine module (moptd/serving/engines/) can declare the
parsers of its own log lines without importing the parser that runs them.
"""

from __future__ import annotations

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
