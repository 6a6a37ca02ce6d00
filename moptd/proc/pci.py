"""The one PCI address normaliser (docs/bundle.md): every form a GPU's address is printed in
becomes lower-case ``dddd:bb:dd.f``. The kernel prints ``0000:3b:00`` (no function: ``.0``),
NVML and nvidia-smi ``00000000:3B:00.0`` (an eight-digit domain, cut to four), Xid lines
``PCI:0000:3b:00``."""

from __future__ import annotations

import functools
import re

_PCI = re.compile(r"^(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?$")


@functools.lru_cache(maxsize=1024)  # every rule tick asks again for the same few addresses
def normalize_pci(text: str) -> str | None:
    """The normal form, or None where ``text`` is not a PCI address."""
    m = _PCI.match(text.strip().lower().removeprefix("pci:"))
    if not m:
        return None
    domain = (m.group(1) or "0000")[-4:]
    return f"{domain}:{m.group(2)}:{m.group(3)}.{m.group(4) or '0'}"


def pci_key(text: str) -> str:
    """The normal form where ``text`` is an address, else ``text`` lower-cased: a key that
    still matches itself when a tool prints something unexpected."""
    return normalize_pci(text) or text.strip().lower().removeprefix("pci:")
