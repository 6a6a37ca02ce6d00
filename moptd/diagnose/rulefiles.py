"""Which rule files a set of paths names, and reading one of them safely.

Apart from the loader (moptd/diagnose/loader.py) so that what needs only the files (the
rules cache of `moptd explain`, the configuration's default paths) imports neither the
expression compiler nor the YAML and JSON Schema machinery.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from moptd.safefs import kind_of


@dataclass(frozen=True, slots=True)
class RuleError:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


def default_rules_dir() -> Path:
    """The shipped rules: ``moptd/rulebook`` in a wheel, else the repository's ``rules/``."""
    try:
        packaged = Path(str(resources.files("moptd") / "rulebook"))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - moptd is always importable
        packaged = None
    if packaged is not None and (packaged / "schema").is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "rules"


def rule_files(paths: Sequence[str | Path]) -> tuple[list[Path], list[RuleError]]:
    files: list[Path] = []
    errors: list[RuleError] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.rglob("*.rules.yaml")))
        elif p.exists():  # a FIFO or device named here is refused by read_rule_file
            files.append(p)
        else:
            errors.append(RuleError(str(p), 0, "no such file or directory"))
    return files, errors


# The shipped files are at most 17 KB; a rule file a hundred times that is a mistake, and
# reading and parsing one of 40 MB took 86 s and 2.7 GB.
MAX_RULE_FILE_BYTES = 1 << 20


class RuleFileRefused(ValueError):
    """A rule file moptd will not read: not a regular file, or over the size limit."""


def read_rule_file(path: Path) -> str:
    """The text of one rule file, read without blocking: a FIFO or device under rules.d
    is refused by its kind (opening with O_NONBLOCK never waits for a writer), and a
    file over MAX_RULE_FILE_BYTES by its size, before anything is parsed."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RuleFileRefused(f"not a regular file (a {kind_of(st.st_mode)}); not read")
        if st.st_size > MAX_RULE_FILE_BYTES:
            raise RuleFileRefused(
                f"{st.st_size} bytes, over the {MAX_RULE_FILE_BYTES}-byte limit for a rule file"
            )
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(MAX_RULE_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RULE_FILE_BYTES:  # grew while we read it
        raise RuleFileRefused(f"over the {MAX_RULE_FILE_BYTES}-byte limit for a rule file")
    return data.decode("utf-8")


# Files known to pass the JSON Schema check, by schema_digest: moptd/cli/rules_cache.py
# fills this for a read-only command from its cache and keeps what passes. The check is the
# dearest part of loading (jsonschema's import and walk: about 0.1 s for the shipped set),
# and its answer for the same bytes against the same schema does not change. None (the
# daemon, `moptd rules`, tests): the loader checks every file.
VALIDATED: set[str] | None = None


def schema_digest(text: str) -> str:
    """What a rule file's schema check depends on: the schema's bytes and the file's."""
    import hashlib

    return hashlib.sha256(f"{_schema_sha()}\0{text}".encode()).hexdigest()


@functools.cache
def _schema_sha() -> str:
    """The schema's digest, read once a process: only a read-only command, which ends
    within seconds, fills VALIDATED (a schema replaced meanwhile is seen by the next)."""
    import hashlib

    path = default_rules_dir() / "schema" / "moptd-rules.schema.json"
    return hashlib.sha256(path.read_bytes()).hexdigest()
