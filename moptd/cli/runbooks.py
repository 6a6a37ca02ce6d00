"""The runbooks shipped with moptd: `moptd/runbooks` in a wheel, else the repository's
docs/runbooks (one `CODE.md` per diagnosis code, held complete by tools/check_runbooks.py)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

_CODE = re.compile(r"[A-Z][A-Z0-9_]*")


def runbooks_dir() -> Path:
    packaged = Path(str(resources.files("moptd") / "runbooks"))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "docs" / "runbooks"


def runbook_path(code: str) -> Path | None:
    if not _CODE.fullmatch(code):
        return None
    path = runbooks_dir() / f"{code}.md"
    return path if path.is_file() else None
