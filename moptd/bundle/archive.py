"""Opening a bundle: a directory as it is, a .tar.gz unpacked into a temporary directory.

A tarball is recognised by `is_tar` (its first header block) and walked by `scan_tar` before
`tarfile` sees it: CPython's pax parser is quadratic and reads an extended header whole, so a
hostile header must be refused before any `tarfile` call, even where no CLI guard ran.
"""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

from moptd.bundle.errors import BundleError
from moptd.bundle.tar_scan import TarScanError, looks_like_tar, scan_tar

# The backstop's bound on what a tarball may decompress to: the CLI guard's own limit
# (moptd.cli.bundle_guard.MAX_UNPACKED_BYTES) is tighter and runs first there.
MAX_UNPACKED_BYTES = 2 << 30


def is_tar(path: Path) -> bool:
    """A regular file that starts with a tar header (plain or compressed); no `tarfile`."""
    try:
        return path.is_file() and looks_like_tar(path)
    except OSError:
        return False


def open_bundle(path: Path) -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    """(the bundle's root, the temporary directory to clean up, if any)."""
    if path.is_dir():
        return path, None
    if is_tar(path):
        try:
            scan_tar(path, MAX_UNPACKED_BYTES)
        except TarScanError as exc:
            raise BundleError(str(path), 0, f"{exc.member}: {exc.reason}") from None
        except OSError as exc:
            raise BundleError(str(path), 0, f"unreadable: {exc}") from None
        tmp = tempfile.TemporaryDirectory(prefix="moptd-bundle-")
        try:
            with tarfile.open(path) as tar:
                tar.extractall(tmp.name, filter="data")
        except (tarfile.TarError, OSError) as exc:
            # the CLI's bundle guard refuses hostile archives first; this is the backstop
            tmp.cleanup()
            raise BundleError(str(path), 0, f"cannot unpack: {exc}") from None
        root = Path(tmp.name)
        found = sorted(root.rglob("bundle.yaml"))
        return (found[0].parent if found else root), tmp
    raise BundleError(str(path), 0, "not a bundle directory or .tar.gz")
