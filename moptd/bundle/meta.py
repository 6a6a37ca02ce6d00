"""bundle.yaml: the bundle's format, host, capture time and boot time."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import yaml

from moptd.bundle.errors import BundleError

FORMAT = "moptd-bundle/v1"


def read_meta(path: Path) -> dict[str, object]:
    if not path.exists():
        return {}
    text = read_text(path)
    try:
        meta = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        raise BundleError(str(path), mark.line + 1 if mark else 1, f"YAML: {e.problem}") from None
    except yaml.YAMLError as e:
        raise BundleError(str(path), 1, f"YAML: {e}") from None
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise BundleError(str(path), 1, "bundle.yaml must be a mapping")
    fmt = meta.get("format")
    if fmt is not None and fmt != FORMAT:
        raise BundleError(str(path), _line_of(text, "format"), f"format {fmt!r} is not {FORMAT}")
    bt = meta.get("boot_time")
    if bt is not None and (isinstance(bt, bool) or not isinstance(bt, int | float)):
        raise BundleError(str(path), _line_of(text, "boot_time"), "boot_time must be Unix seconds")
    return meta


def captured_at(meta: dict[str, object], path: Path) -> float | None:
    v = meta.get("captured_at")
    if v is None:
        return None
    if isinstance(v, datetime):
        return v.timestamp()
    try:
        return datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp()
    except ValueError:
        line = _line_of(read_text(path), "captured_at")
        raise BundleError(str(path), line, f"captured_at {v!r} is not RFC 3339") from None


def read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError as e:
        raise BundleError(str(path), 0, f"cannot read: {e.strerror or e}") from None


def _line_of(text: str, key: str) -> int:
    for n, line in enumerate(text.splitlines(), start=1):
        if line.startswith(f"{key}:"):
            return n
    return 1
