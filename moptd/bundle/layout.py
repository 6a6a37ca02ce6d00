"""Where each kind of evidence lives in a bundle (docs/bundle.md), and a bundle directory
being built: files put at their canonical paths, several of one kind kept apart, and for
each file laid where it came from (the input, and the input's line of its line 1)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from moptd.bundle.sources import (
    CDI,
    CONTAINER_CLI_ERRORS,
    DAEMON_JOURNALS,
    DEV_NODES,
    DF,
    DKMS,
    FABRICMANAGER_LOG,
    FILES,
    GUEST_LIBS,
    TOOLKIT,
    WSL_LIB,
)

KERNEL_LOG = "kernel/dmesg.txt"
MODPROBE = "kernel/modprobe.txt"
NVSMI_DIR = "gpu/nvidia-smi"
SAMPLES = "gpu/samples.jsonl"
# pasted kind -> the bundle file it becomes (serving logs: serving/<engine>/log.txt)
DEST: dict[str, str] = {
    "kernel-log": KERNEL_LOG,
    "modprobe": MODPROBE,
    "lsmod": "kernel/proc_modules",
    "proc-modules": "kernel/proc_modules",
    "driver-version": "kernel/driver_version",
    "dkms-status": DKMS,
    "uname-r": "kernel/uname_r",
    "tainted": "kernel/tainted",
    "dev-nodes": DEV_NODES,
    "meminfo": "host/meminfo",
    "swappiness": "host/swappiness",
    "df": DF,
    "moptd-samples": SAMPLES,
    "fabricmanager-log": FABRICMANAGER_LOG,
    "container-cli": CONTAINER_CLI_ERRORS,
    **{f"journal-{unit}": rel for unit, rel in DAEMON_JOURNALS.items()},
}
NVSMI_SUFFIX = {
    "nvidia-smi-q": ".txt",
    "nvidia-smi-table": ".txt",
    "nvidia-smi-failure": ".txt",
    "nvidia-smi-xml": ".xml",
}
SERVING_DIR = {
    "vllm-log": "vllm",
    "sglang-log": "sglang",
    "trtllm-log": "trtllm",
    "onnxruntime-log": "onnxruntime",
    "python-log": "app",
}
SERVING_FILES = ("log.txt", "cmdline.txt", "model_files.txt", "health.jsonl", "environ.txt")
VERSIONS = "versions.json"  # moptd record's version-lock record (moptd/serving/version_lock.py)
SINGLE = frozenset(
    {rel for rel, _ in FILES}
    | {DF, DEV_NODES, DKMS, TOOLKIT, MODPROBE, SAMPLES, "host/listening.txt", VERSIONS}
    | {WSL_LIB, GUEST_LIBS, FABRICMANAGER_LOG, CONTAINER_CLI_ERRORS, *DAEMON_JOURNALS.values()}
)
# what a bundle may hold that is not evidence: kept, never read, never an error
NOT_EVIDENCE = re.compile(r"(?:[^/]+\.md|expected\.yaml|\.gitkeep|\.gitattributes)$")
_KERNEL_LOG = re.compile(r"kernel/dmesg[^/]*\.txt$")
_NVSMI = re.compile(r"gpu/nvidia-smi/[^/]+\.(?:xml|txt)$")
_SERVING = re.compile(
    r"serving/([^/]+)/(?:metrics/[^/]+\.prom|(?:"
    + "|".join(re.escape(f) for f in SERVING_FILES)
    + "))$"
)
_CDI = re.compile(re.escape(CDI) + r"/[^/]+\.(?:yaml|yml|json)$")


def canonical(rel: str) -> bool:
    """Whether a bundle-relative path is one docs/bundle.md names (the reader reads it)."""
    return (
        rel == "bundle.yaml"
        or rel in SINGLE
        or bool(_KERNEL_LOG.match(rel) or _NVSMI.match(rel) or _SERVING.match(rel))
        or bool(_CDI.match(rel))
    )


@dataclass(frozen=True)
class Origin:
    """A laid file's source: the input as the user named it, and the input's line that is
    line 1 here (1 for a whole file); ``copied`` when moptd wrote it (a pasted section),
    not a link to a file of a bundle."""

    input: str
    first_line: int = 1
    copied: bool = True

    def at(self, line: int) -> str:
        if line <= 0:
            return self.input
        return f"{self.input}:{line + self.first_line - 1}"


class Layout:
    """A bundle directory being filled at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.origins: dict[str, Origin] = {}
        self._serving: dict[tuple[str, str], str] = {}  # (input, engine) -> its log / dir
        self._dirs: set[str] = set()  # serving directories given out
        self._nvsmi = 0

    def taken(self, rel: str) -> bool:
        return rel in self.origins or (self.root / rel).exists()

    def place_kind(self, kind: str, text: str, origin: Origin) -> tuple[str | None, str]:
        """Lays pasted text of ``kind``; (its bundle path, "") or (None, why not)."""
        if kind in NVSMI_SUFFIX:
            self._nvsmi += 1
            rel = self._free(f"{NVSMI_DIR}/{self._nvsmi:03d}{NVSMI_SUFFIX[kind]}")
            return self._write(rel, text, origin), ""
        if kind in SERVING_DIR:
            key = (origin.input, kind)
            if key in self._serving:  # a second excerpt of the same process's log
                rel = self._serving[key]
                with (self.root / rel).open("a", encoding="utf-8", errors="surrogateescape") as f:
                    f.write(text)
                return rel, ""
            name = self._free_dir(f"serving/{SERVING_DIR[kind]}")
            rel = self._write(f"{name}/log.txt", text, origin)
            self._serving[key] = rel
            return rel, ""
        dest = DEST.get(kind)
        if dest is None:
            return None, ""
        if dest == KERNEL_LOG:
            return self._write(self._free(dest), text, origin), ""
        if (
            dest in (MODPROBE, CONTAINER_CLI_ERRORS)
            and dest in self.origins
            and self.origins[dest].copied
        ):
            with (self.root / dest).open("a", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
            return dest, ""
        if self.taken(dest):
            return None, f"{dest} was already read from {self.origins[dest].input}"
        return self._write(dest, text, origin), ""

    def link(self, rel: str, target: Path, origin: Origin) -> tuple[str | None, str]:
        """A canonical file of a bundle directory, linked (never copied) at ``rel`` or, when
        an earlier input took that path, at a free one of its kind."""
        if _KERNEL_LOG.match(rel) or _NVSMI.match(rel) or _CDI.match(rel):
            rel = self._free(rel)
        elif not _SERVING.match(rel) and self.taken(rel):
            return None, f"{rel} was already read from {self.origins[rel].input}"
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target.resolve(), path)
        self.origins[rel] = origin
        return rel, ""

    def serving_dir(self, name: str, input_: str) -> str:
        """The serving directory a bundle's serving/<name>/ goes to (renamed when another
        input has a serving/<name> too)."""
        key = (input_, f"dir:{name}")
        if key not in self._serving:
            self._serving[key] = self._free_dir(f"serving/{name}")
        return self._serving[key]

    def remove(self, rel: str) -> None:
        (self.root / rel).unlink(missing_ok=True)
        self.origins.pop(rel, None)

    def _write(self, rel: str, text: str, origin: Origin) -> str:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        self.origins[rel] = origin
        return rel

    def _free(self, rel: str) -> str:
        if not self.taken(rel):
            return rel
        stem, dot, ext = rel.rpartition(".")
        n = 2
        while self.taken(f"{stem}-{n}.{ext}" if dot else f"{rel}-{n}"):
            n += 1
        return f"{stem}-{n}.{ext}" if dot else f"{rel}-{n}"

    def _free_dir(self, rel: str) -> str:
        name, n = rel, 2
        while name in self._dirs or (self.root / name).exists():
            name = f"{rel}-{n}"
            n += 1
        self._dirs.add(name)
        return name
