"""The Xid catalog: complete, consistent with the diagnosis codes, and validated."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.diagnose.codes import CODES
from moptd.kernel.xid import (
    ACTION_KINDS,
    CATALOG_PATH,
    SEVERITIES,
    XID_DIAGNOSES,
    XidCatalogError,
    catalog,
    describe_bucket,
    load_catalog,
    parse_catalog,
    plan_for,
    plans,
    xid_info,
)


def test_every_code_of_nvidias_catalog_is_there():
    cat = load_catalog()
    # NVIDIA's Ampere+ catalog numbers its Xids 1..172 without gaps
    assert sorted(cat) == list(range(1, 173))
    for info in cat.values():
        assert info.mnemonic
        assert info.meaning
        assert info.layer


def test_diagnoses_are_real_codes():
    assert XID_DIAGNOSES <= set(CODES)
    for info in catalog().values():
        assert set(info.diagnoses) <= set(CODES)


@pytest.mark.parametrize(
    ("code", "mnemonic", "immediate", "diagnoses"),
    [
        (
            13,
            "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY",
            "RESTART_APP",
            ("XID_APPLICATION_FAULT",),
        ),
        (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", ("XID_APPLICATION_FAULT",)),
        (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", ("XID_APPLICATION_FAULT",)),
        (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45", ("XID_APPLICATION_FAULT",)),
        (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", ("ECC_UNCORRECTABLE",)),
        (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", ("ROW_REMAP_FAILURE",)),
        (74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", ("NVLINK_ERROR",)),
        (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", ("GPU_LOST",)),
        (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", ("ECC_UNCORRECTABLE",)),
        (119, "GSP_RPC_TIMEOUT", "RESET_GPU", ("GSP_FIRMWARE_ERROR", "GPU_RESET_REQUIRED")),
        (120, "GSP_ERROR", "RESET_GPU", ("GSP_FIRMWARE_ERROR", "GPU_RESET_REQUIRED")),
        (154, "GPU_RECOVERY_ACTION_CHANGED", "XID_154", ("GPU_RESET_REQUIRED",)),
    ],
)
def test_key_xids(code, mnemonic, immediate, diagnoses):
    info = xid_info(code)
    assert (info.mnemonic, info.immediate_action, info.diagnoses) == (
        mnemonic,
        immediate,
        diagnoses,
    )


def test_where_tools_disagree_the_default_follows_nvidia_and_says_why():
    x63, x92, x109 = xid_info(63), xid_info(92), xid_info(109)
    # 63: NVIDIA IGNORE -> a pending remap (warning), not a failure as EKS/Azure/GPUd say
    assert (x63.immediate_action, x63.diagnoses) == ("IGNORE", ("ROW_REMAP_PENDING",))
    assert "EKS" in x63.notes
    assert "follows NVIDIA" in x63.notes
    # 92: NVIDIA IGNORE -> a warning, where Azure NHC fails the node
    assert (x92.immediate_action, x92.diagnoses) == ("IGNORE", ("ECC_CORRECTABLE_RATE_HIGH",))
    assert "Azure" in x92.notes
    assert "follows NVIDIA" in x92.notes
    # 109: NVIDIA RESET_GPU, where k8s-device-plugin ignores it as an application error
    assert (x109.immediate_action, x109.diagnoses) == ("RESET_GPU", ("GPU_RESET_REQUIRED",))
    assert "device-plugin" in x109.notes
    assert "follows NVIDIA" in x109.notes
    for code in (63, 92, 109):
        assert CODES[xid_info(code).diagnoses[0]][1] != "critical" or code == 109


def test_unknown_code_is_not_invented():
    info = xid_info(9999)
    assert (info.mnemonic, info.diagnoses, info.layer) == ("UNKNOWN", (), "unknown")


def _entry(**over):
    e = {
        "code": 1,
        "mnemonic": "X",
        "meaning": "m",
        "immediate_action": "IGNORE",
        "investigatory_action": None,
        "layer": "driver",
        "diagnoses": [],
    }
    e.update(over)
    return e


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([_entry(code="one")], r"xids\[0\]\.code: expected a positive integer"),
        ([_entry(), _entry()], r"xids\[1\]\.code: Xid 1 listed twice"),
        ([_entry(layer="cosmic")], r"xids\[0\]\.layer: 'cosmic' is not one of"),
        ([_entry(diagnoses=["NOT_A_CODE"])], r"xids\[0\]\.diagnoses: 'NOT_A_CODE'"),
        ([_entry(colour="red")], r"xids\[0\]\.colour: unknown key"),
        ([{k: v for k, v in _entry().items() if k != "meaning"}], r"xids\[0\]\.meaning: missing"),
        ([_entry(notes=3)], r"xids\[0\]\.notes: expected a string"),
    ],
)
def test_malformed_catalog_names_file_line_and_key(entries, message):
    text = yaml.safe_dump({"xids": entries}, sort_keys=False)
    with pytest.raises(XidCatalogError, match=message) as info:
        parse_catalog(text, "cat.yaml")
    assert str(info.value).startswith("cat.yaml:")
    line = int(str(info.value).split(":")[1])
    assert line >= 2  # the line of the offending entry or key, not the file head


def test_not_yaml_names_the_line():
    with pytest.raises(XidCatalogError, match=r"^cat\.yaml:3: not valid YAML: expected ','"):
        parse_catalog("xids:\n  - code: [1\n", "cat.yaml")


def test_shipped_file_is_the_one_loaded():
    assert CATALOG_PATH.name == "xid_catalog.yaml"
    assert load_catalog(CATALOG_PATH) == dict(catalog())


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
        lambda c: st.one_of(
            st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_random_documents_only_raise_catalog_errors(doc):
    text = yaml.safe_dump({"xids": doc} if not isinstance(doc, dict) else doc)
    message = "x.yaml:"
    try:
        parse_catalog(text, "x.yaml")
    except XidCatalogError as exc:
        message = str(exc)
    assert message.startswith("x.yaml:")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_random_text_only_raises_catalog_errors(text):
    message = "x.yaml"
    try:
        parse_catalog(text, "x.yaml")
    except XidCatalogError as exc:
        message = str(exc)
    assert message.startswith("x.yaml")


# --- plans: moptd's action per class of Xid, and the rules that carry them ---------------


def _branches() -> dict[str, object]:
    from moptd.diagnose.loader import default_rules_dir, load_rules

    loaded = load_rules([default_rules_dir()])
    assert not loaded.errors
    out: dict[str, object] = {}
    for rule in loaded.ruleset.rules:
        stack = [(b, f"{rule.id}/{b.id}") for b in rule.branches]
        while stack:
            b, path = stack.pop()
            out[path] = b
            stack.extend((c, f"{path}/{c.id}") for c in b.children)
    return out


def test_rules_take_their_actions_from_the_plans():
    branches = _branches()
    for plan in plans().values():
        for path in plan.rules:
            branch = branches.get(path)
            assert branch is not None, f"plan {plan.name}: no rule branch {path}"
            v = branch.verdict  # type: ignore[attr-defined]
            assert v is not None, path
            assert (v.code, v.severity) == (plan.diagnosis, plan.severity), path
            got = [(a.kind, a.text, a.is_command) for a in v.actions]
            want = [(a.kind, a.text, a.is_command) for a in plan.actions]
            assert got == want, f"{path} does not carry plan {plan.name}'s actions"


def test_every_branch_that_selects_a_plan_is_listed_by_it():
    listed = {path: p.name for p in plans().values() for path in p.rules}
    for path, branch in _branches().items():
        cond = branch.cond  # type: ignore[attr-defined]
        text = "" if cond is None else cond.text
        for name in re.findall(r'plan == "(\w+)"', text):
            assert name in plans(), f"{path}: no plan {name!r}"
            assert listed.get(path) == name, f"{path} selects {name} but the plan omits it"


def test_plan_kinds_and_severities_are_the_engines():
    from moptd.diagnose.codes import SEVERITIES as CODE_SEVERITIES
    from moptd.diagnose.model import ACTION_KINDS as MODEL_KINDS

    assert ACTION_KINDS == MODEL_KINDS
    assert SEVERITIES == CODE_SEVERITIES
    for p in plans().values():
        if p.diagnosis is not None:
            assert p.diagnosis in CODES


@pytest.mark.parametrize(
    ("code", "fields", "plan"),
    [
        # NVIDIA: WORKFLOW_XID_48 / RESET_GPU: drain, reset, RMA (never RESTART_APP)
        (48, {}, "drain_reset_rma"),
        (95, {}, "drain_reset_rma"),
        (140, {}, "drain_reset_rma"),
        # contained to one context: RESTART_APP
        (94, {}, "contained_ecc"),
        (13, {}, "restart_app"),
        (63, {}, "remap_pending"),
        (64, {}, "remap_failure"),
        (74, {}, "nvlink_reset"),
        (79, {}, "gpu_lost"),
        (119, {}, "gsp_reset"),
        (62, {}, "reset_gpu"),
        # NVLink5: the line's severity word decides
        (144, {"severity": "nonfatal"}, "nvlink5_nonfatal"),
        (145, {"severity": "fatal"}, "nvlink5_fatal"),
        (149, {"severity": "link_fatal"}, "nvlink5_fatal"),
        (150, {"severity": ""}, "nvlink5_fatal"),
        # Xid 154: the new recovery action decides
        (154, {"recovery_action": "GPU Reset Required"}, "reset_gpu"),
        (154, {"recovery_action": "Drain and Reset"}, "reset_gpu"),
        (154, {"recovery_action": "Node Reboot Required"}, "reboot_node"),
        (154, {"recovery_action": " node  reboot REQUIRED"}, "reboot_node"),
        (154, {"recovery_action": "None"}, "none"),
        (154, {"recovery_action": "Drain P2P"}, "none"),
        (154, {"recovery_action": "Recover IMEX Domain"}, "recovery_check"),
        (154, {}, "recovery_check"),
        # no action of moptd's own, or a code newer than the catalog
        (93, {}, "none"),
        (9999, {"severity": "fatal"}, "none"),
    ],
)
def test_plan_for_each_class(code, fields, plan):
    assert plan_for(code, fields) == plan


def test_reboot_plan_reboots_and_never_resets_first():
    kinds = [a.kind for a in plans()["reboot_node"].actions]
    assert kinds[:2] == ["drain_node", "reboot_node"]
    assert "reset_gpu" not in kinds
    ecc = [a.kind for a in plans()["drain_reset_rma"].actions]
    assert ecc == ["drain_node", "reset_gpu", "replace_hardware"]
    assert "restart_serving" not in ecc
    nonfatal = [a.kind for a in plans()["nvlink5_nonfatal"].actions]
    assert "reset_gpu" not in nonfatal
    assert "drain_node" not in nonfatal
    assert plans()["none"].actions == ()


def test_every_bucket_is_explained_in_words():
    for info in catalog().values():
        for bucket in (info.immediate_action, info.investigatory_action):
            if bucket:
                text = describe_bucket(bucket)
                assert text.startswith(f"{bucket} - "), bucket
                assert len(text) > len(bucket) + 20, bucket
    assert describe_bucket("RESTART_BM").startswith("RESTART_BM - restart the bare-metal machine")
    assert describe_bucket("NOT_A_BUCKET") == "NOT_A_BUCKET"
    assert describe_bucket(None) == ""


_PLAN_OK = {
    "none": {"nvidia": "IGNORE", "source": "s"},
    "p": {
        "diagnosis": "GPU_LOST",
        "severity": "critical",
        "nvidia": "RESTART_BM",
        "actions": [{"kind": "reboot_node", "command": "systemctl reboot"}],
        "rules": ["gpu-lost/xid79"],
        "source": "s",
    },
}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"plans": {"p": _PLAN_OK["p"]}}, r"plans: expected a mapping with 'none'"),
        (
            {"plans": {**_PLAN_OK, "p": {**_PLAN_OK["p"], "colour": 1}}},
            r"plans\.p\.colour: unknown",
        ),
        (
            {"plans": {**_PLAN_OK, "p": {**_PLAN_OK["p"], "diagnosis": "NOPE"}}},
            r"plans\.p\.diagnosis: 'NOPE' is not a diagnosis code",
        ),
        (
            {"plans": {**_PLAN_OK, "p": {**_PLAN_OK["p"], "actions": [{"kind": "pray"}]}}},
            r"plans\.p\.actions: \[0\]\.kind: expected one of",
        ),
        (
            {"plans": {**_PLAN_OK, "p": {**_PLAN_OK["p"], "severity": "dire"}}},
            r"plans\.p\.severity: expected one of",
        ),
        ({"plans": _PLAN_OK, "xids": [_entry(plan="q")]}, r"xids\[0\]\.plan: 'q' is not one of"),
        (
            {"plans": _PLAN_OK, "xids": [_entry(plan="p")]},
            r"xids\[0\]\.plan: plan 'p' leads to GPU_LOST, which is not in its diagnoses",
        ),
        (
            {
                "plans": _PLAN_OK,
                "xids": [_entry(variants=[{"field": "colour", "equals": "x", "plan": "none"}])],
            },
            r"xids\[0\]\.variants: \[0\]\.field: 'colour' is not one of",
        ),
        (
            {"buckets": {"RESTART_BM": "power-cycle"}, "xids": [_entry()]},
            r"xids\[0\]\.immediate_action: bucket 'IGNORE' is not explained",
        ),
        ({"colour": 1, "xids": []}, r"colour: unknown key"),
    ],
)
def test_malformed_plans_name_file_line_and_key(doc, message):
    text = yaml.safe_dump({"xids": [], **doc}, sort_keys=False)
    with pytest.raises(XidCatalogError, match=message) as info:
        parse_catalog(text, "cat.yaml")
    assert str(info.value).startswith("cat.yaml:")


_TEXT = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["none", "p", "q", 3]),
        st.one_of(
            _TEXT,
            st.dictionaries(
                st.sampled_from(
                    ["diagnosis", "severity", "nvidia", "actions", "rules", "source", "x"]
                ),
                st.one_of(
                    _TEXT,
                    st.sampled_from(["GPU_LOST", "critical", "warning"]),
                    st.lists(
                        st.one_of(
                            _TEXT,
                            st.dictionaries(
                                st.sampled_from(["kind", "command", "instruction"]),
                                st.one_of(_TEXT, st.sampled_from(["inspect", "reset_gpu"])),
                                max_size=3,
                            ),
                        ),
                        max_size=3,
                    ),
                ),
                max_size=7,
            ),
        ),
        max_size=4,
    ),
    st.one_of(_TEXT, st.dictionaries(st.text(max_size=6), _TEXT, max_size=3)),
    st.lists(
        st.dictionaries(st.sampled_from(["field", "equals", "plan"]), _TEXT, max_size=3),
        max_size=3,
    ),
)
def test_random_plans_buckets_and_variants_only_raise_catalog_errors(plan_doc, buckets, variants):
    doc = {
        "buckets": buckets,
        "plans": plan_doc,
        "xids": [_entry(plan="p", variants=variants, diagnoses=["GPU_LOST"])],
    }
    message = "x.yaml:"
    try:
        parse_catalog(yaml.safe_dump(doc), "x.yaml")
    except XidCatalogError as exc:
        message = str(exc)
    assert message.startswith("x.yaml:")


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=-5, max_value=300),
    st.dictionaries(
        st.sampled_from(["severity", "recovery_action", "link", "code"]),
        st.one_of(st.none(), st.integers(), st.text(max_size=40)),
        max_size=4,
    ),
)
def test_plan_for_any_line_is_a_known_plan(code, fields):
    assert plan_for(code, fields) in plans()
