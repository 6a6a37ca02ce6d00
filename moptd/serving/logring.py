"""A bounded ring of recent log lines, and a line splitter that bounds line length."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

MAX_LINE = 16384  # longer lines are cut: a flood of one endless line must not grow memory


class LogRing:
    def __init__(self, max_lines: int) -> None:
        self._lines: deque[tuple[float, str]] = deque(maxlen=max_lines)
        self.total = 0
        self.dropped = 0

    def append(self, t: float, line: str) -> None:
        if len(self._lines) == self._lines.maxlen:
            self.dropped += 1
        self._lines.append((t, line))
        self.total += 1

    def tail(self, n: int | None = None) -> list[tuple[float, str]]:
        items = list(self._lines)
        return items if n is None else items[-n:]

    def __len__(self) -> int:
        return len(self._lines)

    def __iter__(self) -> Iterator[tuple[float, str]]:
        return iter(self._lines)


class LineSplitter:
    """Bytes in, complete lines out; a line longer than MAX_LINE is cut and the rest of it
    skipped, so memory stays bounded whatever the process writes."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list[str]:
        out: list[str] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            self._take(data[start:nl], out, end=True)
            start = nl + 1
        self._take(data[start:], out, end=False)
        return out

    def flush(self) -> list[str]:
        out: list[str] = []
        if self._buf:
            out.append(self._decode(bytes(self._buf)))
        self._buf.clear()
        self._skipping = False
        return out

    def _take(self, piece: bytes, out: list[str], end: bool) -> None:
        if not self._skipping:
            room = self.max_line - len(self._buf)
            self._buf += piece[:room]
            if len(piece) > room:
                out.append(self._decode(bytes(self._buf)))
                self._buf.clear()
                self._skipping = True
        if end:
            if not self._skipping:
                out.append(self._decode(bytes(self._buf)))
            self._buf.clear()
            self._skipping = False

    @staticmethod
    def _decode(raw: bytes) -> str:
        return raw.decode("utf-8", "replace").rstrip("\r")
