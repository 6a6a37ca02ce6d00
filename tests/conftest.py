"""Shared test helpers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def require_tool(name: str) -> str:
    """The tool's path; skip (or fail in CI, where MOPTD_REQUIRE_TOOLS=1) when absent."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("MOPTD_REQUIRE_TOOLS"):
            pytest.fail(f"{name} is required in CI but not installed")
        pytest.skip(f"{name} not installed")
    return path
