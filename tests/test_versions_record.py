"""versions.json's reader: any JSON either checks or is refused naming the file and key,
and what checks can be observed, shown and compared without raising."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.located import LocatedError
from moptd.serving.version_lock import FORMAT, check_record, cuda_line, diff, flat, observations

SP = Path(__file__).parent / "fixtures" / "site-packages"

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 200), st.text(max_size=12))
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
_version = st.one_of(
    st.text(max_size=10), st.sampled_from(["12.4", "11.8", "9.0", "12.0", "535.104.05"])
)
_gpu = st.fixed_dictionaries(
    {"index": st.integers(0, 7)},
    optional={"name": st.text(max_size=8), "compute_capability": _version},
)
_stack = st.fixed_dictionaries(
    {"name": st.text(max_size=8)},
    optional={
        "distributions": st.dictionaries(st.text(max_size=8), _version, max_size=4),
        "cuda_runtime": st.one_of(st.none(), st.fixed_dictionaries({"version": _version})),
        "cuda_build": st.one_of(st.none(), st.fixed_dictionaries({"version": _version})),
        "torch": st.one_of(st.none(), st.fixed_dictionaries({"version": _version}), _json),
        "site_packages": _json,
    },
)
_doc = st.fixed_dictionaries(
    {"format": st.one_of(st.just(FORMAT), st.text(max_size=5))},
    optional={
        "driver": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={k: _version for k in ("version", "cuda", "cuda_source", "kernel_module")},
            ),
            _json,
        ),
        "gpus": st.one_of(st.lists(_gpu, max_size=3), _json),
        "serving": st.one_of(st.lists(_stack, max_size=3), _json),
    },
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_doc, _json), st.one_of(_doc, _json))
def test_any_json_checks_or_is_refused_and_what_checks_is_usable(a: object, b: object) -> None:
    checked = []
    refused = []
    for doc in (a, b):
        try:
            checked.append(check_record(doc, "versions.json"))
        except LocatedError as e:
            refused.append(e.file)
    assert set(refused) <= {"versions.json"}
    for doc in checked:
        observations(doc)
        flat(doc)
        cuda_line(doc)
    if len(checked) == 2:
        for change in diff(checked[0], checked[1]):
            assert change["before"] != change["after"]


def test_doctor_shows_a_configured_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "moptd.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path / 'state'}\napi: {{socket: {tmp_path / 'api.sock'}}}\n"
        f"versions:\n  site_packages: [{SP / 'vllm-0.4.0-cu121'}]\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "doctor", "--json", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    doc = json.loads(out.stdout)
    rows = {c["name"]: c for c in doc["checks"] if c["name"].startswith("version")}
    assert rows["version configured PyTorch"]["detail"] == "2.1.2, CUDA build 12.1"
    assert rows["version configured vLLM"]["detail"] == "0.4.0.post1"
    assert rows["version configured CUDA runtime"]["detail"].startswith(
        "12.1 (nvidia-cuda-runtime-cu12)"
    )
    assert rows["version configured TensorRT"]["status"] == "skipped"


def test_a_bad_site_packages_setting_names_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "moptd.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nversions:\n  site_packages: /opt/venv\n")
    out = subprocess.run(
        [sys.executable, "-m", "moptd", "doctor", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2
    assert "versions.site_packages" in out.stderr + out.stdout
