"""What makes `moptd explain` quick (issue 31, item 6), checked without timing anything:
the rules are parsed by libyaml with the same result as the pure-Python loader, and a
command does not import what it does not use (aiohttp, the collectors, jsonschema, pynvml,
the rule loader where the rules' facts are cached)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from moptd import yamlsafe
from moptd.diagnose import loader
from tests.daemon_proc import DaemonProcess

REPO = Path(__file__).parent.parent
PASTE = REPO / "tests/fixtures/kernel-drill/xid63.log"


def _plain(doc: object) -> object:
    """The document with its line maps, to compare two loaders' results whole."""
    if isinstance(doc, loader._Map):
        return ("map", doc.line, dict(doc.lines), {k: _plain(v) for k, v in doc.items()})
    if isinstance(doc, loader._List):
        return ("list", doc.line, list(doc.lines), [_plain(v) for v in doc])
    return doc


@pytest.mark.skipif(not yamlsafe.LIBYAML, reason="PyYAML built without libyaml")
def test_libyaml_and_the_python_loader_read_every_shipped_rule_file_alike() -> None:
    files = sorted(loader.default_rules_dir().rglob("*.yaml"))
    assert len(files) > 20
    for f in files:
        text = f.read_text(encoding="utf-8")
        fast = yamlsafe.load(text, loader._CLoader)
        slow = yamlsafe.load(text, loader._PyLoader)
        assert _plain(fast) == _plain(slow), f


@pytest.mark.parametrize("cls", [loader._CLoader, loader._PyLoader], ids=["libyaml", "python"])
def test_both_loaders_refuse_a_duplicate_key_at_its_line(cls: type[yamlsafe.Loader]) -> None:
    with pytest.raises(yaml.MarkedYAMLError) as info:
        yamlsafe.load("a: 1\nb:\n  c: 2\n  c: 3\n", cls)
    assert info.value.problem == "duplicate key 'c'"
    assert info.value.problem_mark is not None
    assert info.value.problem_mark.line + 1 == 4


@pytest.mark.parametrize("cls", [loader._CLoader, loader._PyLoader], ids=["libyaml", "python"])
def test_both_loaders_say_nested_too_deeply(cls: type[yamlsafe.Loader]) -> None:
    with pytest.raises(yaml.YAMLError, match="nested too deeply"):
        yamlsafe.load("a: " + "[" * 5000 + "]" * 5000 + "\n", cls)


# `python -m moptd ARGS` that writes sys.modules at exit (-X importtime misses what
# importlib.import_module loads)
MODULES_AT_EXIT = (
    "import atexit, runpy, sys; out = sys.argv.pop(1); "
    "atexit.register(lambda: open(out, 'w').write('\\n'.join(sys.modules))); "
    "runpy.run_module('moptd', run_name='__main__', alter_sys=True)"
)


def _imported(tmp_path: Path, *args: str, ok: tuple[int, ...] = (0,)) -> set[str]:
    """The modules a real `moptd ARGS` process had imported when it ended. Its cache
    (XDG_CACHE_HOME) is the test's own, kept from one call to the next."""
    listing = tmp_path / "modules.txt"
    out = subprocess.run(
        [sys.executable, "-c", MODULES_AT_EXIT, str(listing), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert out.returncode in ok, out.stderr[-2000:]
    return set(listing.read_text().split())


def _named(mods: set[str], *packages: str) -> set[str]:
    return {m for m in mods if any(m == p or m.startswith(p + ".") for p in packages)}


def test_explain_of_a_paste_imports_neither_aiohttp_nor_the_collectors(tmp_path: Path) -> None:
    _imported(tmp_path, "explain", "--bundle", str(PASTE))  # the first: checks the schema
    mods = _imported(tmp_path, "explain", "--bundle", str(PASTE))
    assert "moptd.cli.cmd_explain" in mods  # the list is real
    assert "moptd.diagnose.loader" in mods  # a replay needs the rules themselves
    assert not _named(mods, "aiohttp", "prometheus_client")
    assert "moptd.collectors.serving" not in mods
    assert "moptd.collectors.nvml" not in mods
    assert "moptd.daemon.app" not in mods
    # the rule files passed the schema check on the first call: not checked again
    assert not _named(mods, "jsonschema")


def test_a_replay_imports_no_event_loop_exporter_nvml_or_other_command(
    tmp_path: Path,
) -> None:
    """A replay of a bundle (a kernel log, vLLM evidence) runs no event loop, exports
    nothing and reads no live GPU: asyncio (with ssl), prometheus_client, pynvml (with
    ctypes) and the other commands' modules were about 0.1 s of the 1 h replay bench
    (BENCHMARKS.md, issue 32 on the merged tree)."""
    bundle = REPO / "tests/fixtures/incidents/xid79-gpu-then-vllm-shm-stall"
    mods = _imported(tmp_path, "replay", str(bundle), "--json", ok=(0, 1, 2))
    assert "moptd.serving.signals" in mods  # the list is real: the readers are in it
    assert "moptd.collectors.container" in mods  # and the collectors ran over the bundle
    assert not _named(mods, "asyncio", "ssl", "prometheus_client", "pynvml", "ctypes")
    assert "moptd.gpu.backend" not in mods  # the live NVML backend
    others = {m for m in mods if m.startswith("moptd.cli.cmd_")}
    assert others == {"moptd.cli.cmd_replay"}


# a daemon's answer needs neither the rules (their facts are cached), nor a GPU backend,
# nor an HTTP client library, nor the exporter's
NOT_WITH_THE_DAEMON_UP = (
    "aiohttp",
    "jsonschema",
    "pynvml",
    "prometheus_client",
    "moptd.diagnose.loader",
    "moptd.diagnose.expr",
    "moptd.daemon",
    "moptd.gpu.backend",
)


@pytest.mark.slow
def test_explain_and_status_with_the_daemon_up_import_only_what_they_use(
    tmp_path: Path,
) -> None:
    d = DaemonProcess(tmp_path)
    with d:
        d.wait_metrics(timeout=30)
        deadline = time.monotonic() + 30
        while not d.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        cfg = ("--config", str(d.config_path))
        blind = (0, 4)  # 4: the kernel log not readable here, said in the header
        first = _imported(tmp_path, "explain", *cfg, ok=blind)  # fills the cache
        assert "moptd.diagnose.loader" in first  # the list is real
        explain = _imported(tmp_path, "explain", *cfg, ok=blind)
        status = _imported(tmp_path, "status", *cfg, ok=blind)
    assert "moptd.cli.cmd_explain" in explain
    assert "moptd.cli.render" in status
    assert not _named(explain, *NOT_WITH_THE_DAEMON_UP)
    assert not _named(status, *NOT_WITH_THE_DAEMON_UP)


def test_loading_the_configuration_does_not_import_aiohttp(tmp_path: Path) -> None:
    mods = _imported(tmp_path, "config")
    assert "moptd.collectors.serving" in mods  # the collectors' options are read
    assert "aiohttp" not in mods


def test_an_offline_status_imports_no_recorded_gpu_backend(tmp_path: Path) -> None:
    """The live NVML collector's start imported the recorded backend (and nvidia-smi's XML
    parser with it) that only a recording uses (BENCHMARKS.md, "issue 31: explain --offline
    on the merged tree")."""
    cfg = tmp_path / "moptd.yaml"
    config = {"state_dir": str(tmp_path / "state"), "api": {"socket": str(tmp_path / "s")}}
    cfg.write_text(yaml.safe_dump(config))
    mods = _imported(tmp_path, "status", "--offline", "--config", str(cfg), ok=(0, 4))
    assert "moptd.collectors.nvml" in mods  # the list is real: the collector started
    assert "moptd.gpu.recorded" not in mods
    assert "xml.etree.ElementTree" not in mods


def test_the_kernel_catalogs_are_read_when_an_unmatched_record_first_asks() -> None:
    """moptd.kernel.unclassified (imported by every kernel pass) reads the emitter catalogs
    on first use, not at import; its BENIGN and KNOWN_UNCLASSIFIED are still there."""
    probe = (
        "import moptd.kernel.unclassified as u, moptd.catalog.emitters as e\n"
        "read = lambda: e.catalogs.cache_info().currsize + e.emitter.cache_info().currsize\n"
        "assert read() == 0, 'read at import'\n"
        "assert not u.is_error(None, 'NVRM: loading NVIDIA UNIX x86_64 Kernel Module', 'nvrm')\n"
        "assert read() > 0\n"
        "from moptd.kernel.unclassified import BENIGN, KNOWN_UNCLASSIFIED\n"
        "assert BENIGN and KNOWN_UNCLASSIFIED\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-2000:]


# --- one parse for the Xid catalog's lines and values (yamlsafe.compose_and_load) ---

_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
_docs = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _both(text: str) -> tuple[object, object]:
    """(compose, load) of two parses, as readers had them, each node's value and marks."""
    return _serialized(yamlsafe.compose(text)), yamlsafe.load(text)


def _one(text: str) -> tuple[object, object]:
    node, data = yamlsafe.compose_and_load(text)
    return _serialized(node), data


def _serialized(node: yaml.Node | None) -> object:
    """The node tree: each node's tag, scalar value and start (line, column)."""
    if node is None:
        return None
    at = (node.tag, node.start_mark.line, node.start_mark.column)
    if isinstance(node, yaml.ScalarNode):
        return (*at, node.value)
    if isinstance(node, yaml.SequenceNode):
        return (*at, [_serialized(v) for v in node.value])
    return (*at, [(_serialized(k), _serialized(v)) for k, v in node.value])


@given(_docs, st.booleans())
def test_one_parse_gives_what_two_gave(doc: object, flow: bool) -> None:
    text = yaml.safe_dump(doc, default_flow_style=flow)
    assert _one(text) == _both(text)


@pytest.mark.parametrize(
    "text",
    [
        "a: &x [1, 2]\nb: *x\n",  # an alias: the anchored node again
        "base: &b {k: 1}\nmerged:\n  <<: *b\n  j: 2\n",  # a merge key: parsed twice
        "",
    ],
)
def test_one_parse_with_aliases_and_merges(text: str) -> None:
    assert _one(text) == _both(text)


def test_the_xid_catalog_reads_the_same_from_one_parse() -> None:
    from moptd.kernel import xid

    assert _one(xid.CATALOG_PATH.read_text(encoding="utf-8")) == _both(
        xid.CATALOG_PATH.read_text(encoding="utf-8")
    )


def test_one_parse_refuses_an_alias_bomb_as_load_does() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
        for p, c in zip("abcdef", "bcdefg", strict=True)
    )
    with pytest.raises(yamlsafe.YamlTooLarge):
        yamlsafe.compose_and_load(bomb)


# --- the expansion bound's quick pass (yamlsafe._small_tree) decides as the full walk ---


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1, 2, [3, 4]]\n", None),  # 5 nodes, a plain tree
        ("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]\n", "has more than 10 nodes"),
        ("a: &x [1, 2]\nb: *x\n", None),  # an alias within the bound: the full walk says so
        ("a: &x [1, 2, 3]\nb: [*x, *x, *x]\n", "expands to more than 10 nodes through aliases"),
        ("&a [*a]\n", "an alias refers to its own node"),
    ],
)
def test_the_expansion_bound_decides_alike_with_and_without_the_quick_pass(
    text: str, problem: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def outcome() -> str | None:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        try:
            yamlsafe.check_expansion(node, max_nodes=10)
        except yamlsafe.YamlTooLarge as exc:
            return str(exc.problem)
        return None

    assert outcome() == problem
    monkeypatch.setattr(yamlsafe, "_small_tree", lambda root, max_nodes: False)
    assert outcome() == problem
