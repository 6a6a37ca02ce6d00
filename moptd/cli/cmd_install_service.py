"""`moptd install-service`: put the systemd units, sysusers, tmpfiles and polkit files in place.

Every step is printed before it is done; --dry-run prints them only. With --prefix the
files go under that root and nothing is run (for packaging and tests).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from moptd.cli import EXIT_USAGE

UNIT_EXEC = "ExecStart=/usr/bin/moptd "
UNIT_RELOAD = "ExecReload=/usr/bin/moptd "  # `moptd reload`: no /bin/kill needed


@dataclass(frozen=True)
class Placement:
    source: str  # file name in systemd/
    target: str  # absolute path on the host
    keep_existing: bool = False  # configuration the operator may have edited


PLACEMENTS = (
    Placement("moptd.service", "/etc/systemd/system/moptd.service"),
    Placement("moptd-serving@.service", "/etc/systemd/system/moptd-serving@.service"),
    Placement("moptd.sysusers", "/etc/sysusers.d/moptd.conf"),
    Placement("moptd.tmpfiles", "/etc/tmpfiles.d/moptd.conf"),
    Placement("50-moptd.rules", "/etc/polkit-1/rules.d/50-moptd.rules"),
    Placement("moptd.yaml", "/etc/moptd/moptd.yaml", keep_existing=True),
)

COMMANDS = (
    ["systemd-sysusers", "/etc/sysusers.d/moptd.conf"],
    ["systemd-tmpfiles", "--create", "/etc/tmpfiles.d/moptd.conf"],
    ["systemctl", "daemon-reload"],
)


def source_dir() -> Path | None:
    """The shipped systemd/ files: inside the wheel, else in a source checkout."""
    packaged = resources.files("moptd") / "systemd"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[2] / "systemd"
    return checkout if (checkout / "moptd.service").is_file() else None


def moptd_executable() -> str:
    found = shutil.which("moptd")
    if found:
        return str(Path(found).resolve())
    return str(Path(sys.argv[0]).resolve())


def render(source: Path, name: str, executable: str) -> str:
    text = source.joinpath(name).read_text(encoding="utf-8")
    if name == "moptd.service":
        # systemd needs the absolute path of the moptd this command belongs to.
        text = text.replace(UNIT_EXEC, f"ExecStart={executable} ")
        text = text.replace(UNIT_RELOAD, f"ExecReload={executable} ")
    return text


def install(prefix: Path | None, dry_run: bool, executable: str, out: list[str]) -> int:
    source = source_dir()
    if source is None:
        out.append("moptd: cannot find the systemd/ files (not in the package nor a checkout)")
        return 1
    if prefix is None:  # with --prefix the units are for another root: nothing to check here
        from moptd.cli.service_sandbox import cannot_run

        why = cannot_run(render(source, "moptd.service", executable), executable)
        if why is not None:
            out.append(
                f"moptd: moptd.service could not start {executable}: {why}. Install moptd "
                "where the unit's user can run it (e.g. pip install into /opt/moptd or "
                "/usr/local), or name one with --moptd PATH"
            )
            return 1
    root = prefix or Path("/")
    for placement in PLACEMENTS:
        target = root / placement.target.lstrip("/")
        if placement.keep_existing and target.exists():
            out.append(f"keep    {target} (exists)")
            continue
        out.append(f"install {source / placement.source} -> {target}")
        if not dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(render(source, placement.source, executable), encoding="utf-8")
            target.chmod(0o644)
    if prefix is not None:
        out.append("prefix given: not running systemd-sysusers, systemd-tmpfiles, daemon-reload")
        return 0
    for command in COMMANDS:
        out.append("run     " + " ".join(command))
        if dry_run:
            continue
        result = subprocess.run(command, check=False, capture_output=True, text=True)
        if result.returncode != 0:
            out.append(f"moptd: {command[0]} failed ({result.returncode}): {result.stderr.strip()}")
            return 1
    out.append("next:   systemctl enable --now moptd.service")
    return 0


def handler(args: argparse.Namespace) -> int:
    prefix = Path(args.prefix) if args.prefix else None
    if prefix is None and not args.dry_run and not _is_root():
        print(
            "moptd: install-service writes to /etc: run it as root, or use --prefix/--dry-run",
            file=sys.stderr,
        )
        return EXIT_USAGE
    lines: list[str] = []
    code = install(prefix, args.dry_run, args.moptd or moptd_executable(), lines)
    for line in lines:
        print(line, file=sys.stderr if line.startswith("moptd:") else sys.stdout)
    return code


def _is_root() -> bool:
    return os.geteuid() == 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "install-service",
        help="install the systemd units, sysusers/tmpfiles entries and polkit rule",
    )
    p.add_argument("--prefix", metavar="DIR", help="install under DIR and run nothing")
    p.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")
    p.add_argument(
        "--moptd",
        metavar="PATH",
        help="moptd executable for ExecStart= and ExecReload= (default: this one)",
    )
    p.set_defaults(func=handler)
