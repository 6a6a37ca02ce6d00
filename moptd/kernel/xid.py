"""The Xid catalog (xid_catalog.yaml), loaded and validated once.

The catalog is data so that a reviewer can check it against NVIDIA's table line by line
and so that a site can see, in one file, where moptd departs from other tools. Besides one
entry per Xid it holds NVIDIA's resolution buckets in words (``buckets``) and moptd's
plans (``plans``): per class of Xid, the finding and the actions in order. An entry names
its plan, and the plan a parsed field of the line chooses instead (``variants``); the
kernel collector puts the chosen plan on each ``kernel.xid`` event, and rules select their
branch by it.
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
_OPTIONAL = ("diagnoses", "notes", "plan", "variants")
_TOP = ("source", "buckets", "plans", "xids")
# The action kinds of moptd/diagnose/model.py (the kernel layer may not import it; a test
# keeps the two equal) and the severities of moptd/diagnose/codes.py.
ACTION_KINDS = (
    "inspect",
    "restart_serving",
    "reset_gpu",
    "reboot_node",
    "drain_node",
    "replace_hardware",
    "update_software",
    "change_config",
)
SEVERITIES = ("info", "warning", "critical")
# The parsed fields of an Xid line a variant may key on (moptd/kernel/patterns.py), and
# the NVLink5 decode's action (moptd/kernel/nvlink5.py).
VARIANT_FIELDS = ("severity", "recovery_action", "nvlink5_action")
NO_PLAN = "none"
_PLAN_KEYS = ("diagnosis", "severity", "nvidia", "actions", "rules", "source")


class XidCatalogError(ValueError):
    """The catalog file is malformed; the message names the file, line and key."""


@dataclass(frozen=True, slots=True)
class Variant:
    """When the line's ``field`` reads ``equals`` (case and spacing aside), ``plan``."""

    field: str
    equals: str
    plan: str


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
    plan: str = NO_PLAN
    variants: tuple[Variant, ...] = ()


@dataclass(frozen=True, slots=True)
class PlanAction:
    kind: str
    text: str  # a command to paste, or an instruction
    is_command: bool


@dataclass(frozen=True, slots=True)
class Plan:
    """moptd's answer to a class of Xid: the finding and what to do, in order."""

    name: str
    diagnosis: str | None  # None: no finding
    severity: str | None
    nvidia: str  # the buckets of NVIDIA's catalog the plan answers
    actions: tuple[PlanAction, ...]
    rules: tuple[str, ...]  # "rule-id/branch-id" whose verdicts must equal this plan
    source: str


@dataclass(frozen=True, slots=True)
class Catalog:
    xids: Mapping[int, XidInfo]
    plans: Mapping[str, Plan]
    buckets: Mapping[str, str]


def unknown_xid(code: int) -> XidInfo:
    """What to say about a code newer than the catalog: nothing we cannot back up."""
    return XidInfo(code, "UNKNOWN", f"Xid {code} (not in moptd's catalog)", None, None, "unknown")


def _norm(value: object) -> str:
    return " ".join(str(value).split()).lower()


def _lines(node: yaml.Node, section: str = "xids") -> dict[object, tuple[int, dict[str, int]]]:
    """Entry index (``xids``) or name (``plans``, ``buckets``) -> (line of the entry, line
    of each of its keys), for error messages; "" -> the section's own line."""
    out: dict[object, tuple[int, dict[str, int]]] = {}
    if not isinstance(node, yaml.MappingNode):
        return out
    for key, value in node.value:
        if key.value != section:
            continue
        out[""] = (key.start_mark.line + 1, {})
        items: list[tuple[object, yaml.Node]] = []
        if isinstance(value, yaml.SequenceNode):
            items = list(enumerate(value.value))
        elif isinstance(value, yaml.MappingNode):
            items = [(str(k.value), v) for k, v in value.value]
        for ident, item in items:
            keys = {}
            if isinstance(item, yaml.MappingNode):
                keys = {str(k.value): k.start_mark.line + 1 for k, _ in item.value}
            out[ident] = (item.start_mark.line + 1, keys)
    return out


def parse_catalog(text: str, source: str = "xid_catalog.yaml") -> dict[int, XidInfo]:
    return dict(parse_full(text, source).xids)


def parse_full(text: str, source: str = "xid_catalog.yaml") -> Catalog:
    try:
        root, data = yamlsafe.compose_and_load(text)  # one parse: lines and values
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise XidCatalogError(f"{source}{where}: not valid YAML: {problem}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("xids"), list):
        raise XidCatalogError(f"{source}:1: expected a mapping with a list under 'xids'")
    top = _lines(root, "xids") if root is not None else {}
    for key in data:
        if key not in _TOP:
            raise XidCatalogError(f"{source}:1: {key}: unknown key (keys: {', '.join(_TOP)})")
    buckets = _parse_buckets(data.get("buckets", {}), root, source)
    plans = (
        _parse_plans(data["plans"], root, source)
        if "plans" in data
        else {NO_PLAN: Plan(NO_PLAN, None, None, "", (), (), "")}
    )
    out: dict[int, XidInfo] = {}
    for i, entry in enumerate(data["xids"]):
        line, keys = top.get(i, (0, {}))

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
            if buckets and entry[key] is not None and entry[key] not in buckets:
                fail(key, f"bucket {entry[key]!r} is not explained under 'buckets'")
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
        plan = entry.get("plan", NO_PLAN)
        if plan not in plans:
            fail("plan", f"{plan!r} is not one of the plans ({', '.join(plans)})")
        variants = _variants(entry.get("variants", []), plans, fail)
        for name in (plan, *(v.plan for v in variants)):
            wanted = plans[name].diagnosis
            if wanted is not None and wanted not in diagnoses:
                fail("plan", f"plan {name!r} leads to {wanted}, which is not in its diagnoses")
        out[code] = XidInfo(
            code,
            entry["mnemonic"],
            entry["meaning"],
            entry["immediate_action"],
            entry["investigatory_action"],
            entry["layer"],
            tuple(diagnoses),
            notes,
            plan,
            variants,
        )
    return Catalog(out, plans, buckets)


def _variants(raw: Any, plans: Mapping[str, Plan], fail: Any) -> tuple[Variant, ...]:
    if not isinstance(raw, list):
        fail("variants", "expected a list of {field, equals, plan}")
    out: list[Variant] = []
    v: Any
    for j, v in enumerate(raw):
        if not isinstance(v, Mapping) or set(v) != {"field", "equals", "plan"}:
            fail("variants", f"[{j}]: expected exactly field, equals and plan")
        if v["field"] not in VARIANT_FIELDS:
            fail("variants", f"[{j}].field: {v['field']!r} is not one of {list(VARIANT_FIELDS)}")
        if not isinstance(v["equals"], str) or not v["equals"].strip():
            fail("variants", f"[{j}].equals: expected a non-empty string")
        if v["plan"] not in plans:
            fail("variants", f"[{j}].plan: {v['plan']!r} is not one of the plans")
        out.append(Variant(str(v["field"]), _norm(v["equals"]), str(v["plan"])))
    return tuple(out)


def _parse_buckets(raw: object, root: yaml.Node | None, source: str) -> dict[str, str]:
    lines = _lines(root, "buckets") if root is not None else {}
    if not isinstance(raw, Mapping):
        raise XidCatalogError(f"{source}:{lines.get('', (1, {}))[0]}: buckets: expected a mapping")
    out: dict[str, str] = {}
    for name, text in raw.items():
        if not isinstance(name, str) or not isinstance(text, str) or not text.strip():
            line = lines.get(str(name), (1, {}))[0]
            raise XidCatalogError(f"{source}:{line}: buckets.{name}: expected a sentence")
        out[name] = text.strip()
    return out


def _parse_plans(raw: object, root: yaml.Node | None, source: str) -> dict[str, Plan]:
    lines = _lines(root, "plans") if root is not None else {}
    if not isinstance(raw, Mapping) or NO_PLAN not in raw:
        line = lines.get("", (1, {}))[0]
        raise XidCatalogError(f"{source}:{line}: plans: expected a mapping with '{NO_PLAN}'")
    out: dict[str, Plan] = {}
    for name, body in raw.items():
        line, keys = lines.get(str(name), (1, {}))

        def fail(
            key: str,
            problem: str,
            name: object = name,
            line: int = line,
            keys: dict[str, int] = keys,
        ) -> None:
            raise XidCatalogError(f"{source}:{keys.get(key, line)}: plans.{name}.{key}: {problem}")

        if not isinstance(body, Mapping):
            raise XidCatalogError(f"{source}:{line}: plans.{name}: expected a mapping")
        for key in body:
            if key not in _PLAN_KEYS:
                fail(str(key), "unknown key")
        diagnosis = body.get("diagnosis")
        if diagnosis is not None and diagnosis not in XID_DIAGNOSES:
            fail("diagnosis", f"{diagnosis!r} is not a diagnosis code an Xid can lead to")
        if (diagnosis is None) != (name == NO_PLAN):
            fail("diagnosis", f"every plan but '{NO_PLAN}' leads to a diagnosis")
        severity = body.get("severity")
        if (severity is None) != (diagnosis is None) or (
            severity is not None and severity not in SEVERITIES
        ):
            fail("severity", f"expected one of {list(SEVERITIES)} with a diagnosis")
        for key in ("nvidia", "source"):
            if not isinstance(body.get(key), str) or not body[key].strip():
                fail(key, "expected a non-empty string")
        actions: list[PlanAction] = []
        raw_actions = body.get("actions", [])
        if not isinstance(raw_actions, list) or (diagnosis is not None and not raw_actions):
            fail("actions", "expected a list of {kind, command|instruction}")
        for j, a in enumerate(raw_actions):
            if not isinstance(a, Mapping) or a.get("kind") not in ACTION_KINDS:
                fail("actions", f"[{j}].kind: expected one of {list(ACTION_KINDS)}")
            texts = [k for k in ("command", "instruction") if k in a]
            if len(texts) != 1 or set(a) != {"kind", texts[0]} or not isinstance(a[texts[0]], str):
                fail("actions", f"[{j}]: expected kind and one of command or instruction")
            actions.append(PlanAction(a["kind"], a[texts[0]], texts[0] == "command"))
        rules = body.get("rules", [])
        if not isinstance(rules, list) or not all(
            isinstance(r, str) and r.count("/") == 1 for r in rules
        ):
            fail("rules", "expected a list of rule-id/branch-id")
        out[str(name)] = Plan(
            str(name),
            diagnosis,
            severity,
            body["nvidia"].strip(),
            tuple(actions),
            tuple(rules),
            body["source"].strip(),
        )
    return out


def load_catalog(path: Path = CATALOG_PATH) -> dict[int, XidInfo]:
    return parse_catalog(path.read_text(encoding="utf-8"), str(path))


@functools.cache
def full_catalog() -> Catalog:
    return parse_full(CATALOG_PATH.read_text(encoding="utf-8"), str(CATALOG_PATH))


def catalog() -> Mapping[int, XidInfo]:
    return full_catalog().xids


def plans() -> Mapping[str, Plan]:
    return full_catalog().plans


def xid_info(code: int) -> XidInfo:
    return catalog().get(code) or unknown_xid(code)


def plan_for(code: int, fields: Mapping[str, object]) -> str:
    """The plan for one Xid line: the first variant whose field the line printed with that
    value, else the entry's own plan; a code newer than the catalog has none."""
    info = catalog().get(code)
    if info is None:
        return NO_PLAN
    for v in info.variants:
        value = fields.get(v.field)
        if value is not None and value != "" and _norm(value) == v.equals:
            return v.plan
    return info.plan


def describe_bucket(bucket: str | None) -> str:
    """NVIDIA's bucket name with what it asks for, in words: ``RESTART_BM - restart ...``."""
    if not bucket:
        return ""
    text = full_catalog().buckets.get(bucket)
    return f"{bucket} - {text}" if text else bucket
