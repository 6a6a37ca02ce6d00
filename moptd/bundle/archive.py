"""Opening a bundle: a directory as it is, a .tar.gz unpacked into a temporary directory."""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

from moptd.bundle.errors import BundleError


def open_bundle(path: Path) -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    """(the bundle's root, the temporary directory to clean up, if any)."""
    if path.is_dir():
        return path, None
    if path.is_file() and tarfile.is_tarfile(path):
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
