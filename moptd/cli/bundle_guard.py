"""Limits on a bundle before `moptd replay` or `moptd explain --bundle` reads it.

Bundles come attached to tickets, so they are untrusted input: a tarball may hold a
member that points outside the folder it is unpacked into, a link, a device node, or a
member that unpacks to gigabytes from a few kilobytes (a sparse or all-zero file), and
the reader loads each evidence file whole. The check reads only the tar headers, so a
refused bundle costs no disk and no time; it names the member and the limit.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath

import yaml

from moptd import yamlsafe

# An hour recorded at 5 s from 8 GPUs and 8 endpoints is about 6,500 files of well under
# 1 MiB each; a kernel ring buffer is at most a few MiB, and `moptd record` keeps at most
# the last 64 MiB of a serving log. These bounds leave room for hand-built bundles.
MAX_MEMBERS = 100_000
MAX_FILE_BYTES = 128 << 20
MAX_TOTAL_BYTES = 1 << 30
MAX_META_BYTES = 1 << 20


class BundleRefused(ValueError):
    """The bundle breaks a limit; the message names the member and the limit."""

    def __init__(self, bundle: Path, member: str, reason: str) -> None:
        super().__init__(f"{bundle}: {member}: {reason}; bundle refused")
        self.member = member


def check_bundle(path: Path) -> None:
    """Raise BundleRefused when the bundle (a directory or a tarball) breaks a limit.
    Anything that is neither is left to the reader, which says so."""
    if path.is_dir():
        _check_dir(path)
    elif path.is_file() and tarfile.is_tarfile(path):
        _check_tar(path)


def _check_tar(path: Path) -> None:
    members = 0
    total = 0
    try:
        with tarfile.open(path, "r:*") as tar:
            # iterating reads one header at a time: a refused member's data is never read
            for m in tar:
                members += 1
                if members > MAX_MEMBERS:
                    raise BundleRefused(path, m.name, f"more than {MAX_MEMBERS} members")
                _check_name(path, m.name)
                if not (m.isfile() or m.isdir()):
                    raise BundleRefused(path, m.name, f"a {_kind(m)}; only files and folders")
                if m.size > MAX_FILE_BYTES:
                    raise BundleRefused(
                        path, m.name, f"{m.size} bytes, over the {MAX_FILE_BYTES}-byte limit"
                    )
                total += m.size
                if total > MAX_TOTAL_BYTES:
                    raise BundleRefused(
                        path, m.name, f"unpacks to over the {MAX_TOTAL_BYTES}-byte limit"
                    )
                if PurePosixPath(m.name).name == "bundle.yaml" and m.isfile():
                    data = tar.extractfile(m)
                    if data is not None:
                        _check_meta(path, m.name, data.read(MAX_META_BYTES + 1))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleRefused(path, "(archive)", f"unreadable tar: {exc}") from None


def _check_name(path: Path, name: str) -> None:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or "\\" in name or "\0" in name:
        raise BundleRefused(path, name, "a path outside the bundle")


def _kind(m: tarfile.TarInfo) -> str:
    if m.issym():
        return f"symbolic link to {m.linkname!r}"
    if m.islnk():
        return f"hard link to {m.linkname!r}"
    if m.ischr() or m.isblk():
        return "device node"
    if m.isfifo():
        return "FIFO"
    return f"member of type {m.type!r}"


def _check_dir(path: Path) -> None:
    members = 0
    total = 0
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            members += 1
            if members > MAX_MEMBERS:
                raise BundleRefused(path, name, f"more than {MAX_MEMBERS} files")
        for name in files:
            full = Path(folder, name)
            rel = str(full.relative_to(path))
            try:
                size = full.stat().st_size
            except OSError:
                continue  # a dangling link: the reader reports the file as unreadable
            if size > MAX_FILE_BYTES:
                raise BundleRefused(
                    path, rel, f"{size} bytes, over the {MAX_FILE_BYTES}-byte limit"
                )
            total += size
            if total > MAX_TOTAL_BYTES:
                raise BundleRefused(path, rel, f"over the {MAX_TOTAL_BYTES}-byte limit in all")
            if name == "bundle.yaml":
                with full.open("rb") as fh:
                    _check_meta(path, rel, fh.read(MAX_META_BYTES + 1))


def _check_meta(path: Path, member: str, data: bytes) -> None:
    if len(data) > MAX_META_BYTES:
        raise BundleRefused(path, member, f"over the {MAX_META_BYTES}-byte limit")
    try:
        yamlsafe.compose(data.decode("utf-8", "replace"))
    except yamlsafe.YamlTooLarge as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise BundleRefused(path, f"{member}:{line}", str(exc.problem)) from None
    except yaml.YAMLError:
        return  # the reader reports malformed YAML with its line
