"""The one shape of an input error: the file, the line (0: the file as a whole) and what is
wrong, printed as ``FILE:LINE: message`` so an operator can open the place."""

from __future__ import annotations

from pathlib import Path


class LocatedError(Exception):
    def __init__(self, file: Path | str, line: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}")
        self.file = str(file)
        self.path = Path(file)
        self.line = line
        self.message = message
