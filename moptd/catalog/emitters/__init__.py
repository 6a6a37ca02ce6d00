"""The emitter catalogs: what each serving- or kernel-side emitter prints when it fails.

One YAML file per emitter beside this module (format: CATALOG_FORMAT, the lead's note, as
summarised in docs/accuracy.md): where the messages were read (repository or wheel, ref,
how), and each message with its source file and the code a careful expert concludes from
it alone, or ``benign`` with a ``why``. Loaded once, validated whole (catalogs(); a reader
of one emitter's records may read that emitter's file alone, emitter()); a bad file is
refused with its name, the entry and the key. That every code exists in moptd.diagnose.codes is a
test's job (this layer may not import the diagnosis).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from moptd import yamlsafe

HERE = Path(__file__).parent
BENIGN = "benign"
# An NVRM Xid line: the Xid number decides the code, from moptd/kernel/xid_catalog.yaml
# (the emitter catalog holds the line's shape, the Xid catalog the per-Xid data)
PER_XID = "per-xid"
_MATCHES = ("substring", "regex")
# call: the emitter's own library asked for every value (libcuda's cuGetErrorString, which
# no registry ships: tools/cuda_driver_strings.py on a GPU host)
_HOWS = ("fetch", "wheel", "strings", "docs", "call")


class CatalogError(ValueError):
    """A catalog file that does not follow the format: names the file, entry and key."""


@dataclass(frozen=True, slots=True)
class Message:
    text: str
    match: str  # substring | regex
    code: str  # a diagnosis code, or "benign"
    source: str
    level: str = ""
    ref: str = ""
    versions: str = ""
    why: str = ""
    pattern: re.Pattern[str] | None = None
    # where a real line carrying the message was captured: "tests/fixtures/...:LINE", a
    # file of lines copied from public threads (its SOURCE.md names them); tests feed
    # that line to the parsers (the catalog text alone lacks the variable parts)
    seen: str = ""

    def found_in(self, message: str) -> bool:
        if self.pattern is not None:
            return self.pattern.search(message) is not None
        return self.text in message


@dataclass(frozen=True, slots=True)
class Read:
    repo: str
    ref: str
    how: str


@dataclass(frozen=True, slots=True)
class Emitter:
    id: str
    name: str
    record: str
    read: tuple[Read, ...]
    messages: tuple[Message, ...]
    file: str


def _str(entry: dict[str, Any], key: str, where: str, required: bool = True) -> str:
    v = entry.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str | int | float) or isinstance(v, bool) or str(v).strip() == "":
        raise CatalogError(f"{where}: key {key!r} must be a non-empty string")
    return str(v)


def parse(text: str, name: str) -> Emitter:
    """One catalog file's text as an Emitter; CatalogError names the file, entry and key."""
    try:
        doc = yamlsafe.load(text)
    except Exception as exc:  # noqa: BLE001 (yaml's errors and YamlTooLarge alike)
        raise CatalogError(f"{name}: not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise CatalogError(f"{name}: expected a mapping at the top")
    unknown = set(doc) - {"emitter", "name", "record", "read", "messages"}
    if unknown:
        raise CatalogError(f"{name}: unknown key {sorted(unknown)[0]!r}")
    reads = doc.get("read")
    if not isinstance(reads, list) or not reads:
        raise CatalogError(f"{name}: key 'read' must list where the messages were read")
    read = []
    for i, r in enumerate(reads, 1):
        where = f"{name}: read entry {i}"
        if not isinstance(r, dict):
            raise CatalogError(f"{where}: expected a mapping")
        how = _str(r, "how", where)
        if how not in _HOWS:
            raise CatalogError(f"{where}: key 'how' must be one of {', '.join(_HOWS)}")
        read.append(Read(_str(r, "repo", where), _str(r, "ref", where), how))
    msgs = doc.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise CatalogError(f"{name}: key 'messages' must be a non-empty list")
    return Emitter(
        _str(doc, "emitter", name),
        _str(doc, "name", name),
        _str(doc, "record", name),
        tuple(read),
        tuple(_message(m, f"{name}: message {i}") for i, m in enumerate(msgs, 1)),
        name,
    )


_KEYS = frozenset({"text", "match", "level", "code", "source", "ref", "versions", "why", "seen"})
_SEEN = re.compile(r"tests/fixtures/[\w./-]{1,200}:[1-9][0-9]{0,6}")


def _message(m: object, where: str) -> Message:
    if not isinstance(m, dict):
        raise CatalogError(f"{where}: expected a mapping")
    unknown = set(m) - _KEYS
    if unknown:
        raise CatalogError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    text = _str(m, "text", where)
    match = _str(m, "match", where, required=False) or "substring"
    if match not in _MATCHES:
        raise CatalogError(f"{where}: key 'match' must be substring or regex")
    pattern = None
    if match == "regex":
        try:
            pattern = re.compile(text)
        except re.error as exc:
            raise CatalogError(f"{where}: key 'text' is no regex: {exc}") from None
    code = _str(m, "code", where)
    why = _str(m, "why", where, required=False)
    if code in (BENIGN, PER_XID) and not why:
        raise CatalogError(f"{where}: key 'why' is required for a {code} message")
    seen = _str(m, "seen", where, required=False)
    if seen and (_SEEN.fullmatch(seen) is None or ".." in seen):
        raise CatalogError(f"{where}: key 'seen' must be tests/fixtures/<file>:<line>")
    return Message(
        text,
        match,
        code,
        _str(m, "source", where),
        _str(m, "level", where, required=False),
        _str(m, "ref", where, required=False),
        _str(m, "versions", where, required=False),
        why,
        pattern,
        seen,
    )


@cache
def catalogs() -> dict[str, Emitter]:
    """Every catalog beside this module, by emitter id (loaded once)."""
    out: dict[str, Emitter] = {}
    for f in sorted(HERE.glob("*.yaml")):
        em = parse(f.read_text(encoding="utf-8"), f.name)
        if em.id in out:
            raise CatalogError(f"{f.name}: emitter {em.id!r} is declared by {out[em.id].file} too")
        out[em.id] = em
    return out


@cache
def emitter(emitter_id: str) -> Emitter | None:
    """One emitter's catalog, by id: its file ``<id>.yaml`` alone where that file declares
    it, else from all of them; None where none does. A reader of one emitter's records (the
    kernel log reads two catalogs of sixteen) parses only what it reads: the other files
    were a replay's 8 ms (BENCHMARKS.md, issue 32 on the merged tree). catalogs() still
    checks the whole set (tests/test_emitter_catalogs.py)."""
    f = HERE / f"{emitter_id}.yaml"
    if f.is_file():
        em = parse(f.read_text(encoding="utf-8"), f.name)
        if em.id == emitter_id:
            return em
    return catalogs().get(emitter_id)


def lookup(emitters: tuple[str, ...], message: str) -> Message | None:
    """The first catalogued message of these emitters' catalogs found in ``message``."""
    for e in emitters:
        em = emitter(e)
        if em is None:
            continue
        for m in em.messages:
            if m.found_in(message):
                return m
    return None


def coverage_table(unmatched: Mapping[str, int] | None = None) -> str:
    """docs/accuracy.md's coverage table by emitter (Markdown), from the catalogs.

    ``unmatched``: per emitter checked against the kernel parsers (tests/
    test_emitter_catalogs.py), how many of its coded messages those parsers do not read
    as catalogued yet; "-" for the serving emitters, whose check has no such list."""
    rows = [
        "| emitter | messages catalogued | mapped to a code | of which UNCLASSIFIED_ERROR "
        "| benign | checked on a captured line | not yet matched by moptd | versions read |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for em in sorted(catalogs().values(), key=lambda e: e.id):
        coded = [m for m in em.messages if m.code != BENIGN]
        unclassified = sum(1 for m in coded if m.code == "UNCLASSIFIED_ERROR")
        benign = len(em.messages) - len(coded)
        seen = sum(1 for m in em.messages if m.seen)
        missing = "-" if unmatched is None or em.id not in unmatched else unmatched[em.id]
        reads = "; ".join(f"{r.repo} @ {r.ref} ({r.how})" for r in em.read)
        rows.append(
            f"| {em.name} (`{em.id}`) | {len(em.messages)} | {len(coded)} | {unclassified} "
            f"| {benign} | {seen or '-'} | {missing} | {reads.replace('|', '/')} |"
        )
    return "\n".join(rows) + "\n"


def unmatched_table(rows: Iterable[tuple[str, str, str, str]]) -> str:
    """docs/accuracy.md's list of messages catalogued but not yet matched: (emitter,
    message, the catalog's code, what moptd does with it instead)."""
    out = ["| emitter | message | catalogued as | what moptd does instead |", "|---|---|---|---|"]
    for emitter, text, code, what in rows:
        # a "|" inside a cell ends it: escaped, it reads as the regex's own "|"
        cell = text.replace("|", "\\|").replace("`", "'")
        out.append(f"| `{emitter}` | `{cell}` | {code} | {what.replace('|', '/')} |")
    return "\n".join(out) + "\n"
