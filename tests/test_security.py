"""Security properties that must not regress (docs/security.md).

- static: no shell, no eval/exec of text, no unsafe YAML loader anywhere under moptd/
  (walks the AST, so a comment or a string does not count and an alias does);
- modes: what `moptd record` and `moptd install-service` write has its stated mode under a
  permissive umask (the daemon's own files are covered by tests/test_api.py::
  test_state_files_have_their_modes, tests/test_daemon_e2e.py::
  test_api_socket_mode_is_explicit_whatever_the_umask, tests/test_findings_db.py and
  tests/test_kmsg_follower.py; the API's peer authorisation with a non-root user by
  tests/test_api.py::test_non_root_peer_may_read_but_not_reload);
- input limits: a hostile bundle (path traversal, links, a 1 GiB sparse member, an alias
  bomb in bundle.yaml), an alias bomb in a configuration or rules file, an oversized or
  entity-bomb nvidia-smi dump are refused quickly with the file named.
"""

from __future__ import annotations

import ast
import io
import os
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from moptd import yamlsafe
from moptd.diagnose.loader import _Loader, default_rules_dir
from moptd.gpu.nvsmi import MAX_DUMP_BYTES, NvsmiError, parse_dump, read_dump

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "moptd"
META = b"format: moptd-bundle/v1\ncaptured_at: 2026-01-01T00:00:00Z\n"


def moptd(*args: str, umask: int | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    def child() -> None:
        if umask is not None:
            os.umask(umask)

    return subprocess.run(
        [sys.executable, "-m", "moptd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        preexec_fn=child,
    )


# --- static checks ------------------------------------------------------------------------

SAFE_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
SHELL_CALLS = {("os", "system"), ("os", "popen"), ("asyncio", "create_subprocess_shell")}
BANNED_MODULES = {"pickle", "marshal", "shelve"}
# A banned module allowed in one file, with why. marshal.loads on bytes from a file or a
# socket is unsafe; batchpack round-trips only bytes this process packed a moment before
# (a long replay's Batches, issue 32), and the test below holds it to that.
ALLOWED_IMPORTS = {("batchpack.py", "marshal")}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _safe_loader_classes(tree: ast.Module) -> set[str]:
    """Classes of this module that derive, directly or through each other, from a safe
    PyYAML loader (moptd/diagnose/loader.py's _Loader)."""
    safe = set(SAFE_LOADERS)
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name not in safe:
                if any(_dotted(b).split(".")[-1] in safe for b in node.bases):
                    safe.add(node.name)
                    changed = True
    return safe


def violations(source: str, filename: str) -> list[str]:
    tree = ast.parse(source, filename)
    safe = _safe_loader_classes(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for name in names:
                if name and name.split(".")[0] in BANNED_MODULES:
                    if (Path(filename).name, name) in ALLOWED_IMPORTS:
                        continue
                    found.append(f"{where}: imports {name}")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        for kw in node.keywords:
            if kw.arg == "shell" and not (
                isinstance(kw.value, ast.Constant) and kw.value.value is False
            ):
                found.append(f"{where}: shell={ast.unparse(kw.value)}")
        if name in ("eval", "exec", "compile", "__import__", "builtins.eval", "builtins.exec"):
            found.append(f"{where}: {name}()")
        if tuple(name.rsplit(".", 1)) in SHELL_CALLS:
            found.append(f"{where}: {name}() runs a shell")
        if name in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all"):
            found.append(f"{where}: {name}()")
        if name in ("yaml.load", "yaml.load_all", "yaml.compose", "yaml.compose_all"):
            loader = next((kw.value for kw in node.keywords if kw.arg == "Loader"), None)
            if loader is None and len(node.args) > 1:
                loader = node.args[1]
            if loader is None or _dotted(loader).split(".")[-1] not in safe:
                shown = ast.unparse(loader) if loader is not None else "no Loader"
                found.append(f"{where}: {name}() with {shown}")
    return found


def test_the_static_check_catches_what_it_looks_for():
    bad = (
        "import subprocess, os, yaml, pickle\n"
        "subprocess.run('ls', shell=True)\n"
        "subprocess.run(['ls'], shell=flag)\n"
        "eval(text)\n"
        "exec(code)\n"
        "os.system('ls')\n"
        "yaml.load(text)\n"
        "yaml.load(text, Loader=yaml.Loader)\n"
        "yaml.load(text, yaml.UnsafeLoader)\n"
        "yaml.full_load(text)\n"
    )
    assert len(violations(bad, "bad.py")) == 10
    good = (
        "import re, subprocess, yaml\n"
        "class _L(yaml.SafeLoader): pass\n"
        "class _M(_L): pass\n"
        "re.compile('x'); compiler.compile(rule_text)\n"
        "subprocess.run(['ls'], shell=False)\n"
        "yaml.safe_load(text); yaml.load(text, Loader=_M)\n"
        "yaml.compose(t, Loader=yaml.SafeLoader)\n"
    )
    assert violations(good, "good.py") == []


def test_no_shell_eval_or_unsafe_yaml_under_moptd():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    found = [v for f in files for v in violations(f.read_text(encoding="utf-8"), str(f))]
    assert found == []


def test_batchpack_unmarshals_only_what_it_packed():
    """The one marshal import: loads() only ever reads a PackedBatch's own bytes, and the
    module opens nothing."""
    tree = ast.parse((PACKAGE / "batchpack.py").read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    loads = [ast.unparse(n) for n in calls if _dotted(n.func) == "marshal.loads"]
    assert loads == ["marshal.loads(b.data)"]
    assert not [n for n in calls if _dotted(n.func).split(".")[-1] in ("open", "load", "recv")]
    assert violations("import marshal\n", "elsewhere.py") == ["elsewhere.py:1: imports marshal"]


# --- modes of what moptd writes ------------------------------------------------------------


@pytest.mark.slow
def test_recorded_bundle_is_private_whatever_the_umask(tmp_path):
    out = moptd("record", "--duration", "0", "--out", str(tmp_path / "b"), "--quiet", umask=0)
    assert out.returncode == 0, out.stderr
    root = tmp_path / "b"
    entries = [root, *root.rglob("*")]
    assert len(entries) > 5
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.lstat().st_mode) for p in entries}
    assert {
        k: m for k, m in modes.items() if m != (0o700 if Path(tmp_path, k).is_dir() else 0o600)
    } == {}


@pytest.mark.slow
def test_recorded_tarball_is_private_whatever_the_umask(tmp_path):
    tarball = tmp_path / "b.tar.gz"
    out = moptd("record", "--duration", "0", "--out", str(tarball), "--quiet", umask=0)
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(tarball.stat().st_mode) == 0o600
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
    assert members
    assert {m.name: m.mode for m in members if m.mode not in (0o600, 0o700)} == {}


def test_installed_service_files_are_0644_whatever_the_umask(tmp_path):
    out = moptd("install-service", "--prefix", str(tmp_path), "--moptd", sys.executable, umask=0)
    assert out.returncode == 0, out.stdout + out.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) >= 6
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {
        str(p): "0o644" for p in files
    }


# --- hostile bundles -----------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _file(name: str, data: bytes = b"x\n") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, b""


def _refused(bundle: Path, member: str, *, command: str = "replay") -> str:
    start = time.monotonic()
    args = ("replay", str(bundle)) if command == "replay" else ("explain", "--bundle", str(bundle))
    out = moptd(*args)
    # 3: an input that could not be used (bundle spec, issue 17)
    assert out.returncode == 3, out.stdout + out.stderr
    assert f"{member}:" in out.stderr, out.stderr
    assert "bundle refused" in out.stderr
    assert "Traceback" not in out.stderr
    assert time.monotonic() - start < 20
    return out.stderr


@pytest.mark.parametrize(
    ("member", "entry"),
    [
        ("b/../../escaped.txt", _file("b/../../escaped.txt")),
        ("/etc/cron.d/moptd", _file("/etc/cron.d/moptd")),
        ("b/kernel/dmesg.txt", _link("b/kernel/dmesg.txt", "/etc/shadow", tarfile.SYMTYPE)),
        ("b/kernel/dmesg.txt", _link("b/kernel/dmesg.txt", "b/bundle.yaml", tarfile.LNKTYPE)),
        ("b/kernel/dmesg.txt", _link("b/kernel/dmesg.txt", "", tarfile.CHRTYPE)),
    ],
    ids=["dotdot", "absolute", "symlink", "hardlink", "device"],
)
def test_replay_refuses_a_member_that_could_leave_the_bundle(tmp_path, member, entry):
    bundle = _tar(tmp_path / "t.tar.gz", [_file("b/bundle.yaml", META), entry])
    err = _refused(bundle, member)
    assert not (tmp_path.parent / "escaped.txt").exists()
    assert "outside the bundle" in err or "only files and folders" in err


def test_replay_refuses_a_1gib_sparse_member_without_unpacking_it(tmp_path):
    src = tmp_path / "src" / "b"
    (src / "kernel").mkdir(parents=True)
    (src / "bundle.yaml").write_bytes(META)
    with (src / "kernel" / "dmesg.txt").open("wb") as fh:
        fh.truncate(1 << 30)
    bundle = tmp_path / "sparse.tar.gz"
    # GNU tar stores the hole as a map: a few hundred bytes that would unpack to 1 GiB
    subprocess.run(["tar", "--sparse", "-czf", str(bundle), "-C", str(src.parent), "b"], check=True)
    assert bundle.stat().st_size < 64 * 1024
    err = _refused(bundle, "b/kernel/dmesg.txt")
    assert "1073741824 bytes" in err


def test_explain_refuses_the_same_bundle(tmp_path):
    bundle = _tar(
        tmp_path / "t.tar.gz", [_file("b/bundle.yaml", META), _file("b/../../escaped.txt")]
    )
    _refused(bundle, "b/../../escaped.txt", command="explain")


def _alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def test_replay_refuses_an_alias_bomb_in_bundle_yaml(tmp_path):
    root = tmp_path / "b"
    root.mkdir()
    (root / "bundle.yaml").write_text("format: moptd-bundle/v1\n" + _alias_bomb())
    err = _refused(root, "bundle.yaml")
    assert "through aliases" in err


def test_replay_refuses_an_oversized_file_in_a_bundle_directory(tmp_path):
    root = tmp_path / "b"
    (root / "kernel").mkdir(parents=True)
    (root / "bundle.yaml").write_bytes(META)
    with (root / "kernel" / "dmesg.txt").open("wb") as fh:
        fh.truncate(200 << 20)  # sparse: no disk, but the reader would hold 200 MiB
    _refused(root, "kernel/dmesg.txt")


def test_a_recorded_bundle_is_within_the_limits(tmp_path):
    """The guard must not refuse what `moptd record` writes (test_record.py replays one)."""
    from moptd.cli.bundle_guard import check_bundle

    root = tmp_path / "b"
    (root / "kernel").mkdir(parents=True)
    (root / "bundle.yaml").write_bytes(META)
    (root / "kernel" / "dmesg.txt").write_text("6,1,100,-;NVRM: Xid (PCI:0000:19:00): 79\n")
    check_bundle(root)
    check_bundle(_tar(tmp_path / "b.tar.gz", [_file("b/bundle.yaml", META), _file("b/kernel/")]))


# --- YAML: configuration, rules and the loader itself -------------------------------------


def test_config_alias_bomb_is_refused_with_file_and_line_quickly(tmp_path):
    cfg = tmp_path / "moptd.yaml"
    cfg.write_text(_alias_bomb())
    start = time.monotonic()
    out = moptd("config", "--config", str(cfg), timeout=30)
    assert time.monotonic() - start < 15
    assert out.returncode == 2
    assert f"{cfg}:" in out.stderr, out.stderr
    assert "through aliases" in out.stderr


@pytest.mark.parametrize(
    ("text", "problem"),
    [("a: &a [*a]\n", "refers to"), ("a: " + "[" * 5000 + "]" * 5000 + "\n", "too deeply")],
    ids=["recursive-alias", "deep-nesting"],
)
def test_config_that_never_ends_is_refused(tmp_path, text, problem):
    cfg = tmp_path / "moptd.yaml"
    cfg.write_text(text)
    out = moptd("config", "--config", str(cfg), timeout=30)
    assert out.returncode == 2
    assert str(cfg) in out.stderr, out.stderr
    assert problem in out.stderr


def test_oversized_config_is_refused(tmp_path):
    cfg = tmp_path / "moptd.yaml"
    with cfg.open("wb") as fh:
        fh.truncate(2 << 20)
    out = moptd("config", "--config", str(cfg))
    assert out.returncode == 2
    assert "larger than" in out.stderr


def test_rules_alias_bomb_is_refused_with_file_and_line_quickly(tmp_path):
    rules = tmp_path / "bomb.rules.yaml"
    rules.write_text("schema: moptd.rules/v1\n" + _alias_bomb() + "rules: *a8\n")
    try:
        out = moptd("rules", "check", str(rules), timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("moptd rules check did not finish in 10 s on a 1 KiB alias bomb")
    assert out.returncode != 0
    assert f"{rules}:" in out.stderr + out.stdout


def test_the_bound_fits_every_shipped_yaml_file():
    """Shipped rules (with their anchors), the xid catalog and the example configuration
    stay well inside the bound, with the rules' own loader."""
    files = [
        *default_rules_dir().rglob("*.yaml"),
        PACKAGE / "kernel" / "xid_catalog.yaml",
        *REPO.glob("systemd/*.yaml"),
    ]
    assert len(files) > 10
    for f in files:
        node = yamlsafe.compose(f.read_text(encoding="utf-8"), _Loader)
        yamlsafe.check_expansion(node, yamlsafe.MAX_NODES // 10)
    assert yamlsafe.load("a: &x {b: 1}\nc: *x\n", _Loader) == {"a": {"b": 1}, "c": {"b": 1}}


def test_the_bound_marks_the_line_that_crosses_it():
    text = "ok: 1\n" + _alias_bomb()
    with pytest.raises(yamlsafe.YamlTooLarge) as info:
        yamlsafe.load(text)
    assert isinstance(info.value, yaml.MarkedYAMLError)
    assert 2 <= info.value.problem_mark.line + 1 <= 10


# --- nvidia-smi dumps (bundle evidence) ----------------------------------------------------


def test_oversized_nvidia_smi_dump_is_refused(tmp_path):
    dump = tmp_path / "0001.xml"
    with dump.open("wb") as fh:
        fh.truncate(MAX_DUMP_BYTES + 1)
    with pytest.raises(NvsmiError, match="larger than"):
        read_dump(dump)


def test_xml_entity_bomb_in_a_dump_is_refused_quickly():
    entities = '<!ENTITY l0 "lol">' + "".join(
        f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10)
    )
    start = time.monotonic()
    for doctype in ("nvidia_smi_log", "x"):
        text = (
            f'<?xml version="1.0"?>\n<!DOCTYPE {doctype} [{entities}]>\n'
            "<nvidia_smi_log><driver_version>&l9;</driver_version></nvidia_smi_log>\n"
        )
        with pytest.raises(NvsmiError):
            parse_dump(text)
    assert time.monotonic() - start < 5
