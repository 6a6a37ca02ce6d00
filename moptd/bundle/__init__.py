"""Bundles (docs/bundle.md): opening one, its files as the collectors' sources, and
``read_bundle`` that runs the live code over them into a replay Timeline."""

from moptd.bundle.archive import open_bundle
from moptd.bundle.errors import BundleError
from moptd.bundle.meta import FORMAT
from moptd.bundle.reader import read_bundle

__all__ = ["FORMAT", "BundleError", "open_bundle", "read_bundle"]
