"""CLI conventions: the exit status table is what the commands return, the generated shell
completion completes in a real bash, and the man page renders with the real man."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from moptd.cli import cmd_doctor, cmd_explain, cmd_history, cmd_replay
from moptd.cli.exit_status import EXIT_STATUS

REPO = Path(__file__).parent.parent


def codes(command: str) -> set[int]:
    return {code for code, _ in EXIT_STATUS[command]}


def test_the_table_holds_the_commands_own_constants() -> None:
    assert codes("replay") == {0, *cmd_replay.EXIT_BY_SEVERITY.values(), cmd_replay.EXIT_BAD_INPUT}
    assert codes("doctor") == set(cmd_doctor.EXIT.values())
    assert cmd_explain.EXIT_BAD_INPUT in codes("explain")
    assert cmd_explain.EXIT_BUNDLE in codes("explain")
    assert cmd_history.EXIT_NO_DATABASE in codes("history")


def test_every_command_of_the_parser_is_in_the_table() -> None:
    from moptd.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    names = set(sub.choices)  # type: ignore[union-attr]
    assert names <= {c.split()[0] for c in EXIT_STATUS}, names - set(EXIT_STATUS)


def _complete(words: list[str]) -> list[str]:
    bash = shutil.which("bash")
    assert bash is not None
    line = " ".join(words)
    script = (
        f"source {REPO / 'contrib/completion/moptd.bash'}; "
        f"COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; "
        f"COMP_LINE='{line}'; COMP_POINT={len(line)}; _shtab_moptd; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run([bash, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_bash_completes_commands_and_options() -> None:
    assert _complete(["moptd", "re"]) == ["record", "reload", "replay"]
    assert "--json" in _complete(["moptd", "replay", "--j"])
    assert set(_complete(["moptd", "rules", ""])) >= {"check", "test"}


def test_the_man_page_renders() -> None:
    man = shutil.which("man")
    if man is None:
        pytest.skip("man is not installed")
    out = subprocess.run(
        [man, "-l", str(REPO / "docs/man/moptd.1")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert "EXIT STATUS" in out.stdout
    assert "moptd replay" in out.stdout


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (["replay", "tests/fixtures/explain-drill"], 2),  # critical findings
        (["replay", "tests/fixtures/explain-drill", "--json"], 2),
        (["explain", "--bundle", "tests/fixtures/explain-drill"], 0),
    ],
    ids=["replay", "replay-json", "explain"],
)
def test_a_closed_pipe_ends_quietly_with_the_commands_own_status(
    args: list[str], status: int
) -> None:
    """`moptd replay ... | head -3`: the reader closes the pipe after a few lines; the
    command still ends with the status of its findings and says nothing on stderr."""
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "moptd", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    for _ in range(3):
        proc.stdout.readline()
    proc.stdout.close()  # as head does
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == status
    assert err == b""


def test_a_command_parsed_with_its_module_alone_reads_as_with_all() -> None:
    """main() builds, of the cmd_*.py commands, only the one named (the others' imports
    were 0.06 s of every command): for each command, its help and what a command line of
    its own becomes are the same as with the whole parser; a word that is no module's
    command (install-service, an option, a typo) gets the whole parser."""
    import argparse
    import contextlib
    import io

    from moptd.cli import _command_module, build_parser

    def sub_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        action = next(a for a in parser._actions if a.dest == "command")
        return action.choices  # type: ignore[return-value]

    whole = sub_of(build_parser())
    modules = [p.stem.removeprefix("cmd_") for p in (REPO / "moptd" / "cli").glob("cmd_*.py")]
    builtin = set(whole) - set(modules) - {"install-service"}
    assert builtin == {"run", "status", "config"}
    checked = 0
    for name in modules:
        if name not in whole:  # install_service adds install-service: all are built
            assert set(sub_of(build_parser(name))) == set(whole)
            continue
        assert _command_module([name, "--json"]) == name
        alone = sub_of(build_parser(name))
        assert set(alone) == builtin | {name}  # the other modules were not imported
        assert alone[name].format_help() == whole[name].format_help()
        checked += 1
    assert checked >= 8
    args = build_parser("replay").parse_args(["replay", "b.tar.gz", "--json"])
    assert vars(args) == vars(build_parser().parse_args(["replay", "b.tar.gz", "--json"]))
    for words in (["install-service"], ["--version"], ["-h"], ["replya"], ["_x"], []):
        assert _command_module(words) is None, words
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        build_parser(_command_module(["replya"])).parse_args(["replya"])
    assert "invalid choice: 'replya'" in err.getvalue()
    assert "'replay'" in err.getvalue()
