"""Re-read /proc files through descriptors kept open.

The host collector reads five /proc files every run. Opening, reading and closing them cost
about 500 µs of CPU a run on the development VM (caches go cold in the second between runs);
reading them again from offset 0 through descriptors kept open costs about 130 µs. The text
is as fresh as after a new open: the kernel builds a /proc file's text when it is read from
the start. A descriptor that fails is closed, and the next read opens the file again.
"""

from __future__ import annotations

import os
from pathlib import Path

_CHUNK = 1 << 16


class OpenFiles:
    """Descriptors kept open, by path. Not thread-safe: one collector's thread uses it."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def read(self, path: Path) -> str:
        """The whole file as text; OSError as Path.read_text would raise it."""
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _read_all(fd)
        except OSError:
            self._close(path)
            raise

    def close(self) -> None:
        for path in list(self._fds):
            self._close(path)

    def _close(self, path: Path) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)


def _read_all(fd: int) -> str:
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, _CHUNK, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")
