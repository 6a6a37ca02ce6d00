"""Kernel records from a GPU-related emitter that say they failed and that no pattern of
moptd's knows: issue 29's "never silent" for the kernel log (UNCLASSIFIED_ERROR).

A record counts when its emitter is GPU-related (NVRM, nvidia-*, nvidia-drm, the nvidia
driver's own PCI lines) and it is an error: printk level err or worse where the format
keeps the level, or, where it does not or the emitter is the NVIDIA module, its text says
it failed. The NVIDIA module's level says nothing: nv_printf() prints every NV_PRINTF line
with KERN_CONT, so all of them, errors included, arrive at the default level, warn
(kernel-open/nvidia/os-interface.c, 595.45.04); the Xid lines of the fixtures are
"kern :warn". Known-harmless lines are listed in BENIGN with their source.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

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
# Harmless lines that read like failures. Each with where it was read.
BENIGN = (
    # module loader, permissive signature mode: the module loaded (kernel/module/signing.c;
    # /work/shared/reference/emitters.md section 11)
    re.compile(r"module verification failed: signature and/or required key missing"),
    # a notice that the Xid 119 prints of a GSP RPC storm are thinned out: the Xid lines
    # are the evidence (src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c:2477, 595.45.04)
    re.compile(r"Rate limiting GSP RPC error prints"),
)
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
    if any(rx.search(text) for rx in BENIGN):
        return False
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
