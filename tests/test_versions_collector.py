"""The versions collector: the daemon decides the version rules live (collector -> store ->
the shipped rules), and replay runs the same collector over a bundle's versions.json."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from moptd.clock import SystemClock
from moptd.collector import CollectorContext, Unavailable
from moptd.collectors import registry
from moptd.collectors.versions import (
    MANAGED_COMMAND,
    SITE_PACKAGES,
    VersionsCollector,
    global_options_of,
)
from moptd.config import parse_config
from moptd.daemon.app import make_runtime, missing_namespaces
from moptd.diagnose.loader import default_rules_dir
from moptd.diagnose.service import RuleService
from moptd.located import LocatedError
from moptd.serving.version_lock import VersionsRecord, stack_for
from moptd.store import SignalStore
from tests.test_versions_rules import driver_of

FIX = Path(__file__).parent / "fixtures"
SP = FIX / "site-packages"
# A real /proc/driver/nvidia/version of an H200 host (tests/fixtures/bundles/h200-matmul-power-cap)
MODULE = FIX / "bundles" / "h200-matmul-power-cap" / "kernel" / "driver_version"
OLD_DRIVER = "nvsmi-paste/table-470-a10g.txt"  # driver 470.256.02, CUDA 11.4


def _procfs_with_module(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    (proc / "driver" / "nvidia").mkdir(parents=True)
    shutil.copy(MODULE, proc / "driver" / "nvidia" / "version")
    return proc


def test_live_reads_the_configured_environment_and_the_kernel_module(tmp_path: Path) -> None:
    ctx = CollectorContext(
        procfs=_procfs_with_module(tmp_path),
        global_options={SITE_PACKAGES: (str(SP / "vllm-0.4.0-cu121"),), MANAGED_COMMAND: None},
    )
    c = VersionsCollector(ctx)
    batch = asyncio.run(c.collect())
    asyncio.run(c.stop())
    assert c.last_record is not None
    assert c.last_record["driver"]["kernel_module"] == "580.159.04"
    (stack,) = c.last_record["serving"]
    assert stack["name"] == "configured"
    assert stack["distributions"]["vllm"] == "0.4.0.post1"
    got = {(s.signal, dict(s.labels).get("serving")): s.value for s in batch.samples}
    assert got[("versions.runtime_cuda", "configured")] == 12010.0
    assert got[("versions.build_cuda", "configured")] == 12010.0


def test_live_with_no_source_at_all_is_unavailable(tmp_path: Path) -> None:
    # no module file, no environment: on a host without pynvml's driver this is "no data"
    # (the rules see the versions namespace as unknown), never a healthy empty record
    ctx = CollectorContext(procfs=tmp_path / "proc", global_options={})
    c = VersionsCollector(ctx)
    try:
        record = c._live().to_json()
    finally:
        asyncio.run(c.stop())
    if record["driver"]["version"] or record["gpus"]:
        pytest.skip("this host has an NVIDIA driver that NVML answers for")
    with pytest.raises(Unavailable, match=r"versions\.site_packages"):
        c.read()


def test_the_managed_engines_environment_comes_from_its_command(tmp_path: Path) -> None:
    raw = {
        "versions": {"site_packages": [str(SP / "vllm-0.4.0-cu121")]},
        "collectors": {
            "serving": {"managed": {"name": "llm", "command": ["/nonexistent/venv/bin/vllm"]}}
        },
    }
    g = global_options_of(raw)
    assert g[MANAGED_COMMAND] == ("llm", ("/nonexistent/venv/bin/vllm",))
    c = VersionsCollector(CollectorContext(global_options=g))
    # the command's virtualenv is absent; the configured directory stays, under its name
    assert c.environments() == [("llm", [SP / "vllm-0.4.0-cu121"])]
    broken = {"collectors": {"serving": {"managed": {"command": 3}}}}
    assert global_options_of(broken)[MANAGED_COMMAND] is None


def _record_file(tmp_path: Path) -> Path:
    record = VersionsRecord(driver_of(OLD_DRIVER), [stack_for("vllm", [SP / "vllm-0.4.0-cu121"])])
    path = tmp_path / "versions.json"
    path.write_text(json.dumps(record.to_json()))
    return path


def _daemon_findings(config_text: str) -> tuple[set[tuple[str, str]], frozenset[str]]:
    config = parse_config(config_text, "moptd.yaml", registry())
    store = SignalStore()
    runtime = make_runtime(config, store)
    asyncio.run(runtime.collect_once())
    missing = missing_namespaces(runtime)
    rules = RuleService(store, SystemClock(), [default_rules_dir()], missing=missing)
    rules.tick()
    return {(f.code, f.subject) for f in rules.lifecycle.findings.values()}, missing


ONLY_VERSIONS = "".join(
    f"  {name}: {{enabled: false}}\n" for name in registry() if name != "versions"
)


def test_the_daemon_decides_cuda_driver_too_old_from_the_collector(tmp_path: Path) -> None:
    record = _record_file(tmp_path)
    codes, missing = _daemon_findings(
        f"state_dir: {tmp_path / 'state'}\ncollectors:\n{ONLY_VERSIONS}"
        f"  versions: {{record_file: {record}}}\n"
    )
    assert "versions" not in missing
    assert ("CUDA_DRIVER_TOO_OLD", "node") in codes


def test_a_failing_collector_leaves_the_version_rules_unknown(tmp_path: Path) -> None:
    bad = tmp_path / "versions.json"
    bad.write_text('{"format": "moptd-versions/v1", "driver": []}')
    with pytest.raises(LocatedError, match="driver: must be an object"):
        VersionsCollector(CollectorContext(options={"record_file": str(bad)})).read()
    codes, missing = _daemon_findings(
        f"state_dir: {tmp_path / 'state'}\ncollectors:\n{ONLY_VERSIONS}"
        f"  versions: {{record_file: {bad}}}\n"
    )
    assert "versions" in missing
    assert not {c for c, _ in codes} & {"CUDA_DRIVER_TOO_OLD", "CUDA_ARCH_UNSUPPORTED"}


def test_replay_runs_the_collector_over_the_bundles_versions_json(tmp_path: Path) -> None:
    from moptd.bundle import read_bundle

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "bundle.yaml").write_text(
        "format: moptd-bundle/v1\ncaptured_at: 2026-11-29T16:21:26Z\n"
    )
    shutil.copy(_record_file(tmp_path), bundle / "versions.json")
    tl = read_bundle(bundle)
    live = VersionsCollector(
        CollectorContext(options={"record_file": str(bundle / "versions.json")})
    )
    want = sorted((s.signal, s.subject, s.labels, s.value) for s in live.read().samples)
    (batch,) = [b for _, source, b in tl.observations if source == "versions"]
    assert sorted((s.signal, s.subject, s.labels, s.value) for s in batch.samples) == want
    assert tl.meta["versions"] == live.last_record


def test_an_empty_record_file_setting_names_file_line_and_key() -> None:
    from moptd.config import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_config('collectors:\n  versions:\n    record_file: "  "\n', "moptd.yaml", registry())
    assert str(err.value) == (
        "moptd.yaml:3: key 'collectors.versions.record_file': "
        "must be a path to a versions.json, or null"
    )
