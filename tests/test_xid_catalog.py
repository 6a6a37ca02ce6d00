"""The Xid catalog: complete, consistent with the diagnosis codes, and validated."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.diagnose.codes import CODES
from moptd.kernel.xid import (
    CATALOG_PATH,
    XID_DIAGNOSES,
    XidCatalogError,
    catalog,
    load_catalog,
    parse_catalog,
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
