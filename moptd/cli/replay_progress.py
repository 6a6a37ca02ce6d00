"""Progress of a long replay on a terminal: on stderr, only when it is a terminal, so
that nothing of it reaches a pipe, a file or ``--json`` output."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from moptd.diagnose.timeline import Timeline

_EVERY = 0.25  # seconds of wall time between two updates of the line


class TerminalProgress:
    """Passed to ``moptd.diagnose.replay.replay`` as ``progress``; call ``finish`` after."""

    def __init__(self, stream: TextIO) -> None:
        # moptd's own carriage return and erase-line: below the sanitiser that moptd.cli.main
        # puts on stderr (moptd.cli.sanitize.TerminalStream), which would show them escaped
        self.stream: TextIO = getattr(stream, "raw", stream)
        self._shown = False
        self._started = time.monotonic()

    def reading(self, what: str) -> None:
        """Says at once, before the inputs are read (a day of dumps takes a while), what is
        being read; the walk's line replaces it."""
        if not self.stream.isatty():
            return
        self._started = time.monotonic()
        self.stream.write(f"\rreading {what} ...")
        self.stream.flush()
        self._shown = True

    def __call__(self, tl: Timeline) -> Callable[[float], None] | None:
        if not self.stream.isatty():
            return None
        span = tl.span()
        if span is None or not span[1] > span[0]:
            return None
        first, last = span
        started = time.monotonic()
        shown_at = started
        read_s = started - self._started  # the reading, before the walk

        def show(t: float) -> None:
            nonlocal shown_at
            now = time.monotonic()
            if now - shown_at < _EVERY:
                return
            shown_at = now
            done = min(1.0, max(0.0, (t - first) / (last - first)))
            spent = now - started
            self.stream.write(
                f"\rreplaying: {done:4.0%} of {_duration(last - first)} of evidence, "
                f"{read_s + spent:.0f} s so far{_left(done, spent)}\x1b[K"
            )
            self.stream.flush()
            self._shown = True

        return show

    def finish(self) -> None:
        """Clears the progress line, if one was shown."""
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _left(done: float, spent: float) -> str:
    """The walk's time left at the pace so far; nothing until 2% and a second are done
    (before that the pace says little)."""
    if done < 0.02 or spent < 1.0:
        return ""
    return f", about {spent * (1 - done) / done:.0f} s left"
