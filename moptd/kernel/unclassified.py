"""Kernel records from a GPU-related emitter that say they failed and that no pattern of
moptd's knows: issue 29's "never silent" for the kernel log (UNCLASSIFIED_ERROR).

A record counts when its emitter is GPU-related (NVRM, nvidia-*, nvidia-drm, the nvidia
driver's own PCI lines) and it is an error: printk level err or worse where the format
keeps the level, or, where it does not or the emitter is the NVIDIA module, its text says
it failed. The NVIDIA module's level says nothing: nv_printf() prints every NV_PRINTF line
with KERN_CONT, so all of them, errors included, arrive at the default level, warn
(kernel-open/nvidia/os-interface.c, 595.45.04); the Xid lines of the fixtures are
"kern :warn".

Which messages are harmless and which are errors moptd does not classify is declared once,
in the emitter catalogs (moptd/catalog/emitters/nvidia-kernel.yaml, linux-kernel.yaml: each
message with its source): a message catalogued ``benign`` is never quoted, one catalogued
UNCLASSIFIED_ERROR is an error record even where its text has no failure word ("NVRM: No
NVIDIA GPU found.").
"""

from __future__ import annotations

import re
from collections import OrderedDict
from functools import cache
from typing import Any

from moptd.catalog.emitters import BENIGN as _BENIGN_CODE
from moptd.catalog.emitters import CatalogError, Message, emitter

# emitter id -> the start of its records
_EMITTERS = (
    ("nvrm", re.compile(r"NVRM: ")),
    ("nvidia-drm", re.compile(r"\[drm:[^\]]{0,80}\[nvidia_drm\]\]|\[nvidia-drm\]")),
    ("nvidia-modeset", re.compile(r"nvidia-modeset: ")),
    ("nvidia-uvm", re.compile(r"nvidia[-_]uvm: ")),
    ("nvidia-peermem", re.compile(r"nvidia[-_]peermem: |nv_peer_mem: ")),
    ("nvidia-nvswitch", re.compile(r"nvidia-nvswitch\d{0,3}: ")),
    ("nvidia-nvlink", re.compile(r"nvidia-nvlink: ")),
    ("nvidia", re.compile(r"nvidia(?: [0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])?: ")),
)
_BUS = re.compile(
    r"(?:NVRM: GPU |nvidia )(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):"
)
_FAILED = re.compile(
    r"\b(?:error|errors|failed|failure|fatal|timed out|timeout|unable|cannot|can't|could not"
    r"|not responding|assertion|invalid|exception|corrupt(?:ed|ion)?|panic|aborted|refused)\b"
    r"|\*ERROR\*",
    re.IGNORECASE,
)
# the catalogs whose messages a kernel record may carry (the records of nvidia.ko's parts,
# and the kernel's own lines about the nvidia devices and modules)
KERNEL_CATALOGS = ("nvidia-kernel", "linux-kernel")


@cache
def _catalogued(code: str) -> tuple[Message, ...]:
    """The messages of the kernel catalogs with ``code``, read (YAML) when first asked: a
    host whose ring holds no GPU emitter's unmatched record never needs them, and `moptd
    explain --offline` imports this module for its kernel pass (BENCHMARKS.md, "issue 31:
    explain --offline on the merged tree")."""
    out: list[Message] = []
    for e in KERNEL_CATALOGS:
        em = emitter(e)
        if em is None:
            raise CatalogError(f"no emitter catalog declares {e!r}")
        out.extend(m for m in em.messages if m.code == code)
    return tuple(out)


def __getattr__(name: str) -> tuple[Message, ...]:
    # Harmless lines that read like failures (BENIGN), and errors moptd knows it cannot
    # classify (KNOWN_UNCLASSIFIED), as module attributes, read on first use
    if name == "BENIGN":
        return _catalogued(_BENIGN_CODE)
    if name == "KNOWN_UNCLASSIFIED":
        return _catalogued("UNCLASSIFIED_ERROR")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


MAX_DISTINCT = 8  # distinct messages kept per emitter and subject
MAX_KEYS = 64
MAX_QUOTE = 200
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


def emitter_of(text: str) -> str | None:
    for name, rx in _EMITTERS:
        if rx.match(text) is not None or (name == "nvidia-drm" and rx.search(text[:120])):
            return name
    return None


def is_error(level: int | None, text: str, emitter: str) -> bool:
    if any(m.found_in(text) for m in _catalogued(_BENIGN_CODE)):
        return False
    if any(m.found_in(text) for m in _catalogued("UNCLASSIFIED_ERROR")):
        return True
    if level is not None and level <= 3 and emitter not in ("nvrm",):
        return True
    return _FAILED.search(text) is not None


def bus_of(text: str) -> str:
    m = _BUS.match(text)
    return m.group("bus") if m else ""


class Tally:
    """Distinct messages per (subject, emitter): counted, at most MAX_DISTINCT kept; numbers
    (timestamps, addresses) do not make a message distinct."""

    def __init__(self) -> None:
        # (subject, emitter) -> (shape -> [first message, count], messages not kept)
        self._by_key: OrderedDict[tuple[str, str], tuple[dict[str, list[Any]], list[int]]] = (
            OrderedDict()
        )

    def add(self, subject: str, emitter: str, message: str) -> tuple[str, int]:
        """(the quote of the distinct messages so far, how many were not kept)."""
        key = (subject, emitter)
        seen, dropped = self._by_key.setdefault(key, ({}, [0]))
        self._by_key.move_to_end(key)
        while len(self._by_key) > MAX_KEYS:
            self._by_key.popitem(last=False)
        shape = _NUMBERS.sub("N", message)
        if shape in seen:
            seen[shape][1] += 1
        elif len(seen) < MAX_DISTINCT:
            seen[shape] = [message[:MAX_QUOTE], 1]
        else:
            dropped[0] += 1
        return "; ".join(f'"{m}" x{n}' for m, n in seen.values()), dropped[0]
