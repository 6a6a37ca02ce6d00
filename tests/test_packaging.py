"""The package as an operator gets it: an sdist and a wheel built by `python -m build`, the
wheel installed into a fresh virtual environment, and moptd run from there, outside the
source tree, so that every data file read at run time (the rules and their schema, the
rule tests' bundles, the Xid catalog, the runbooks, the systemd units) must come from the
wheel. One version, in moptd/__init__.py, for the metadata, `moptd --version` and
moptd_build_info."""

from __future__ import annotations

import ast
import email.parser
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from moptd import __version__
from moptd.cli import main
from moptd.clock import VirtualClock
from moptd.daemon.exporter import TextRenderer
from moptd.store import SignalStore
from tests.conftest import FIXTURES, REPO
from tests.expected_outcomes import check

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
REPLAYED = FIXTURES / "scenarios" / "gsp-xid119-h100-xe9680"
BUILD_INFO = 'moptd_build_info{{python="{python}",version="{version}"}} 1.0'
# What the wheel must carry besides the code: source folder -> place in the package
# ([tool.hatch.build.targets.wheel.force-include]), each read at run time.
DATA = {
    "rules": "moptd/rulebook",  # default_rules_dir(): rules, schema, *.test.yaml
    "tests/fixtures/scenarios": "moptd/tests/fixtures/scenarios",  # bundles the tests cite
    "systemd": "moptd/systemd",  # moptd install-service
    "docs/runbooks": "moptd/runbooks",  # moptd explain --code CODE --runbook
}


def pynvml_names(root: Path) -> set[str]:
    """Every `pynvml.NAME` that moptd's code uses."""
    names: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "pynvml"
            ):
                names.add(node.attr)
    return names


def missing_in_binding(python: str, path: str | None, names: set[str]) -> list[str]:
    """The names a pynvml module lacks (the one at `path`, else the installed one). The
    module is imported in a child process: importing it loads no NVML library."""
    code = (
        "import json, sys\n"
        "if sys.argv[1]: sys.path.insert(0, sys.argv[1])\n"
        "import pynvml\n"
        "names = json.loads(sys.stdin.read())\n"
        "print(json.dumps(sorted(n for n in names if not hasattr(pynvml, n))))\n"
    )
    proc = subprocess.run(
        [python, "-c", code, path or ""],
        input=json.dumps(sorted(names)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    missing: list[str] = json.loads(proc.stdout)
    return missing


# --- the version has one source ----------------------------------------------------------


def test_version_is_declared_once() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project
    assert "version" in project["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "moptd/__init__.py"


def test_version_command_and_build_info_say_the_package_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"moptd {__version__}\n"
    text = TextRenderer().render(SignalStore(VirtualClock(0.0)).snapshot()).decode()
    line = BUILD_INFO.format(python=platform.python_version(), version=__version__)
    assert line in text.splitlines()


# --- the NVML binding: no upper cap, so CI meets each new release -------------------------


def test_the_installed_binding_has_every_nvml_name_moptd_uses() -> None:
    """nvidia-ml-py is not capped (pyproject.toml says why), so CI installs its newest
    release: a release that drops a function moptd calls fails here, not on a host."""
    names = pynvml_names(REPO / "moptd")
    assert "nvmlInit" in names  # the scan sees the backend at all
    assert missing_in_binding(sys.executable, None, names) == []


# --- the built wheel, installed into a fresh venv ----------------------------------------


@dataclass
class Installed:
    wheel: Path
    sdist: Path
    venv: Path
    work: Path  # a directory outside the source tree; commands run there

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MOPTD_CONFIG")}
        return subprocess.run(
            [str(self.venv / "bin" / args[0]), *args[1:]],
            cwd=self.work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _require_build() -> None:
    try:
        importlib.metadata.version("build")
    except importlib.metadata.PackageNotFoundError:
        if os.environ.get("MOPTD_REQUIRE_TOOLS"):
            pytest.fail("the build package (test extra) is required in CI but not installed")
        pytest.skip("the build package is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    _require_build()
    root = tmp_path_factory.mktemp("packaging")
    dist = root / "dist"
    # No --sdist/--wheel: build makes the sdist, then the wheel from the unpacked sdist,
    # so a data file the sdist leaves out is missing from the wheel too.
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("moptd-*.whl")
    (sdist,) = dist.glob("moptd-*.tar.gz")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    work = root / "work"
    work.mkdir()
    yield Installed(wheel, sdist, venv, work)
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_wheel_carries_every_data_file(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as zf:
        names = set(zf.namelist())
    assert "moptd/kernel/xid_catalog.yaml" in names
    assert "moptd/kernel/nvlink5.yaml" in names
    for source, target in DATA.items():
        files = [p for p in sorted((REPO / source).rglob("*")) if p.is_file()]
        assert files, source
        left_out = [
            str(p.relative_to(REPO))
            for p in files
            if f"{target}/{p.relative_to(REPO / source).as_posix()}" not in names
        ]
        assert left_out == [], f"{source} files missing from the wheel"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_installed_moptd_is_the_wheel_and_says_its_version(installed: Installed) -> None:
    where = installed.run("python", "-c", "import moptd; print(moptd.__file__)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(installed.venv)
    with zipfile.ZipFile(installed.wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode())
    assert meta["Version"] == __version__
    assert installed.wheel.name == f"moptd-{__version__}-py3-none-any.whl"
    assert installed.sdist.name == f"moptd-{__version__}.tar.gz"
    version = installed.run("moptd", "--version")
    assert (version.returncode, version.stdout) == (0, f"moptd {__version__}\n")
    render = installed.run(
        "python",
        "-c",
        "import platform\n"
        "from moptd.clock import VirtualClock\n"
        "from moptd.daemon.exporter import TextRenderer\n"
        "from moptd.store import SignalStore\n"
        "print(platform.python_version())\n"
        "print(TextRenderer().render(SignalStore(VirtualClock(0.0)).snapshot()).decode())",
    )
    assert render.returncode == 0, render.stderr
    python, *lines = render.stdout.splitlines()
    assert BUILD_INFO.format(python=python, version=__version__) in lines


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_shipped_rules_check_and_pass_their_tests(installed: Installed) -> None:
    checked = installed.run("moptd", "rules", "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = installed.run("moptd", "rules", "test", timeout=300)
    # A rule test that names a bundle outside tests/fixtures/scenarios fails here: ship its
    # folder too ([tool.hatch.build.targets.wheel.force-include] and DATA above).
    assert tested.returncode == 0, tested.stdout[-4000:] + tested.stderr[-4000:]
    # the same number of rule test files as the source tree has
    files = len(list((REPO / "rules").rglob("*.test.yaml")))
    assert f"in {files} files" in tested.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_replay_of_a_shipped_scenario_from_the_wheel(installed: Installed) -> None:
    bundle = installed.work / REPLAYED.name
    shutil.copytree(REPLAYED, bundle, dirs_exist_ok=True)
    replayed = installed.run("moptd", "replay", "--json", REPLAYED.name)
    assert replayed.returncode == 2, replayed.stderr  # critical: GSP_FIRMWARE_ERROR
    out = json.loads(replayed.stdout)
    check(yaml.safe_load((REPLAYED / "expected.yaml").read_text()), out["findings"])
    # the Xid catalog (moptd/kernel/xid_catalog.yaml) gave NVIDIA's recovery action
    reset = [f for f in out["findings"] if f["code"] == "GPU_RESET_REQUIRED"]
    assert reset
    assert "NVIDIA: RESET_GPU" in reset[0]["summary"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_config_runbook_and_units_from_the_wheel(installed: Installed) -> None:
    config = installed.run("moptd", "config", "--json")
    assert config.returncode == 0, config.stderr
    assert json.loads(config.stdout)["source"] == "<defaults>"
    runbook = installed.run("moptd", "explain", "--code", "GSP_FIRMWARE_ERROR", "--runbook")
    assert runbook.returncode == 0, runbook.stderr
    assert runbook.stdout.startswith("# GSP_FIRMWARE_ERROR\n")
    prefix = installed.work / "root"
    placed = installed.run("moptd", "install-service", "--prefix", str(prefix))
    assert placed.returncode == 0, placed.stderr
    for path, source in (
        ("etc/systemd/system/moptd.service", "moptd.service"),
        ("etc/systemd/system/moptd-serving@.service", "moptd-serving@.service"),
        ("etc/sysusers.d/moptd.conf", "moptd.sysusers"),
        ("etc/tmpfiles.d/moptd.conf", "moptd.tmpfiles"),
        ("etc/polkit-1/rules.d/50-moptd.rules", "50-moptd.rules"),
        ("etc/moptd/moptd.yaml", "moptd.yaml"),
    ):
        assert (prefix / path).is_file(), path
        if source != "moptd.service":  # ExecStart= names this venv's moptd
            assert (prefix / path).read_text() == (REPO / "systemd" / source).read_text()
    shipped = installed.run(
        "moptd", "config", "--json", "--config", str(prefix / "etc/moptd/moptd.yaml")
    )
    assert shipped.returncode == 0, shipped.stderr
    assert json.loads(shipped.stdout)["source"] == str(prefix / "etc/moptd/moptd.yaml")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_oldest_nvml_binding_allowed_has_every_name_moptd_uses(
    installed: Installed,
) -> None:
    """The floor of the nvidia-ml-py bound, downloaded as it is on PyPI: an older binding
    lacks a name moptd uses, and the bound must not let pip pick it."""
    with zipfile.ZipFile(installed.wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode())
    (req,) = [r for r in meta.get_all("Requires-Dist") or [] if r.startswith("nvidia-ml-py")]
    specs = req.removeprefix("nvidia-ml-py").split(",")
    (floor,) = [s.removeprefix(">=") for s in specs if s.startswith(">=")]
    assert not [s for s in specs if s.startswith("<")], "no upper cap (pyproject.toml)"
    where = installed.work / "nvml-floor"
    got = installed.run(
        "python",
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary",
        ":all:",
        "-d",
        str(where),
        f"nvidia-ml-py=={floor}",
    )
    assert got.returncode == 0, got.stderr
    (oldest,) = where.glob(f"nvidia_ml_py-{floor}-*.whl")
    unpacked = where / "unpacked"
    with zipfile.ZipFile(oldest) as zf:
        zf.extract("pynvml.py", unpacked)
    names = pynvml_names(REPO / "moptd")
    assert missing_in_binding(str(installed.venv / "bin" / "python"), str(unpacked), names) == []


# --- license, classifiers, project URLs (issue 34) -----------------------------------------


def _label(name: str) -> str:
    """An org.opencontainers.image.* label's value in the Dockerfile."""
    text = (REPO / "Dockerfile").read_text()
    (value,) = re.findall(rf'org\.opencontainers\.image\.{name}="([^"]*)"', text)
    return value


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_wheel_says_its_license_classifiers_and_urls(installed: Installed) -> None:
    """What an index, pip-licenses or a distribution packager reads from the wheel: the
    license (the same as the image's label, the file itself beside it), classifiers that
    agree with requires-python, and where the source and the documentation are."""
    with zipfile.ZipFile(installed.wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode())
        licence = zf.read(meta_name.replace("METADATA", "licenses/LICENSE")).decode()
    assert meta["License-Expression"] == _label("licenses") == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert licence == (REPO / "LICENSE").read_text()
    assert "Apache License" in licence
    assert "Version 2.0, January 2004" in licence
    with tarfile.open(installed.sdist) as tf:
        assert f"moptd-{__version__}/LICENSE" in tf.getnames()

    classifiers = meta.get_all("Classifier") or []
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert "Typing :: Typed" in classifiers
    assert (REPO / "moptd" / "py.typed").is_file()
    minors = sorted(
        int(c.rsplit(".", 1)[1])
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert meta["Requires-Python"] == f">=3.{minors[0]}"
    assert minors == list(range(minors[0], minors[-1] + 1))  # no gap

    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert urls["Source"] == _label("source")
    assert urls["Documentation"] == _label("documentation")
    assert set(urls) >= {"Homepage", "Source", "Documentation", "Issues"}


def test_the_docs_install_extras_from_the_wheel_not_an_index() -> None:
    """No index serves moptd: `pip install 'moptd[web]'` finds nothing. Every pip install
    of moptd in the docs names the built wheel, or a wheelhouse with --no-index, and every
    extra it names exists."""
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            for m in re.finditer(r"pip install\b[^`\n]*?'?(\S*moptd\S*?)\[([a-z,]+)\]", line):
                where, named = m.groups()
                assert where.endswith(".whl") or "--no-index" in line, f"{doc.name}: {line}"
                assert set(named.split(",")) <= extras, f"{doc.name}: {line}"
