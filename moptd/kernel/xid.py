"""The Xid catalog (xid_catalog.yaml), loaded and validated once.

The catalog is data so that a reviewer can check it against NVIDIA's table line by line
and so that a site can see, in one file, where moptd departs from other tools.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from moptd import yamlsafe

CATALOG_PATH = Path(__file__).with_name("xid_catalog.yaml")

# The codes of docs/diagnosis-codes.md an Xid may lead to (a subset of all codes).
XID_DIAGNOSES = frozenset(
    {
        "GPU_LOST",
        "ECC_UNCORRECTABLE",
        "ECC_CORRECTABLE_RATE_HIGH",
        "ROW_REMAP_PENDING",
        "ROW_REMAP_FAILURE",
        "NVLINK_ERROR",
        "GPU_RESET_REQUIRED",
        "GSP_FIRMWARE_ERROR",
        "XID_APPLICATION_FAULT",
        "HW_SLOWDOWN",
        "PCIE_REPLAY_RATE_HIGH",
    }
)
LAYERS = frozenset(
    {
        "application",
        "driver",
        "firmware",
        "memory",
        "link",
        "bus",
        "power",
        "hardware",
        "virtualization",
        "informational",
        "unused",
    }
)
_REQUIRED = ("code", "mnemonic", "meaning", "immediate_action", "investigatory_action", "layer")
_OPTIONAL = ("diagnoses", "notes")


class XidCatalogError(ValueError):
    """The catalog file is malformed; the message names the file, line and key."""


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    mnemonic: str
    meaning: str
    immediate_action: str | None
    investigatory_action: str | None
    layer: str
    diagnoses: tuple[str, ...] = ()
    notes: str = ""


def unknown_xid(code: int) -> XidInfo:
    """What to say about a code newer than the catalog: nothing we cannot back up."""
    return XidInfo(code, "UNKNOWN", f"Xid {code} (not in moptd's catalog)", None, None, "unknown")


def _lines(node: yaml.Node) -> dict[int, tuple[int, dict[str, int]]]:
    """Entry index -> (line of the entry, line of each key), for error messages."""
    out: dict[int, tuple[int, dict[str, int]]] = {}
    if not isinstance(node, yaml.MappingNode):
        return out
    for key, value in node.value:
        if key.value == "xids" and isinstance(value, yaml.SequenceNode):
            for i, item in enumerate(value.value):
                keys = {}
                if isinstance(item, yaml.MappingNode):
                    keys = {str(k.value): k.start_mark.line + 1 for k, _ in item.value}
                out[i] = (item.start_mark.line + 1, keys)
    return out


def parse_catalog(text: str, source: str = "xid_catalog.yaml") -> dict[int, XidInfo]:
    try:
        root = yamlsafe.compose(text)
        data = yamlsafe.load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise XidCatalogError(f"{source}{where}: not valid YAML: {problem}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("xids"), list):
        raise XidCatalogError(f"{source}:1: expected a mapping with a list under 'xids'")
    lines = _lines(root) if root is not None else {}
    out: dict[int, XidInfo] = {}
    for i, entry in enumerate(data["xids"]):
        line, keys = lines.get(i, (0, {}))

        def fail(
            key: str, problem: str, i: int = i, line: int = line, keys: dict[str, int] = keys
        ) -> None:
            raise XidCatalogError(f"{source}:{keys.get(key, line)}: xids[{i}].{key}: {problem}")

        if not isinstance(entry, Mapping):
            raise XidCatalogError(f"{source}:{line}: xids[{i}]: expected a mapping")
        for key in entry:
            if key not in _REQUIRED and key not in _OPTIONAL:
                fail(str(key), "unknown key")
        for key in _REQUIRED:
            if key not in entry:
                fail(key, "missing")
        code = entry["code"]
        if not isinstance(code, int) or isinstance(code, bool) or code <= 0:
            fail("code", f"expected a positive integer, got {code!r}")
        if code in out:
            fail("code", f"Xid {code} listed twice")
        for key in ("mnemonic", "meaning"):
            if not isinstance(entry[key], str) or not entry[key]:
                fail(key, "expected a non-empty string")
        for key in ("immediate_action", "investigatory_action"):
            if entry[key] is not None and not isinstance(entry[key], str):
                fail(key, "expected a string or null")
        if entry["layer"] not in LAYERS:
            fail("layer", f"{entry['layer']!r} is not one of {sorted(LAYERS)}")
        diagnoses: Any = entry.get("diagnoses", [])
        if not isinstance(diagnoses, list):
            fail("diagnoses", "expected a list")
        for d in diagnoses:
            if d not in XID_DIAGNOSES:
                fail("diagnoses", f"{d!r} is not a diagnosis code an Xid can lead to")
        notes = entry.get("notes", "")
        if not isinstance(notes, str):
            fail("notes", "expected a string")
        out[code] = XidInfo(
            code,
            entry["mnemonic"],
            entry["meaning"],
            entry["immediate_action"],
            entry["investigatory_action"],
            entry["layer"],
            tuple(diagnoses),
            notes,
        )
    return out


def load_catalog(path: Path = CATALOG_PATH) -> dict[int, XidInfo]:
    return parse_catalog(path.read_text(encoding="utf-8"), str(path))


@functools.cache
def catalog() -> Mapping[int, XidInfo]:
    return load_catalog()


def xid_info(code: int) -> XidInfo:
    return catalog().get(code) or unknown_xid(code)
