"""How a replay's findings are held against a bundle's expected.yaml (docs/bundle.md).

One matcher for the scenario test, the incident-corpus test and bench/score_corpus.py, so
"found" and "false alarm" mean the same in the test and in docs/accuracy.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moptd.diagnose.codes import CODES
from moptd.proc.pci import normalize_pci

REPO = Path(__file__).resolve().parent.parent
KEYS = ("must", "must_not", "may")
ENTRY_KEYS = frozenset({"code", "subject", "pci_bus_id", "subject_certain"})
# The spec's table (../shared/spec/diagnosis-codes.md) may name codes that codes.py has not
# declared yet; a checkout without ../shared falls back on codes.py alone.
SPEC_CANDIDATES = (
    REPO.parent / "shared" / "spec" / "diagnosis-codes.md",
    REPO.parent.parent / "shared" / "spec" / "diagnosis-codes.md",
)
_CODE_ROW = re.compile(r"^\|\s*\w+\s*\|\s*([A-Z][A-Z0-9_]*)\s*\|\s*(info|warning|critical)\s*\|")


def known_codes() -> frozenset[str]:
    codes = set(CODES)
    for spec in SPEC_CANDIDATES:
        if spec.is_file():
            text = spec.read_text(encoding="utf-8")
            codes |= {m.group(1) for line in text.splitlines() if (m := _CODE_ROW.match(line))}
    return frozenset(codes)


def matches(finding: Mapping[str, object], want: Mapping[str, object]) -> bool:
    if finding["code"] != want["code"]:
        return False
    if "pci_bus_id" in want and normalize_pci(str(finding.get("pci_bus_id", ""))) != (
        normalize_pci(str(want["pci_bus_id"]))
    ):
        return False
    if "subject" in want and want.get("subject_certain", True):
        return finding["subject"] == want["subject"]
    return True


@dataclass
class Outcome:
    """What one replay got right and wrong against its expected.yaml."""

    found: list[dict[str, Any]] = field(default_factory=list)
    missed: list[dict[str, Any]] = field(default_factory=list)
    false_alarms: list[tuple[dict[str, Any], list[Mapping[str, object]]]] = field(
        default_factory=list
    )

    @property
    def ok(self) -> bool:
        return not self.missed and not self.false_alarms


def judge(expected: Mapping[str, Any], findings: Sequence[Mapping[str, object]]) -> Outcome:
    out = Outcome()
    for want in expected.get("must") or []:
        (out.found if any(matches(f, want) for f in findings) else out.missed).append(want)
    for bad in expected.get("must_not") or []:
        hits = [f for f in findings if matches(f, bad)]
        if hits:
            out.false_alarms.append((bad, hits))
    return out


def check(expected: Mapping[str, Any], findings: Sequence[Mapping[str, object]]) -> None:
    for want in expected.get("must") or []:
        assert any(matches(f, want) for f in findings), (want, findings)
    for bad in expected.get("must_not") or []:
        hits = [f for f in findings if matches(f, bad)]
        assert hits == [], bad


def load_expected(path: Path, codes: frozenset[str]) -> dict[str, Any]:
    """expected.yaml, checked: raises ValueError naming the file, the list and the entry."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: want a mapping with {', '.join(KEYS)}")
    if unknown := set(data) - set(KEYS):
        raise ValueError(f"{path}: unknown key(s) {sorted(unknown)}")
    for key in KEYS:
        entries = data.get(key) or []
        if not isinstance(entries, list):
            raise ValueError(f"{path}: {key}: want a list")
        for i, entry in enumerate(entries):
            where = f"{path}: {key}[{i}]"
            if not isinstance(entry, dict) or "code" not in entry:
                raise ValueError(f"{where}: want a mapping with a code")
            if extra := set(entry) - ENTRY_KEYS:
                raise ValueError(f"{where}: unknown field(s) {sorted(extra)}")
            if not isinstance(entry["code"], str) or entry["code"] not in codes:
                raise ValueError(f"{where}: {entry['code']!r} is not a diagnosis code")
    return data
