"""Bundles (docs/bundle.md): opening one, its files as the collectors' sources, and
``read_bundle`` that runs the live code over them into a replay Timeline; ``read_inputs``
takes anything pasted (raw files, stdin, several at once, sniffed by content) the same way."""

from moptd.bundle.archive import open_bundle
from moptd.bundle.errors import BundleError
from moptd.bundle.intake import read_bundle, read_inputs
from moptd.bundle.meta import FORMAT

__all__ = ["FORMAT", "BundleError", "open_bundle", "read_bundle", "read_inputs"]
