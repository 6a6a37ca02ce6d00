"""NVIDIA's "Xid 144-150 Decode" for NVLink5 lines (nvlink5.yaml), loaded once.

An NVLink5 Xid line prints its unit, a severity word, the link and hex words:
``149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 ...)``. NVIDIA's catalog
does not give one action per Xid for 144-150: its decode sheet keys on the unit, the first
word (``intrinfo``, matched against a bit pattern) and the second (``errorStatus``,
compared whole) and gives the recovery action, the investigation and the severity. The
patterns changed with driver R575 (V1 before, V2 from it); the kernel line does not say
which driver printed it, so without a version both are tried (as gpud does), and where
rows of both disagree the strongest action wins: a reset not done costs more than a
reset that was not needed.

The result goes on the Xid event as fields (``nvlink5_action`` ...); the Xid catalog's
variants choose the plan from them (xid_catalog.yaml). A line no row matches keeps its
own severity word, and says so (``nvlink5_decode: no_row``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from moptd import yamlsafe

TABLE_PATH = Path(__file__).with_name("nvlink5.yaml")
NVLINK5_XIDS = range(144, 151)
# NVIDIA's recovery actions in the sheet, weakest first (the order a tie is broken in)
ACTIONS = ("IGNORE", "XID_154_EVAL", "RESET_GPU")
_ROW_KEYS = {
    "xid",
    "unit",
    "intrinfo_v1",
    "intrinfo_v2",
    "error_status",
    "action",
    "investigatory",
    "severity",
    "then",
    "hw_sw",
    "effects",
}
_REQUIRED = _ROW_KEYS - {"then"}
_PATTERN = re.compile(r"[01-]{32}")
_HEX = re.compile(r"0x[0-9a-fA-F]{1,8}")
# R575 is where the sheet's V2 patterns start ("V2(>=R575)")
_V2_FROM = 575


class DecodeTableError(ValueError):
    """nvlink5.yaml is malformed; the message names the file, row and key."""


@dataclass(frozen=True, slots=True)
class Row:
    xid: int
    units: frozenset[str]  # the unit and each of its slash-separated names, normalised
    unit: str  # as the sheet prints it ("NETIR_LINK_EVT/NETIR_LINK_DOWN")
    v1: str
    v2: str
    error_status: int
    action: str
    investigatory: str
    severity: str
    then: str
    hw_sw: str
    effects: str


@dataclass(frozen=True, slots=True)
class Decoded:
    row: Row
    version: str  # "v1" | "v2": which of the row's patterns matched
    ambiguous: bool  # rows of both versions matched with different actions


def _norm_unit(unit: str) -> str:
    return re.sub(r"[^A-Z0-9_]", "", unit.strip().upper().replace("-", "_"))


def _units(unit: str) -> frozenset[str]:
    names = {_norm_unit(p) for p in re.split(r"[/,() ]+", unit) if p.strip()}
    return frozenset(names | {_norm_unit(unit)})


def _matches(pattern: str, value: int) -> bool:
    for i, ch in enumerate(pattern):
        bit = (value >> (31 - i)) & 1
        if (ch == "1" and not bit) or (ch == "0" and bit):
            return False
    return True


def parse_table(text: str, source: str = "nvlink5.yaml") -> tuple[Row, ...]:
    try:
        root = yamlsafe.compose(text)
        data = yamlsafe.load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise DecodeTableError(f"{source}{where}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("rows"), list):
        raise DecodeTableError(f"{source}:1: expected a mapping with a list under 'rows'")
    lines = _row_lines(root)
    rows: list[Row] = []
    for i, r in enumerate(data["rows"]):

        def fail(key: str, problem: str, i: int = i) -> DecodeTableError:
            line = lines[i] if i < len(lines) else 1
            return DecodeTableError(f"{source}:{line}: rows[{i}].{key}: {problem}")

        if not isinstance(r, Mapping):
            raise fail("", "expected a mapping")
        for key in set(r) - _ROW_KEYS:
            raise fail(str(key), "unknown key")
        for key in sorted(_REQUIRED - set(r)):
            raise fail(key, "missing")
        if r["xid"] not in NVLINK5_XIDS:
            raise fail("xid", f"{r['xid']!r} is not an NVLink5 Xid (144-150)")
        for key in ("intrinfo_v1", "intrinfo_v2"):
            if not isinstance(r[key], str) or not _PATTERN.fullmatch(r[key]):
                raise fail(key, "expected 32 characters of 0, 1 and -")
        if not isinstance(r["error_status"], str) or not _HEX.fullmatch(r["error_status"]):
            raise fail("error_status", "expected a hex word (0x...)")
        for key in ("action", "then"):
            if key in r and r[key] not in ACTIONS:
                raise fail(key, f"{r[key]!r} is not one of {list(ACTIONS)}")
        for key in ("unit", "investigatory", "severity", "hw_sw", "effects"):
            if not isinstance(r[key], str) or not r[key].strip():
                raise fail(key, "expected a non-empty string")
        rows.append(
            Row(
                xid=int(r["xid"]),
                units=_units(r["unit"]),
                unit=r["unit"],
                v1=r["intrinfo_v1"],
                v2=r["intrinfo_v2"],
                error_status=int(r["error_status"], 16),
                action=r["action"],
                investigatory=r["investigatory"],
                severity=r["severity"],
                then=str(r.get("then", "")),
                hw_sw=r["hw_sw"],
                effects=r["effects"],
            )
        )
    return tuple(rows)


def _row_lines(root: yaml.Node | None) -> list[int]:
    """The line each row starts on, for error messages."""
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "rows" and isinstance(value, yaml.SequenceNode):
                return [item.start_mark.line + 1 for item in value.value]
    return []


@functools.cache
def table() -> tuple[Row, ...]:
    return parse_table(TABLE_PATH.read_text(encoding="utf-8"), str(TABLE_PATH))


def _driver_branch(driver_version: str | None) -> int | None:
    m = re.match(r"\s*(\d{3})\.", driver_version or "")
    return int(m.group(1)) if m else None


def decode(
    xid: int, unit: str, intrinfo: str, error_status: str, driver_version: str | None = None
) -> Decoded | None:
    """The sheet's row for one line, or None when no row matches (or a word is not hex).
    ``driver_version`` ("570.148.08"), when known, picks the V1 or V2 patterns."""
    if xid not in NVLINK5_XIDS:
        return None
    try:
        intr = int(intrinfo, 16)
        status = int(error_status, 16)
    except (TypeError, ValueError):
        return None
    name = _norm_unit(unit)
    branch = _driver_branch(driver_version)
    versions: tuple[str, ...] = ("v2", "v1")  # unknown driver: either
    if branch is not None:
        versions = ("v1",) if branch < _V2_FROM else ("v2",)
    found: list[Decoded] = []
    for row in table():
        if row.xid != xid or row.error_status != status or name not in row.units:
            continue
        for v in versions:
            if _matches(row.v2 if v == "v2" else row.v1, intr):
                found.append(Decoded(row, v, False))
                break
    if not found:
        return None
    best = max(found, key=lambda d: ACTIONS.index(d.row.action))
    ambiguous = len({d.row.action for d in found}) > 1
    return Decoded(best.row, best.version, ambiguous)


def decode_fields(
    code: int, fields: Mapping[str, Any], driver_version: str | None = None
) -> dict[str, Any]:
    """The fields an NVLink5 Xid event gains from the sheet; {} for any other line."""
    if code not in NVLINK5_XIDS or "nvlink_unit" not in fields:
        return {}
    intrinfo, status = fields.get("intrinfo"), fields.get("error_status")
    if not isinstance(intrinfo, str) or not isinstance(status, str):
        return {"nvlink5_decode": "no_words"}
    d = decode(code, str(fields["nvlink_unit"]), intrinfo, status, driver_version)
    if d is None:
        return {"nvlink5_decode": "no_row"}
    out: dict[str, Any] = {
        "nvlink5_decode": d.version + ("_ambiguous" if d.ambiguous else ""),
        "nvlink5_action": d.row.action,
        "nvlink5_investigatory": d.row.investigatory,
        "nvlink5_severity": d.row.severity,
        "nvlink5_hw_sw": d.row.hw_sw,
    }
    if d.row.then:
        out["nvlink5_then"] = d.row.then
    return out
