"""The rules' Xid lists and the Xid catalog say the same thing (one meaning per Xid)."""

import yaml

from moptd.kernel.xid import load_catalog
from tests.conftest import REPO

LIST_FOR_CODE = {
    "xid_application": "XID_APPLICATION_FAULT",
    "xid_ecc_uncorrectable": "ECC_UNCORRECTABLE",
    "xid_ecc_correctable": "ECC_CORRECTABLE_RATE_HIGH",
    "xid_remap_failure": "ROW_REMAP_FAILURE",
    "xid_nvlink": "NVLINK_ERROR",
    "xid_lost": "GPU_LOST",
    "xid_gsp": "GSP_FIRMWARE_ERROR",
}


def test_xid_lists_match_the_catalog():
    lists = yaml.safe_load((REPO / "rules/lists.rules.yaml").read_text())["lists"]
    catalog = load_catalog()
    for name, code in LIST_FOR_CODE.items():
        expected = sorted(x.code for x in catalog.values() if code in x.diagnoses)
        assert sorted(lists[name]) == expected, name
    reset = sorted(x.code for x in catalog.values() if "GPU_RESET_REQUIRED" in x.diagnoses)
    # 154 (recovery action changed) has a list of its own: it names the action in its text
    assert sorted([*lists["xid_reset"], *lists["xid_recovery_changed"]]) == reset
