"""Limits on a bundle before `moptd replay` or `moptd explain --bundle` reads it.

Bundles come attached to tickets, so they are untrusted input: a tarball may hold a
member that points outside the folder it is unpacked into, a link, a device node, or a
member that unpacks to gigabytes from a few kilobytes (a sparse or all-zero file), and
the reader loads each evidence file whole. The check reads only the tar headers, so a
refused bundle costs no disk and no time; it names the member and the limit.
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path, PurePosixPath

import yaml

from moptd import yamlsafe
from moptd.bundle.archive import is_tar
from moptd.bundle.tar_scan import TarScanError, scan_tar
from moptd.safefs import kind_of

# An hour recorded at 5 s from 8 GPUs and 8 endpoints is about 6,500 files of well under
# 1 MiB each; a kernel ring buffer is at most a few MiB, and `moptd record` keeps at most
# the last 64 MiB of a serving log. These bounds leave room for hand-built bundles.
MAX_MEMBERS = 100_000
MAX_FILE_BYTES = 128 << 20
MAX_TOTAL_BYTES = 1 << 30
MAX_META_BYTES = 1 << 20
# A recorded bundle is 4 levels deep (b/serving/main/log.txt); deeper is not a bundle, and
# a path thousands of levels deep would exhaust the recursion of a recursive walk.
MAX_DEPTH = 16
# Headers and padding on top of the member bytes: three 512-byte blocks a member at most.
MAX_UNPACKED_BYTES = MAX_TOTAL_BYTES + MAX_MEMBERS * 3 * 512


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
    elif is_tar(path):  # its first header only: tarfile.is_tarfile would parse a pax header
        _check_tar(path)


def _check_tar(path: Path) -> None:
    try:
        scan_tar(path, MAX_UNPACKED_BYTES)
    except TarScanError as exc:
        raise BundleRefused(path, exc.member, exc.reason) from None
    except OSError as exc:
        raise BundleRefused(path, "(archive)", f"unreadable: {exc}") from None
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
    if len(p.parts) > MAX_DEPTH:
        raise BundleRefused(path, name[:200], f"more than {MAX_DEPTH} folders deep")


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
    """Walks without following links (lstat), iteratively and to MAX_DEPTH: a link to
    /dev/zero or /etc/shadow, a FIFO, a socket or a device is refused by name, never
    opened, so the reader only ever opens regular files inside the bundle."""
    members = 0
    total = 0
    stack: list[tuple[Path, int]] = [(path, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise BundleRefused(path, _rel(path, folder), f"unreadable folder: {exc}") from None
        for entry in entries:
            members += 1
            full = Path(entry.path)
            rel = _rel(path, full)
            if members > MAX_MEMBERS:
                raise BundleRefused(path, rel, f"more than {MAX_MEMBERS} files")
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    raise BundleRefused(path, rel, f"more than {MAX_DEPTH} folders deep")
                stack.append((full, depth + 1))
                continue
            if not stat.S_ISREG(st.st_mode):
                raise BundleRefused(
                    path, rel, f"a {_file_kind(full, st.st_mode)}; only files and folders"
                )
            if st.st_size > MAX_FILE_BYTES:
                raise BundleRefused(
                    path, rel, f"{st.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit"
                )
            total += st.st_size
            if total > MAX_TOTAL_BYTES:
                raise BundleRefused(path, rel, f"over the {MAX_TOTAL_BYTES}-byte limit in all")
            if entry.name == "bundle.yaml":
                with full.open("rb") as fh:
                    _check_meta(path, rel, fh.read(MAX_META_BYTES + 1))


def _rel(root: Path, full: Path) -> str:
    return str(full.relative_to(root)) if full != root else "."


def _file_kind(full: Path, mode: int) -> str:
    if stat.S_ISLNK(mode):
        try:
            return f"symbolic link to {os.readlink(full)!r}"
        except OSError:
            pass
    return kind_of(mode)


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
