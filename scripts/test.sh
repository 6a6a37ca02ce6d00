#!/usr/bin/env bash
# Set up a virtual environment with moptd and its test tools, then lint, type-check, check
# the import layering and run the tests. Extra arguments go to pytest
# (e.g. scripts/test.sh -k exporter).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'
"$VENV/bin/ruff" check moptd tests bench tools
"$VENV/bin/mypy"
# The floor plan (docs/architecture.md, [tool.importlinter] in pyproject.toml); its report
# is printed only when a contract is broken.
"$VENV/bin/lint-imports" --no-cache >/dev/null || "$VENV/bin/lint-imports" --no-cache
# Two lanes (tests/conftest.py, SIDE_LANE): the real-vLLM tests beside the rest; -n 0 after
# this runs everything in one process.
exec "$VENV/bin/pytest" -n 2 "$@"
