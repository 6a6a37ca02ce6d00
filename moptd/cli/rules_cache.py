"""What `moptd explain` reads from the rules, cached by the rule files' contents.

Explain needs little of a rule: for each node of its decision tree, the signals the node's
condition reads and the verdict's actions (which of them is a command). Loading the rule
set for that (YAML, the JSON Schema check, compiling every expression) was most of the
time of a call with the daemon up (BENCHMARKS.md, "moptd explain and status: how long
they take"), so those facts are kept in a cache file and loaded from it while nothing they
come from has changed.

Where: ``$XDG_CACHE_HOME/moptd/`` (``~/.cache/moptd/`` when that is not set), the user's
own cache as the XDG Base Directory spec names it: a read-only command may write there and
nowhere else, each user has their own (no other user's file is read), and deleting it
costs one slower call. One file per list of rule paths, ``explain-rules-<hash>.json``, and
``validated-rules.json``: the digests of rule files (with the schema) that passed the JSON
Schema check, so that offline and ``--bundle``, which compile the rules, skip the check for
the same bytes (``validated_rules``).

Trust: the file is JSON (data, never code), read only when it is a regular file owned by
this user and writable by no one else, and used only when the key it holds is the key of
what is on disk now: the rule files' paths and contents (every byte, not their times),
the format, moptd's version and the size and time of the loader's own modules (a changed
loader may read the same file otherwise). Anything else (missing, unreadable, another
key, malformed) is ignored and the rules are loaded as before; a cache that cannot be
written is not written. Nothing here changes what explain prints.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moptd import __version__

if TYPE_CHECKING:
    from moptd.diagnose.model import Branch, RuleSet

FORMAT = 1


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What explain uses of one action of a verdict (moptd.diagnose.model.Action)."""

    kind: str
    text: str
    is_command: bool


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """One node of a rule's decision tree: the signals its condition reads (none for an
    else branch) and its verdict's actions (None: the node has no verdict)."""

    signals: frozenset[str]
    actions: tuple[StepFacts, ...] | None


# rule id -> node ("<rule id>/<branch id>/...", as a finding's path names it) -> facts
RuleFacts = dict[str, dict[str, NodeFacts]]


def rule_nodes(branches: Sequence[Branch], prefix: str) -> dict[str, NodeFacts]:
    out: dict[str, NodeFacts] = {}
    for b in branches:
        node = f"{prefix}/{b.id}"
        actions = None
        if b.verdict is not None:
            actions = tuple(StepFacts(a.kind, a.text, a.is_command) for a in b.verdict.actions)
        out[node] = NodeFacts(
            frozenset(b.cond.signals) if b.cond is not None else frozenset(), actions
        )
        out.update(rule_nodes(b.children, node))
    return out


def facts_of(ruleset: RuleSet) -> RuleFacts:
    return {r.id: rule_nodes(r.branches, r.id) for r in ruleset.rules}


def load_facts(paths: Sequence[str | Path]) -> RuleFacts | None:
    """The facts of the rules at `paths`: from the cache where it matches the files on
    disk, else from the loaded rules (and then cached); None where the rules cannot be
    loaded (explain still shows what the daemon said)."""
    from moptd.cli.explain_facts import load_ruleset

    where, key = _cache_file(paths), _key(paths)
    if where is not None and key is not None:
        cached = _read(where, key)
        if cached is not None:
            return cached
    with validated_rules():
        ruleset = load_ruleset(paths)
    if ruleset is None:
        return None
    facts = facts_of(ruleset)
    if where is not None and key is not None:
        with contextlib.suppress(OSError):
            _write(where, key, facts)
    return facts


VALIDATED_FILE = "validated-rules.json"
MAX_VALIDATED = 512  # digests kept: every version of every rule file a user has had, nearly


@contextlib.contextmanager
def validated_rules() -> Iterator[None]:
    """Rule files loaded inside skip the JSON Schema check where their bytes (and the
    schema's) passed it before (moptd.diagnose.rulefiles.VALIDATED); what passes now is
    remembered for the next call. The daemon never does this: it checks every file."""
    from moptd.diagnose import rulefiles

    if rulefiles.VALIDATED is not None:  # inside another: that one reads and keeps them
        yield
        return
    d = cache_dir()
    code = _code_key()
    known: set[str] = set()
    if d is not None and code is not None:
        doc = _read_json(d / VALIDATED_FILE)
        if isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("key") == code:
            known = {str(x) for x in doc.get("files") or [] if isinstance(x, str)}
    grown = rulefiles.VALIDATED = set(known)
    try:
        yield
    finally:
        rulefiles.VALIDATED = None
        if d is not None and code is not None and grown - known:
            kept = sorted(grown - known) + sorted(known)  # the new ones first
            doc = {"format": FORMAT, "key": code, "files": kept[:MAX_VALIDATED]}
            with contextlib.suppress(OSError):
                _write_json(d / VALIDATED_FILE, doc)


def cache_dir() -> Path | None:
    """$XDG_CACHE_HOME/moptd, else ~/.cache/moptd (the spec ignores a relative path)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if base and os.path.isabs(base):
        return Path(base) / "moptd"
    home = os.environ.get("HOME", "")
    return Path(home) / ".cache" / "moptd" if os.path.isabs(home) else None


def _cache_file(paths: Sequence[str | Path]) -> Path | None:
    d = cache_dir()
    if d is None:
        return None
    named = hashlib.sha256("\0".join(map(str, paths)).encode()).hexdigest()[:16]
    return d / f"explain-rules-{named}.json"


def _code_files() -> list[Path]:
    """The modules whose reading of a rule file the facts depend on."""
    import moptd

    root = Path(moptd.__file__).parent
    files = [root / "durations.py", Path(__file__)]
    for sub in ("diagnose", "catalog"):
        files += sorted((root / sub).glob("*.py"))
    return files


def _code_key() -> str | None:
    """A hash of moptd's version and of the loader's modules (size and time)."""
    h = hashlib.sha256(f"moptd-rules-cache/{FORMAT}\0{__version__}\0".encode())
    try:
        for f in _code_files():
            st = f.stat()
            h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    except OSError:
        return None
    return h.hexdigest()


def _key(paths: Sequence[str | Path]) -> str | None:
    """A hash of everything the facts are made from; None where a rule file cannot be read
    (the loader says why, so the rules are loaded)."""
    from moptd.diagnose.rulefiles import read_rule_file, rule_files

    code = _code_key()
    if code is None:
        return None
    h = hashlib.sha256(f"{code}\0".encode())
    try:
        files, errors = rule_files(paths)
        h.update(f"{[str(p) for p in paths]}\0{[str(e) for e in errors]}\0".encode())
        for f in files:
            data = read_rule_file(f).encode()
            h.update(f"{f}\0{len(data)}\0".encode())
            h.update(data)
    except (OSError, ValueError):  # RuleFileRefused, UnicodeDecodeError: both ValueError
        return None
    return h.hexdigest()


def _read(path: Path, key: str) -> RuleFacts | None:
    doc = _read_json(path)
    try:
        return _facts_from(doc, key)
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def _read_json(path: Path) -> Any:
    """The JSON in `path` where it is a regular file of this user's that no one else may
    write; None otherwise (missing, another owner, malformed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.geteuid()
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _facts_from(doc: Any, key: str) -> RuleFacts | None:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("key") != key:
        return None
    out: RuleFacts = {}
    for rid, nodes in doc["rules"].items():
        out[str(rid)] = {
            str(node): NodeFacts(
                frozenset(str(s) for s in n["signals"]),
                None
                if n["actions"] is None
                else tuple(StepFacts(str(k), str(t), bool(c)) for k, t, c in n["actions"]),
            )
            for node, n in nodes.items()
        }
    return out


def _write(path: Path, key: str, facts: RuleFacts) -> None:
    doc = {
        "format": FORMAT,
        "key": key,
        "rules": {
            rid: {
                node: {
                    "signals": sorted(n.signals),
                    "actions": None
                    if n.actions is None
                    else [[a.kind, a.text, a.is_command] for a in n.actions],
                }
                for node, n in nodes.items()
            }
            for rid, nodes in facts.items()
        },
    }
    _write_json(path, doc)


def _write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp's file is 0600
            json.dump(doc, fh, separators=(",", ":"))
        os.replace(tmp, path)  # whole or not at all: a reader never sees half a file
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
