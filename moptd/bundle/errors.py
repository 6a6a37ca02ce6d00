"""The one error of bundle reading."""

from __future__ import annotations

from moptd.diagnose.timeline import TimelineError


class BundleError(TimelineError):
    """A bundle file that is present but malformed, named with its line (0: the whole
    file). A missing file is never an error: it is listed as missing evidence."""
