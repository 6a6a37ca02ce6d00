"""The hostile inputs of issue 30 that its fault tests and `bench/adversarial_rerun.py` both
build: the terminal-injection bytes and the public Xid 79 line they ride on (item 4), and the
tar headers that must be refused before `tarfile` reads them (item 6). Inputs, not log lines:
the one log line is leptonai/gpud's (tests/fixtures/kmsg-restart/SOURCE.md)."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

XID79 = Path(__file__).parent.parent / "fixtures" / "kmsg-restart" / "xid79.txt"
HOSTILE = (
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b]52;c;bW9wdGQgcHduZWQ=\x07"  # OSC 52: write the clipboard
    "\u202eDELIAF\u202c"  # right-to-left override
    "\x9b32mALL GPUS HEALTHY\x1b[0m"  # a C1 CSI: green
)
# what no terminal output may hold: C0 but tab and newline, DEL, C1, bidi controls
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
# HOSTILE's controls as moptd must show them
ESCAPED = ("\\x1b[2J", "\\x1b]52;c;", "\\x07", "\\u202e", "\\x9b32m")


def raw_controls(text: str) -> list[str]:
    """The unsafe characters in ``text``, as U+XXXX."""
    return sorted({f"U+{ord(c):04X}" for c in UNSAFE.findall(text)})


def xid79_line(pci: str, tag: str) -> str:
    """The public Xid 79 line moved to ``pci`` (a domain no real GPU has), tagged."""
    return XID79.read_text().strip().replace("PCI:0000:05:00", f"PCI:{pci}") + f" {tag} "


def tar_header(name: str, size: int, kind: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def pax_tar(record: bytes) -> bytes:
    """A tarball whose first member is a pax header holding ``record``, then its end."""
    raw = tar_header("@PaxHeader", len(record), tarfile.XHDTYPE) + record
    return raw + b"\0" * (-len(record) % 512) + b"\0" * 1024


def write_huge_extended(
    path: Path, kind: bytes, name: str = "@LongHeader", size: int = 600 << 20
) -> Path:
    """An extended header (pax or GNU long name) of ``size`` bytes first, its data a sparse
    hole: no disk used, the hole reads as zeros."""
    with path.open("wb") as fh:
        fh.write(tar_header(name, size, kind))
        fh.truncate(512 + size + 1024)
    return path
