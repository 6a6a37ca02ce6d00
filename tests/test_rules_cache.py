"""The cache `moptd explain` keeps of the rules (moptd/cli/rules_cache.py): used only while
it is the user's own and matches the rule files on disk byte for byte; the schema check
skipped only for bytes that passed it."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from moptd.cli import rules_cache
from moptd.cli.rules_cache import load_facts, validated_rules
from moptd.diagnose import loader
from moptd.diagnose.loader import default_rules_dir, load_rules

# a rule of the shipped set whose verdict's first action is a command (`nvidia-smi -r`):
# what explain marks as a command to paste
RULE = "gpu-gsp-error"


@pytest.fixture
def rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped rules, and a cache directory of the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    copy = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), copy)
    return copy


def _cache_file(tmp_path: Path) -> Path:
    (found,) = (tmp_path / "cache" / "moptd").glob("explain-rules-*.json")
    return found


def _a_command(facts: rules_cache.RuleFacts) -> tuple[str, int]:
    """A node with a verdict whose actions include a command, and that action's index."""
    for node, n in facts[RULE].items():
        for i, a in enumerate(n.actions or ()):
            if a.is_command:
                return node, i
    raise AssertionError(f"{RULE} has no command")


def _flip(cache: Path, node: str, i: int) -> None:
    """Change one fact in the cache file, its key left as it is (as another writer could)."""
    doc = json.loads(cache.read_text())
    doc["rules"][RULE][node]["actions"][i][2] = False
    cache.write_text(json.dumps(doc))


def test_the_cached_facts_are_the_rules_own(rules: Path, tmp_path: Path) -> None:
    facts = load_facts([rules])
    assert facts == rules_cache.facts_of(load_rules([rules]).ruleset)
    cache = _cache_file(tmp_path)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    assert load_facts([rules]) == facts  # read back alike


def test_a_cache_is_read_and_dropped_when_a_rule_file_changes(rules: Path, tmp_path: Path) -> None:
    facts = load_facts([rules])
    assert facts is not None
    node, i = _a_command(facts)
    cache = _cache_file(tmp_path)
    _flip(cache, node, i)
    cached = load_facts([rules])
    assert cached is not None
    assert cached[RULE][node].actions[i].is_command is False  # it was read: the flip shows
    # one byte more in any rule file (a comment) and that cache is not this rule set's
    some = sorted(rules.rglob("*.rules.yaml"))[-1]
    some.write_text(some.read_text() + "# tuned\n")
    again = load_facts([rules])
    assert again is not None
    assert again[RULE][node].actions[i].is_command is True
    assert again == facts


@pytest.mark.parametrize("how", ["group-writable", "another owner", "a symlink"])
def test_a_cache_that_is_not_the_users_own_is_not_read(
    rules: Path, tmp_path: Path, how: str
) -> None:
    facts = load_facts([rules])
    assert facts is not None
    node, i = _a_command(facts)
    cache = _cache_file(tmp_path)
    _flip(cache, node, i)
    if how == "group-writable":
        cache.chmod(0o620)
    elif how == "another owner":
        os.chown(cache, os.geteuid() + 1, -1)  # tests run as root (CONTRIBUTING.md)
    else:
        target = tmp_path / "elsewhere.json"
        cache.rename(target)
        cache.symlink_to(target)
    assert load_facts([rules]) == facts  # the rules' own, not the file's


def test_a_malformed_cache_is_ignored(rules: Path, tmp_path: Path) -> None:
    facts = load_facts([rules])
    cache = _cache_file(tmp_path)
    for text in ("", "{", "[]", json.dumps({"format": 1, "key": "x", "rules": {}})):
        cache.write_text(text)
        assert load_facts([rules]) == facts


def test_the_schema_check_is_skipped_only_for_bytes_that_passed_it(
    rules: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []
    real = loader._validate

    def counted(doc: object, file: str, *validator: object) -> list[loader.RuleError]:
        checked.append(file)
        return real(doc, file, *validator)

    monkeypatch.setattr(loader, "_validate", counted)
    n = len(list(rules.rglob("*.rules.yaml")))
    with validated_rules():
        assert not load_rules([rules]).errors
    assert len(checked) == n
    checked.clear()
    with validated_rules():
        assert not load_rules([rules]).errors
    assert checked == []  # every file passed before, byte for byte
    # a key the schema does not know: this file is checked again, and refused at its line
    bad = rules / "driver" / "xid.rules.yaml"
    text = bad.read_text()
    bad.write_text(text.replace("\nrules:\n", "\ncolour: red\nrules:\n", 1))
    with validated_rules():
        errors = load_rules([rules]).errors
    assert checked == [str(bad)]
    assert [(e.file, e.message) for e in errors] == [
        (str(bad), "(top): unknown key ('colour' was unexpected)")
    ]
    # outside a read-only command (the daemon, `moptd rules check`) every file is checked
    checked.clear()
    bad.write_text(text)
    load_rules([rules])
    assert len(checked) == n


def test_one_inside_another_keeps_the_outer_ones_digests(rules: Path, tmp_path: Path) -> None:
    from moptd.diagnose import rulefiles

    with validated_rules():
        with validated_rules():
            assert not load_rules([rules]).errors
        assert rulefiles.VALIDATED  # the inner one left the outer's set in place
    assert rulefiles.VALIDATED is None
    kept = json.loads((tmp_path / "cache" / "moptd" / "validated-rules.json").read_text())
    assert len(kept["files"]) == len(list(rules.rglob("*.rules.yaml")))
