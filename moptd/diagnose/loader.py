"""Load rule files: YAML with line numbers, JSON Schema, lists and macros, rules.d overrides.

Every problem becomes a :class:`RuleError` naming the file and line; nothing here raises on
bad input. Paths are read in order: a later file's rule with an existing id replaces it
(local tuning in rules.d), and a later list or macro with an existing name replaces it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moptd import yamlsafe
from moptd.catalog import CATALOG, SignalSpec
from moptd.diagnose import rulefiles
from moptd.diagnose.codes import CODES, SEVERITIES
from moptd.diagnose.expr import Compiler, Expr, ExprError
from moptd.diagnose.links import JOINS
from moptd.diagnose.model import Action, Branch, Link, Rule, RuleSet, Verdict
from moptd.diagnose.rule_cost import bound_reads

# re-exported: the loader's API before the files' half moved to rulefiles.py
from moptd.diagnose.rulefiles import MAX_RULE_FILE_BYTES as MAX_RULE_FILE_BYTES
from moptd.diagnose.rulefiles import RuleError as RuleError
from moptd.diagnose.rulefiles import RuleFileRefused as RuleFileRefused
from moptd.diagnose.rulefiles import default_rules_dir as default_rules_dir
from moptd.diagnose.rulefiles import read_rule_file as read_rule_file
from moptd.diagnose.rulefiles import rule_files as rule_files
from moptd.durations import parse_duration

PLACEHOLDER = re.compile(r"\{\{\s*([a-z_][a-z0-9_]*)\s*\}\}")
BUILTIN_PLACEHOLDERS = frozenset({"subject", "index", "pci_bus_id", "rule"})


class _Map(dict[Any, Any]):
    line = 0
    lines: dict[Any, int]


class _List(list[Any]):
    line = 0
    lines: list[int]


class _PyLoader(yaml.SafeLoader):
    """The pure-Python parser: where PyYAML has no libyaml, and to check the two agree."""


class _CLoader(yaml.CSafeLoader):
    """libyaml's parser (ten times quicker on the shipped rules), same constructors."""


def _construct_map(loader: yamlsafe.Loader, node: yaml.MappingNode) -> _Map:
    out = _Map()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for knode, vnode in node.value:
        key = loader.construct_object(knode, deep=True)
        if key in out:
            raise yaml.MarkedYAMLError(
                problem=f"duplicate key {key!r}", problem_mark=knode.start_mark
            )
        out[key] = loader.construct_object(vnode, deep=True)
        out.lines[key] = knode.start_mark.line + 1
    return out


def _construct_list(loader: yamlsafe.Loader, node: yaml.SequenceNode) -> _List:
    out = _List(loader.construct_object(v, deep=True) for v in node.value)
    out.line = node.start_mark.line + 1
    out.lines = [v.start_mark.line + 1 for v in node.value]
    return out


for _cls in (_PyLoader, _CLoader):
    _cls.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
    _cls.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_list)
_Loader: type[yamlsafe.Loader] = _CLoader if yamlsafe.LIBYAML else _PyLoader


def line_of(doc: object, path: Iterable[object]) -> int:
    """The line of the deepest node of ``path`` that exists in ``doc``."""
    line = getattr(doc, "line", 1)
    cur: object = doc
    for key in path:
        if isinstance(cur, _Map) and key in cur:
            line = cur.lines.get(key, line)
            cur = cur[key]
        elif isinstance(cur, _List) and isinstance(key, int) and 0 <= key < len(cur):
            line = cur.lines[key]
            cur = cur[key]
        else:
            break
        line = max(line, getattr(cur, "line", 0) if isinstance(cur, _Map | _List) else 0) or line
    return line


def parse_yaml(text: str, file: str) -> tuple[object, list[RuleError]]:
    try:
        # bounded: a rules.d file is root's, but an alias bomb must not hang a reload
        return yamlsafe.load(text, _Loader), []
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 1
        return None, [RuleError(file, line, f"YAML: {e.problem or e}")]
    except yaml.YAMLError as e:
        return None, [RuleError(file, 1, f"YAML: {e}")]


def _schema_path() -> Path:
    return default_rules_dir() / "schema" / "moptd-rules.schema.json"


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(_schema_path().read_text())
    return loaded


@functools.cache
def _validator(text: str) -> Any:
    """The schema's validator, made once a process for the schema's text: a validator made
    per file resolved its $refs afresh each time (34 files: about a third of the check)."""
    import jsonschema  # type: ignore[import-untyped]

    return jsonschema.Draft202012Validator(_inline_refs(json.loads(text)))


def _inline_refs(doc: dict[str, Any]) -> dict[str, Any]:
    """The schema with each ``{"$ref": "#/$defs/NAME"}`` replaced by that definition itself
    (the same dict: a branch's ``decide`` holds branches, so the result has cycles, which
    the validator only follows as deep as a document goes). jsonschema resolves a $ref
    through its registry at every use, about a quarter of checking the shipped rules; the
    errors, their messages and their paths in the document are the same
    (tests/test_rule_loader.py)."""
    defs = doc.get("$defs", {})

    def target(v: object) -> object:
        if isinstance(v, dict) and len(v) == 1 and isinstance(v.get("$ref"), str):
            name = v["$ref"].removeprefix("#/$defs/")
            if name != v["$ref"] and name in defs:
                return defs[name]
        return v

    seen: set[int] = set()
    stack: list[object] = [doc]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            for k, v in node.items():
                node[k] = target(v)
                stack.append(node[k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                node[i] = target(v)
                stack.append(node[i])
    return doc


def _validate(doc: object, file: str, validator: Any = None) -> list[RuleError]:
    if validator is None:
        validator = _validator(_schema_path().read_text())
    errors = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        path = list(err.absolute_path)
        where = ".".join(str(p) for p in path) or "(top)"
        msg = err.message
        if err.validator == "additionalProperties":
            msg = msg.replace("Additional properties are not allowed", "unknown key")
        elif path and path[-1] in ("for", "keep_firing_for", "within"):
            msg = f"{err.instance!r} is not a duration (use e.g. 30s, 5m, 1h30m)"
        elif err.validator == "oneOf":
            in_actions = len(path) >= 2 and path[-2] == "actions"
            msg = (
                "an action needs exactly one of command/instruction"
                if in_actions
                else "a branch needs exactly one of if/else and one of verdict/decide/ok"
            )
        elif len(msg) > 160:
            msg = msg[:157] + "..."
        errors.append(RuleError(file, line_of(doc, path), f"{where}: {msg}"))
    return errors


@dataclass
class _Source:
    file: str
    doc: _Map


@dataclass
class Loaded:
    ruleset: RuleSet
    errors: list[RuleError] = field(default_factory=list)
    lists: dict[str, list[object]] = field(default_factory=dict)
    macros: dict[str, str] = field(default_factory=dict)


def load_rules(paths: Sequence[str | Path], catalog: Mapping[str, SignalSpec] = CATALOG) -> Loaded:
    """Read, validate and compile rule files. ``errors`` is empty when the set is usable."""
    files, errors = rule_files(paths)
    sources: list[_Source] = []
    validator = None
    for f in files:
        try:
            text = read_rule_file(f)
        except RuleFileRefused as e:
            # the whole file is refused: its first line stands for it (FILE:1: reason)
            errors.append(RuleError(str(f), 1, str(e)))
            continue
        except (OSError, UnicodeDecodeError) as e:
            errors.append(RuleError(str(f), 0, f"cannot read: {e}"))
            continue
        doc, errs = parse_yaml(text, str(f))
        if errs:
            errors.extend(errs)
            continue
        if not isinstance(doc, _Map):
            errors.append(
                RuleError(str(f), 1, "a rule file is a mapping with schema: moptd.rules/v1")
            )
            continue
        # a read-only command skips the check for bytes that passed it before (rulefiles.py)
        known = rulefiles.VALIDATED
        digest = rulefiles.schema_digest(text) if known is not None else ""
        if known is None or digest not in known:
            if validator is None:  # the schema read once a load (a reload reads it again)
                validator = _validator(_schema_path().read_text())
            errs = _validate(doc, str(f), validator)
            if errs:
                errors.extend(errs)
                continue
            if known is not None:
                known.add(digest)
        sources.append(_Source(str(f), doc))

    lists: dict[str, list[object]] = {}
    macros: dict[str, str] = {}
    macro_at: dict[str, tuple[str, int]] = {}
    raw_rules: dict[str, tuple[_Source, _Map]] = {}
    raw_links: dict[str, tuple[_Source, _Map]] = {}
    for src in sources:
        for name, items in src.doc.get("lists", {}).items():
            lists[name] = list(items)
        mdoc = src.doc.get("macros", _Map())
        for name, text in mdoc.items():
            macros[name] = text
            macro_at[name] = (src.file, mdoc.lines[name])
        for r in src.doc.get("rules", []):
            raw_rules[r["id"]] = (src, r)  # a later file overrides by id
        for lk in src.doc.get("links", []):
            raw_links[lk["id"]] = (src, lk)  # likewise

    compilers = {
        scope: Compiler(catalog, lists, macros, scope) for scope in ("node", "gpu", "serving")
    }
    rules: list[Rule] = []
    for src, r in raw_rules.values():
        rule, errs = _build_rule(src.file, r, compilers[r["scope"]], macro_at)
        errors.extend(errs)
        if rule is not None:
            rules.append(rule)
    rules, costly = bound_reads(rules)
    errors.extend(RuleError(r.file, r.line, why) for r, why in costly)
    links: list[Link] = []
    for src, lk in raw_links.values():
        link, errs = _build_link(src.file, lk, compilers)
        errors.extend(errs)
        if link is not None:
            links.append(link)
    # Report macro errors even for macros no rule uses yet.
    reported = {
        n
        for e in errors
        for n in re.findall(r"[a-z0-9_]+", e.message.split(":", 1)[-1])
        if e.message.startswith("macro ")
    }
    for name, (file, line) in macro_at.items():
        if name in reported:
            continue
        msgs = []
        for comp in compilers.values():
            try:
                comp.compile(macros[name])
                break
            except ExprError as e:
                msgs.append(e.message)
        else:
            if not any("not usable in a" in m for m in msgs):
                errors.append(RuleError(file, line, f"macro {name!r}: {msgs[0]}"))
    errors = _dedupe(errors)
    ruleset = RuleSet(tuple(rules), tuple(map(str, files)), tuple(links))
    return Loaded(ruleset, errors, lists, macros)


def _dedupe(errors: list[RuleError]) -> list[RuleError]:
    seen: set[tuple[str, int, str]] = set()
    out = []
    for e in errors:
        key = (e.file, e.line, e.message)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _build_rule(
    file: str, r: _Map, comp: Compiler, macro_at: Mapping[str, tuple[str, int]]
) -> tuple[Rule | None, list[RuleError]]:
    errors: list[RuleError] = []
    rid = r["id"]

    def compile_at(text: str, line: int, what: str) -> Expr | None:
        try:
            return comp.compile(text)
        except ExprError as e:
            m = re.match(r"in macro '([a-z0-9_]+)': (.*)", e.message)
            cyc = re.match(r"macro cycle: ([a-z0-9_]+) ", e.message)
            if m and m.group(1) in macro_at:
                mfile, mline = macro_at[m.group(1)]
                errors.append(RuleError(mfile, mline, f"macro {m.group(1)!r}: {m.group(2)}"))
            elif cyc and cyc.group(1) in macro_at:
                mfile, mline = macro_at[cyc.group(1)]
                errors.append(RuleError(mfile, mline, f"macro {cyc.group(1)!r}: {e.message}"))
            else:
                errors.append(RuleError(file, line, f"rule {rid}: {what}: {e.message}"))
            return None

    durations: dict[str, float] = {}
    for key in ("for", "keep_firing_for"):
        try:
            durations[key] = parse_duration(r.get(key, 0))
        except ValueError as e:
            errors.append(RuleError(file, r.lines[key], f"rule {rid}: {key}: {e}"))

    def evidence(m: _Map | None) -> tuple[tuple[str, Expr], ...]:
        out = []
        for name, text in (m or {}).items():
            ex = compile_at(text, m.lines[name] if m is not None else 0, f"evidence {name}")
            if ex is not None:
                out.append((name, ex))
        return tuple(out)

    rule_evidence = evidence(r.get("evidence"))
    signals: set[str] = set()

    def branches(items: _List, prefix: str) -> tuple[Branch, ...]:
        out = []
        closed_at: int | None = None
        for i, b in enumerate(items):
            line = items.lines[i]
            bid = b.get("id", f"{prefix}{i}" if prefix else f"b{i}")
            if closed_at is not None:
                errors.append(
                    RuleError(
                        file,
                        line,
                        f"rule {rid}: branch {bid} is unreachable "
                        f"(after the branch at line {closed_at} that always matches)",
                    )
                )
            cond = None
            if "if" in b:
                cond = compile_at(b["if"], b.lines["if"], f"branch {bid}")
                if cond is not None:
                    signals.update(cond.signals)
                    if cond.text in ("true", "True"):
                        closed_at = line
            else:
                closed_at = line
            verdict = None
            children: tuple[Branch, ...] = ()
            if "verdict" in b:
                verdict = _verdict(file, rid, b["verdict"], evidence, rule_evidence, errors)
            elif "decide" in b:
                children = branches(b["decide"], f"{bid}.")
            resolves = bool(b.get("resolve", False))
            out.append(Branch(bid, cond, verdict, children, line, b.get("ok"), resolves))
        ids = [b.id for b in out]
        for dup in {i for i in ids if ids.count(i) > 1}:
            errors.append(RuleError(file, items.line, f"rule {rid}: branch id {dup!r} used twice"))
        return tuple(out)

    tree = branches(r["decide"], "")
    inhibited_by = tuple(r.get("inhibited_by", ()))
    for code in inhibited_by:
        if code not in CODES:
            line = r.lines.get("inhibited_by", r.line)
            errors.append(RuleError(file, line, f"rule {rid}: inhibited_by: unknown code {code!r}"))
    if errors:
        return None, errors
    for _, ex in rule_evidence:
        signals.update(ex.signals)
    return (
        Rule(
            id=rid,
            title=r["title"],
            layer=r["layer"],
            scope=r["scope"],
            status=r["status"],
            for_=durations["for"],
            keep_firing_for=durations["keep_firing_for"],
            branches=tree,
            evidence=rule_evidence,
            file=file,
            line=r.line,
            enabled=r.get("enabled", True),
            description=r.get("description", ""),
            tags=tuple(r.get("tags", [])),
            signals=frozenset(signals),
            inhibited_by=inhibited_by,
        ),
        errors,
    )


# The scope a link's consequence is in, by its join (its `if:` compiles there).
_CONSEQUENCE_SCOPE = {"serving_gpus": "serving"}


def _build_link(
    file: str, lk: _Map, compilers: Mapping[str, Compiler]
) -> tuple[Link | None, list[RuleError]]:
    """A `links:` entry; the schema has checked its keys and codes' spelling."""
    errors: list[RuleError] = []
    lid = lk["id"]
    for key in ("consequence", "cause"):
        items = lk[key]
        for i, code in enumerate(items):
            if code not in CODES:
                line = items.lines[i] if isinstance(items, _List) else lk.lines[key]
                errors.append(RuleError(file, line, f"link {lid}: {key}: unknown code {code}"))
    overlap = set(lk["consequence"]) & set(lk["cause"])
    if overlap:
        errors.append(
            RuleError(
                file,
                lk.lines["cause"],
                f"link {lid}: {', '.join(sorted(overlap))} is both cause and consequence",
            )
        )
    join = lk["join"]
    if join not in JOINS:  # the schema's enum says the same; kept for a clear message
        errors.append(RuleError(file, lk.lines["join"], f"link {lid}: join: unknown join {join!r}"))
        return None, errors
    try:
        within = parse_duration(lk.get("within", 0))
    except ValueError as e:
        errors.append(RuleError(file, lk.lines["within"], f"link {lid}: within: {e}"))
        return None, errors
    cond = None
    if "if" in lk:
        try:
            cond = compilers[_CONSEQUENCE_SCOPE[join]].compile(lk["if"])
        except ExprError as e:
            errors.append(RuleError(file, lk.lines["if"], f"link {lid}: if: {e.message}"))
    if errors:
        return None, errors
    link = Link(
        id=lid,
        title=lk["title"],
        consequence=frozenset(lk["consequence"]),
        cause=tuple(lk["cause"]),
        join=join,
        within=within,
        file=file,
        line=lk.line,
        cond=cond,
        description=lk.get("description", ""),
        enabled=lk.get("enabled", True),
    )
    return link, errors


def _verdict(
    file: str,
    rid: str,
    v: _Map,
    evidence: Any,
    rule_evidence: tuple[tuple[str, Expr], ...],
    errors: list[RuleError],
) -> Verdict | None:
    code = v["code"]
    if code not in CODES:  # the schema's enum says the same; kept for a clear message
        errors.append(
            RuleError(file, v.lines["code"], f"rule {rid}: unknown diagnosis code {code}")
        )
        return None
    own = evidence(v.get("evidence"))
    known = {n for n, _ in rule_evidence} | {n for n, _ in own} | BUILTIN_PLACEHOLDERS
    texts = [(v["summary"], v.lines["summary"])]
    texts += [
        (a.get("command") or a.get("instruction") or "", v["actions"].lines[i])
        for i, a in enumerate(v["actions"])
    ]
    for text, line in texts:
        for m in PLACEHOLDER.finditer(text):
            if m.group(1) not in known:
                msg = f"{{{{{m.group(1)}}}}} names no evidence (nor subject, index, pci_bus_id)"
                errors.append(RuleError(file, line, f"rule {rid}: {msg}"))
    severity = v.get("severity", CODES[code][1])
    assert severity in SEVERITIES
    actions = tuple(
        Action(a["kind"], a.get("command") or a["instruction"], "command" in a)
        for a in v["actions"]
    )
    return Verdict(
        code=code,
        severity=severity,
        summary=v["summary"],
        actions=actions,
        runbook=v["runbook"],
        falsepositives=tuple(v.get("falsepositives", [])),
        evidence=own,
    )
