"""A bounded first pass over a tarball's headers, before `tarfile` parses any of them.

`tarfile` reads a pax or GNU long-name header whole into memory and, before Python
3.11.10 / 3.12.6, parses pax records with a regular expression that backtracks (CVE-2024-6232:
a 317-byte header took 16 s). A ticket's bundle is untrusted, so this pass walks the
decompressed stream itself, in fixed-size reads: it refuses an extended header larger than
MAX_EXTENDED_BYTES or whose records are not well formed ("<length> <key>=<value>\\n", each
length exact), and a stream that decompresses to more than the bundle limits allow or far
more than its size (a compression bomb). Only then does the guard hand the file to
`tarfile`. Names, member types and sizes stay the guard's own checks.

`looks_like_tar` answers "is this a tarball?" from the first header block alone, so no
caller needs `tarfile.is_tarfile`, which parses the first member's pax header (issue 30:
an 80,001-digit pax length took 6.6 s and ended in a ValueError).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from io import BufferedIOBase
from pathlib import Path

BLOCK = 512
# A pax record holds a path, a link target or a time; 64 KiB is hundreds of long paths.
MAX_EXTENDED_BYTES = 64 << 10
# Real bundles are text and JSON lines: they compress 5-30x. Zeros compress about 1000x.
MAX_RATIO = 200
RATIO_FLOOR = 64 << 20  # below this many unpacked bytes the ratio is not checked
EXTENDED_TYPES = {
    b"x": "pax header",
    b"g": "pax global header",
    b"L": "GNU long name",
    b"K": "GNU long link name",
}


class TarScanError(ValueError):
    """(member or "(archive)", reason) for the guard to put into BundleRefused."""

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(reason)
        self.member = member
        self.reason = reason


def scan_tar(path: Path, max_unpacked: int) -> None:
    """Raise TarScanError when the archive breaks a bound; return when tarfile may read it."""
    compressed = path.stat().st_size
    limit = min(max_unpacked, max(RATIO_FLOOR, MAX_RATIO * compressed))
    with _open_decompressed(path) as raw:
        stream = _Counted(raw, limit, compressed)
        previous = "(archive)"
        while True:
            header = stream.read_exact(BLOCK, previous)
            if header is None or header == bytes(BLOCK):
                return  # the end-of-archive marker (or a file that ends at a header)
            _check_checksum(header, previous)
            name = _name(header)
            kind = header[156:157]
            size = _size(header, name)
            if kind in EXTENDED_TYPES:
                if size > MAX_EXTENDED_BYTES:
                    after = "" if previous == "(archive)" else f" (after {previous})"
                    raise TarScanError(
                        name,
                        f"a {EXTENDED_TYPES[kind]} of {size} bytes{after}, over the "
                        f"{MAX_EXTENDED_BYTES}-byte limit",
                    )
                data = stream.read_exact(_padded(size), name)
                if data is None:
                    raise TarScanError(name, "the archive ends inside an extended header")
                if kind in (b"x", b"g"):
                    _check_pax_records(data[:size], name)
                previous = name
                continue
            if kind == b"S" and header[482]:
                _skip_sparse_extensions(stream, name)
            stream.skip(_padded(size), name)
            previous = name


def looks_like_tar(path: Path) -> bool:
    """True when the file (plain, gzip, bzip2 or xz) begins with a tar header whose checksum
    holds; reads one decompressed block and parses nothing else."""
    try:
        with _open_decompressed(path) as raw:
            header = raw.read(BLOCK)
    except (OSError, EOFError, lzma.LZMAError, zlib.error):
        return False
    if len(header) < BLOCK or header == bytes(BLOCK):
        return False
    try:
        _check_checksum(header, "(archive)")
    except TarScanError:
        return False
    return True


def _open_decompressed(path: Path) -> BufferedIOBase:
    with path.open("rb") as fh:
        magic = fh.read(6)
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    if magic[:3] == b"BZh":
        return bz2.open(path, "rb")
    if magic == b"\xfd7zXZ\x00":
        return lzma.open(path, "rb")
    return path.open("rb")


class _Counted:
    """Reads from the decompressed stream, refusing once it passes `limit` bytes."""

    def __init__(self, raw: BufferedIOBase, limit: int, compressed: int) -> None:
        self.raw = raw
        self.limit = limit
        self.compressed = compressed
        self.total = 0

    def read_exact(self, n: int, member: str) -> bytes | None:
        data = self._read(n, member)
        if not data:
            return None
        if len(data) < n:
            raise TarScanError(member, "the archive is truncated")
        return data

    def skip(self, n: int, member: str) -> None:
        while n > 0:
            chunk = self._read(min(n, 1 << 20), member)
            if not chunk:
                raise TarScanError(member, "the archive is truncated")
            n -= len(chunk)

    def _read(self, n: int, member: str) -> bytes:
        try:
            data = self.raw.read(n)
        except (OSError, EOFError, lzma.LZMAError) as exc:
            raise TarScanError(member, f"cannot decompress: {exc}") from None
        self.total += len(data)
        if self.total > self.limit:
            raise TarScanError(
                member,
                f"decompresses to over {self.limit} bytes from {self.compressed} "
                f"(limit: the bundle limit, and {MAX_RATIO}x the file's size above "
                f"{RATIO_FLOOR} bytes)",
            )
        return data


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\x00":  # POSIX ustar keeps a prefix; GNU's magic differs
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "replace") or "(unnamed member)"


def _size(header: bytes, member: str) -> int:
    field = header[124:136]
    if field[0] & 0x80:  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:
            raise TarScanError(member, "a negative size")
        return value
    digits = field.split(b"\0", 1)[0].strip(b" ")
    if not digits:
        return 0
    try:
        return int(digits, 8)
    except ValueError:
        raise TarScanError(member, f"size field {field!r} is not a number") from None


def _check_checksum(header: bytes, previous: str) -> None:
    field = header[148:156].split(b"\0", 1)[0].strip(b" ")
    try:
        stored = int(field, 8)
    except ValueError:
        raise TarScanError(previous, "not a tar header after this member") from None
    blanked = header[:148] + b" " * 8 + header[156:]
    if stored not in (sum(blanked), sum(b - 256 if b > 127 else b for b in blanked)):
        raise TarScanError(previous, "a damaged tar header after this member")


def _check_pax_records(data: bytes, member: str) -> None:
    """Linear: each record is "<decimal length> <key>=<value>\\n", length counting it all."""
    pos = 0
    while pos < len(data):
        if not data[pos:].strip(b"\0"):
            return  # trailing NUL padding some writers add
        space = data.find(b" ", pos, pos + 21)
        digits = data[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise TarScanError(member, f"pax record at byte {pos}: no length")
        length = int(digits)
        end = pos + length
        if length <= len(digits) + 3 or end > len(data) or data[end - 1 : end] != b"\n":
            raise TarScanError(member, f"pax record at byte {pos}: length {length} does not fit")
        if b"=" not in data[space + 1 : end - 1] or data[space + 1 : space + 2] == b"=":
            raise TarScanError(member, f"pax record at byte {pos}: no key=value")
        pos = end


def _skip_sparse_extensions(stream: _Counted, member: str) -> None:
    # An old-GNU sparse header continues in 512-byte blocks while byte 504 says so.
    while True:
        block = stream.read_exact(BLOCK, member)
        if block is None:
            raise TarScanError(member, "the archive ends inside a sparse map")
        if not block[504]:
            return
