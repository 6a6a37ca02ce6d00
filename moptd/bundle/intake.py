"""Any paste in: bundle directories, tarballs, raw files and standard input, several at
once, read into one Timeline with the list of what was read (``Timeline.read``).

Each raw input is classified by its content (moptd.bundle.classify), cut into sections
when it holds several kinds (a ticket body), and each section is laid into a temporary
bundle directory at the path docs/bundle.md gives its kind; then the one bundle reader
runs over that directory, so a paste goes through the collectors a live host does. Inside a
bundle directory a file at a name the bundle does not know (``kernel/dmesg.log``, a
top-level ``vllm.log``) is classified the same way and used, or listed as not used with the
reason: nothing is ignored in silence.

An entry of the read list is a dict: ``input`` (as named on the command line, or a file
inside a bundle ``DIR/rel``), ``lines`` ([first, last] for a section of a file), ``kind``,
``used``; used ones carry ``as`` (the bundle path) and ``summary`` (what it held, in words)
and ``held`` (the counts); unused ones ``reason`` and ``whole`` (true: the input as a whole
could not be used) or ``failed`` (true: a pasted section that looked like evidence did not
read; ``at`` is its FILE:LINE): both make the CLI's exit status 3.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from moptd.bundle import classify
from moptd.bundle.archive import is_tar, open_bundle
from moptd.bundle.errors import BundleError
from moptd.bundle.layout import (
    NOT_EVIDENCE,
    NVSMI_DIR,
    Layout,
    Origin,
    canonical,
)
from moptd.bundle.reader import read_tree, stream_packed
from moptd.diagnose.timeline import Timeline
from moptd.safefs import kind_of

# One pasted file at most as large as one member of a bundle (moptd.cli.bundle_guard).
MAX_INPUT_BYTES = 128 << 20
STDIN = "-"
# Files at unknown names in one bundle that are sniffed; past this, each is named, not read.
MAX_STRAYS = 1000
_XID = re.compile(r"NVRM: Xid \(")
_NVSMI_NAME = re.compile(r"^\s*Product Name\s+: (.+?)\s*$|<product_name>(.*?)</product_name>", re.M)
_NVSMI_DRIVER = re.compile(
    r"^Driver Version\s+: (\S+)|<driver_version>([^<]*)</driver_version>|Driver Version: (\S+)",
    re.M,
)
_TABLE_GPU = re.compile(r"^\|\s+\d+\s+(.+?)\s{2,}(?:On|Off)\s+\|", re.M)
_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"\s*-?\d+\s*$")

Guard = Callable[[Path], None]


@dataclass
class Intake:
    """The bundle directory the inputs became; ``close`` removes what was made for it."""

    root: Path
    shown: Path
    layout: Layout | None
    read: list[dict[str, object]] = field(default_factory=list)
    _tmps: list[tempfile.TemporaryDirectory[str]] = field(default_factory=list)

    def close(self) -> None:
        for tmp in self._tmps:
            tmp.cleanup()
        self._tmps.clear()


def read_inputs(
    inputs: Sequence[str], stdin: BinaryIO | None = None, guard: Guard | None = None
) -> Timeline:
    """The Timeline of all ``inputs`` (paths, or "-" for ``stdin``), with ``read`` filled.
    ``guard`` checks a bundle directory or tarball before it is opened (the CLI's limits on
    untrusted bundles); it raises to refuse one. A file of a bundle directory that is
    malformed raises BundleError naming it and its line; a malformed pasted section is
    listed as not used with its file and line, and the rest is read."""
    intake = gather(inputs, stdin, guard)
    try:
        return _read(intake)
    finally:
        intake.close()


def read_bundle(path: Path) -> Timeline:
    """A bundle directory or ``.tar.gz`` read as ``moptd replay`` reads it: its files at
    names the bundle does not know classified by content, never ignored. (No guard: the
    CLI puts its limits on untrusted bundles before this.)"""
    if not (path.is_dir() or (path.is_file() and _is_tar(path))):
        raise BundleError(str(path), 0, "not a bundle directory or .tar.gz")
    return read_inputs([str(path)])


def gather(
    inputs: Sequence[str], stdin: BinaryIO | None = None, guard: Guard | None = None
) -> Intake:
    work = tempfile.TemporaryDirectory(prefix="moptd-paste-")
    intake = Intake(Path(work.name), Path(" + ".join(inputs)), None)
    intake._tmps.append(work)
    try:
        _gather(intake, list(inputs), stdin, guard, Path(work.name))
    except BaseException:
        intake.close()
        raise
    return intake


def _gather(
    intake: Intake, inputs: list[str], stdin: BinaryIO | None, guard: Guard | None, work: Path
) -> None:
    bundles: list[tuple[str, Path]] = []
    raws: list[tuple[str, bytes | None, str]] = []  # (name, data, why not read)
    stdin_read = False
    for name in inputs:
        if name == STDIN:
            if stdin_read or stdin is None:
                raws.append((name, None, "standard input was already read (give - once)"))
                continue
            stdin_read = True
            data = stdin.read(MAX_INPUT_BYTES + 1)
            spooled = work / "stdin"
            spooled.write_bytes(data[: MAX_INPUT_BYTES + 1])
            if _is_tar(spooled):
                bundles.append((name, _open_tar(intake, spooled, guard)))
            else:
                raws.append((name, data, ""))
            continue
        path = Path(name)
        try:
            st = path.stat()
        except OSError as exc:
            raws.append((name, None, f"cannot read: {exc.strerror or exc}"))
            continue
        if stat.S_ISDIR(st.st_mode):
            if guard is not None:
                guard(path)
            bundles.append((name, path))
        elif stat.S_ISREG(st.st_mode) and _is_tar(path):
            bundles.append((name, _open_tar(intake, path, guard)))
        elif stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode):  # a pipe: <(dmesg)
            raws.append((name, *_read_bounded(path)))
        else:  # /dev/zero never ends; a socket is not a paste
            raws.append((name, None, f"a {kind_of(st.st_mode)}, not a file"))
    # The common case stays as it was: one bundle directory whose files all have their
    # names is read in place.
    if len(inputs) == 1 and bundles and not raws:
        name, root = bundles[0]
        strays = _strays(root)
        if not strays:
            intake.root = root
            intake.shown = Path(name)
            intake.read.extend(_bundle_entries(name, root, None))
            return
    layout = Layout(work / "bundle")
    layout.root.mkdir()
    intake.root = layout.root
    intake.layout = layout
    for name, root in bundles:
        _mirror(intake, layout, name, root)
    for name, content, why in raws:
        if content is None:
            intake.read.append(_unused(name, "unreadable", why))
        else:
            _lay_raw(intake, layout, name, content)


def _is_tar(path: Path) -> bool:
    # never tarfile.is_tarfile: it parses the first member's pax header (issue 30, item 6)
    return is_tar(path)


def _open_tar(intake: Intake, path: Path, guard: Guard | None) -> Path:
    if guard is not None:
        guard(path)
    root, tmp = open_bundle(path)
    if tmp is not None:
        intake._tmps.append(tmp)
    return root


def _read_bounded(path: Path) -> tuple[bytes | None, str]:
    """At most MAX_INPUT_BYTES of a file, a pipe (``<(dmesg)``) included."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    return data, ""


# --- raw inputs ------------------------------------------------------------------------


def _lay_raw(intake: Intake, layout: Layout, name: str, data: bytes) -> None:
    if len(data) > MAX_INPUT_BYTES:
        intake.read.append(
            _unused(
                name,
                "too-large",
                f"more than {MAX_INPUT_BYTES} bytes, the limit for one input; pass its end "
                f"(e.g. tail -c {MAX_INPUT_BYTES} {name})",
            )
        )
        return
    sniffed = classify.sniff(data)
    if sniffed.kind != "text":
        intake.read.append(_unused(name, sniffed.kind, sniffed.reason))
        return
    text = data.decode("utf-8", "replace")
    sections = classify.split(text)
    whole = classify.whole_file_kind(sections)
    hinted = _name_hint(name, text)
    if hinted is not None:
        sections = [classify.Section(hinted, 1, 1, text.splitlines())]
    elif whole is not None:
        # a serving process's output is one log, lines of no known shape included
        sections = [classify.Section(whole, 1, max(1, len(text.splitlines())), [])]
    used = 0
    for s in sections:
        body = text if (whole is not None or hinted is not None) else s.text
        entry = _place(layout, name, s, body, len(sections) > 1)
        used += bool(entry["used"])
        intake.read.append(entry)
    if not used:
        for e in intake.read:
            if e["input"] == name:
                e["whole"] = True
                if e["kind"] == "prose" and len(sections) == 1:
                    e["reason"] = "not a kind moptd reads (docs/bundle.md lists them)"


def _name_hint(name: str, text: str) -> str | None:
    """A bare number means nothing by itself; the file's name says which one it is."""
    if not _NUMBER.match(text):
        return None
    base = Path(name).name
    for kind in ("swappiness", "tainted"):
        if kind in base:
            return kind
    return None


def _place(
    layout: Layout, name: str, s: classify.Section, body: str, sectioned: bool
) -> dict[str, object]:
    entry: dict[str, object] = {"input": name}
    if sectioned:
        entry["lines"] = [s.first, s.last]
    entry["kind"] = s.kind
    if s.kind == "prose":
        entry.update(used=False, reason="not a kind moptd reads (text between the pastes)")
        entry["whole"] = False
        return entry
    if s.kind == "skipped":  # a bounded, reported skip: the input was not read in full
        entry.update(
            used=False,
            whole=False,
            failed=True,
            reason=f"past {classify.MAX_SECTIONS} sections, not read; pass the pastes as files",
        )
        return entry
    if s.kind == "prometheus":
        entry.update(
            used=False,
            whole=False,
            reason="a /metrics scrape needs its time: put it at "
            "serving/NAME/metrics/UNIX_SECONDS.prom in a bundle directory",
        )
        return entry
    rel, why = layout.place_kind(s.kind, body, Origin(name, s.first if sectioned else 1))
    if rel is None:
        entry.update(used=False, whole=False, reason=why or "no place for it in a bundle")
        return entry
    entry.update(used=True, **{"as": rel})
    return entry


def _unused(name: str, kind: str, reason: str) -> dict[str, object]:
    return {"input": name, "kind": kind, "used": False, "reason": reason, "whole": True}


# --- bundle directories ------------------------------------------------------------------


def _walk(root: Path) -> list[str]:
    """Every regular file under ``root``, relative, without following links (the guard
    has refused links in a bundle; a tarball's are refused by the guard too)."""
    out: list[str] = []
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                stack.append(Path(e.path))
            elif e.is_file(follow_symlinks=False):
                out.append(Path(e.path).relative_to(root).as_posix())
    return sorted(out)


def _strays(root: Path) -> list[str]:
    return [rel for rel in _walk(root) if not canonical(rel) and not NOT_EVIDENCE.match(rel)]


def _mirror(intake: Intake, layout: Layout, name: str, root: Path) -> None:
    """The bundle's files linked into the layout; files at unknown names classified."""
    prefix = name.rstrip("/") + "/"
    strays = 0
    for rel in _walk(root):
        origin = Origin(prefix + rel, 1, copied=False)
        if NOT_EVIDENCE.match(rel):
            continue
        if rel == "bundle.yaml":
            if layout.taken(rel):
                intake.read.append(
                    {
                        "input": origin.input,
                        "kind": "bundle-meta",
                        "used": False,
                        "whole": False,
                        "reason": f"the bundle.yaml of {layout.origins[rel].input} is used",
                    }
                )
            else:
                layout.link(rel, root / rel, origin)
            continue
        if canonical(rel):
            target = rel
            if rel.startswith("serving/"):
                _, served, rest = rel.split("/", 2)
                target = f"{layout.serving_dir(served, name)}/{rest}"
            placed, why = layout.link(target, root / rel, origin)
            if placed is None:
                intake.read.append(
                    {
                        "input": origin.input,
                        "kind": rel,
                        "used": False,
                        "whole": False,
                        "reason": why,
                    }
                )
            continue
        strays += 1
        if strays > MAX_STRAYS:
            intake.read.append(
                {
                    "input": origin.input,
                    "kind": "skipped",
                    "used": False,
                    "failed": True,
                    "reason": f"past {MAX_STRAYS} files at unknown names in {name}, not read",
                }
            )
            continue
        data, why = _read_bounded(root / rel)
        if data is None:
            intake.read.append(_unused(origin.input, "unreadable", why))
            continue
        before = len(intake.read)
        _lay_raw(intake, layout, origin.input, data)
        for e in intake.read[before:]:
            e["misnamed"] = rel
            if not e["used"] and e.get("whole") and e["kind"] == "prose":
                e["reason"] = f"{e['reason']}; {_hint(rel)}"
    intake.read.extend(_bundle_entries(name, root, layout))


def _hint(rel: str) -> str:
    return f"{rel} is not a name docs/bundle.md gives either"


def _bundle_entries(name: str, root: Path, layout: Layout | None) -> list[dict[str, object]]:
    """One entry a bundle directory's evidence group: each kernel log, the nvidia-smi
    dumps together, each serving directory, each other file (summaries come after the
    read)."""
    out: list[dict[str, object]] = []
    prefix = name.rstrip("/") + "/"
    rels = (
        sorted(r for r, o in layout.origins.items() if not o.copied and o.input.startswith(prefix))
        if layout is not None
        else [r for r in _walk(root) if canonical(r)]
    )
    dumps = [r for r in rels if r.startswith(NVSMI_DIR + "/")]
    served: dict[str, list[str]] = {}
    for rel in rels:
        if rel == "bundle.yaml" or rel.startswith(NVSMI_DIR + "/"):
            continue
        if rel.startswith("serving/"):
            served.setdefault("/".join(rel.split("/", 2)[:2]), []).append(rel)
            continue
        out.append(
            {
                "input": prefix + _origin_rel(layout, rel, prefix),
                "kind": _kind_of(rel),
                "used": True,
                "as": rel,
            }
        )
    if dumps:
        out.append(
            {
                "input": prefix + NVSMI_DIR,
                "kind": "nvidia-smi",
                "used": True,
                "as": NVSMI_DIR,
                "files": dumps,
            }
        )
    for d, files in served.items():
        out.append(
            {
                "input": prefix + _origin_rel(layout, d, prefix),
                "kind": "serving",
                "used": True,
                "as": d,
                "files": files,
            }
        )
    return out


def _origin_rel(layout: Layout | None, rel: str, prefix: str) -> str:
    if layout is None or rel not in layout.origins:
        return rel
    return layout.origins[rel].input[len(prefix) :]


def _kind_of(rel: str) -> str:
    if rel.startswith("kernel/dmesg"):
        return "kernel-log"
    return rel


# --- reading and summaries ----------------------------------------------------------------


def _read(intake: Intake) -> Timeline:
    layout = intake.layout
    while True:
        try:
            tl = read_tree(intake.root, intake.shown)
        except BundleError as e:
            rel = _rel_in(intake.root, e.file)
            origin = layout.origins.get(rel) if layout is not None and rel else None
            if layout is None or rel is None or origin is None:
                raise
            if not origin.copied:  # a file of a bundle directory: as for a bundle alone
                raise BundleError(origin.input, e.line, e.message) from None
            # a pasted section that does not read: named with its line, the rest is read
            layout.remove(rel)
            for entry in intake.read:
                if entry.get("as") == rel:
                    entry.update(used=False, reason=e.message, at=origin.at(e.line))
                    entry["failed"] = True  # evidence that does not read: exit 3
                    entry.pop("as")
                    others = [x for x in intake.read if x["input"] == entry["input"]]
                    entry["whole"] = not any(x["used"] for x in others)
            continue
        _summarise(intake, tl)
        stream_packed(tl)  # after the summary, which reads the held Batches' attributes
        return tl


def _rel_in(root: Path, file: str) -> str | None:
    try:
        return Path(file).relative_to(root).as_posix()
    except ValueError:
        try:
            return Path(file).resolve().relative_to(root.resolve()).as_posix()
        except (ValueError, OSError):
            return None


def _summarise(intake: Intake, tl: Timeline) -> None:
    # the reader's per-file counts
    stats = {str(s.get("as")): s["held"] for s in tl.read if isinstance(s.get("held"), dict)}
    gpus = _gpu_names(tl)
    out: list[dict[str, object]] = []
    for entry in intake.read:
        if entry.get("used"):
            _describe(entry, intake.root, stats, gpus)
        out.append(entry)
    tl.read = out


def _describe(
    entry: dict[str, object], root: Path, stats: dict[str, object], gpus: list[str]
) -> None:
    rel = str(entry.get("as"))
    kind = str(entry["kind"])
    label = classify.LABELS.get(kind, kind)
    held: dict[str, object] = {}
    if kind == "nvidia-smi" or kind.startswith("nvidia-smi-"):
        files = entry.get("files")
        dumps = files if isinstance(files, list) else [rel]
        text = _head(root / str(dumps[0])) if dumps else ""
        names = [a or b for a, b in _NVSMI_NAME.findall(text)] or _TABLE_GPU.findall(text)
        driver = next((x for m in _NVSMI_DRIVER.findall(text) for x in m if x), "")
        held.update(dumps=len(dumps), gpus=len(names) or len(gpus))
        parts = [f"{len(dumps)} dumps"] if len(dumps) > 1 else []
        if names or gpus:
            parts.append(_count_names(names or gpus))
        if driver:
            parts.append(f"driver {driver}")
            held["driver"] = driver
        if kind == "nvidia-smi-failure":
            parts = [text.strip().splitlines()[0][:160]] if text.strip() else []
        label = "nvidia-smi" if kind == "nvidia-smi" else label
    elif kind == "kernel-log":
        st = stats.get(rel)
        st = st if isinstance(st, dict) else {}
        lines, xids = _count_lines(root / rel)
        held.update(lines=lines, xid=xids)
        parts = [f"{lines} line" + ("" if lines == 1 else "s"), f"{xids} Xid"]
        span = _span(st.get("first"), st.get("last"))
        if span:
            parts.append(span)
            held.update(first=st.get("first"), last=st.get("last"))
        elif st.get("records"):
            parts.append("no wall-clock times")
    elif kind == "serving":
        files = entry.get("files")
        names = [str(f).rsplit("/", 1)[-1] for f in files] if isinstance(files, list) else []
        scrapes = sum(1 for f in names if f.endswith(".prom"))
        parts = [f"{scrapes} /metrics scrapes"] if scrapes else []
        parts += [f for f in names if not f.endswith(".prom")]
        label = f"serving {rel.split('/', 1)[-1]}"
    elif kind == "driver-version":
        m = _MODULE_VERSION.search(_head(root / rel))
        parts = [f"kernel module {m.group(1)}"] if m else []
    elif kind == "uname-r":
        parts = [_head(root / rel).strip()[:80]]
    else:
        lines, _ = _count_lines(root / rel)
        section = entry.get("lines")
        if isinstance(section, list) and len(section) == 2:  # a section appended to others
            lines = int(section[1]) - int(section[0]) + 1
        held["lines"] = lines
        parts = [f"{lines} line{'' if lines == 1 else 's'}"]
    files = entry.pop("files", None)  # thousands of scrape names say less than their count
    if isinstance(files, list):
        held["files"] = len(files)
    if held:
        entry["held"] = held
    entry["summary"] = f"{label}: {', '.join(p for p in parts if p)}" if parts else label


def _head(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(classify.SNIFF_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def _count_lines(path: Path) -> tuple[int, int]:
    lines = xids = 0
    try:
        with path.open("rb") as fh:
            for raw in fh:
                lines += 1
                if b"NVRM: Xid" in raw:
                    xids += len(_XID.findall(raw.decode("utf-8", "replace")))
    except OSError:
        pass
    return lines, xids


def _count_names(names: list[str]) -> str:
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c} \u00d7 {n}" for n, c in counts.items())


def _gpu_names(tl: Timeline) -> list[str]:
    seen: dict[str, str] = {}
    for _, _, batch in tl.observations:
        for subject, attrs in batch.attrs.items():
            if subject.startswith("gpu:") and attrs.get("name"):
                seen.setdefault(subject, attrs["name"])
    return list(seen.values())


def _span(first: object, last: object) -> str:
    if not isinstance(first, int | float) or not isinstance(last, int | float):
        return ""
    a = datetime.fromtimestamp(float(first), UTC)
    b = datetime.fromtimestamp(float(last), UTC)
    if a.date() == b.date():
        return f"{a:%Y-%m-%d %H:%M}-{b:%H:%M} UTC"
    return f"{a:%Y-%m-%d %H:%M} - {b:%Y-%m-%d %H:%M} UTC"


def unusable(read: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """The inputs that could not be used at all, and the pasted evidence that did not read
    (a truncated dump): the CLI exits 3 for them. Prose between pastes is not one."""
    return [e for e in read if not e.get("used") and (e.get("whole") or e.get("failed"))]
