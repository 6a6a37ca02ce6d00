"""What a pasted text is, by its content: kernel log, nvidia-smi output, a serving log, ...

Pure and bounded. ``sniff`` looks at the first SNIFF_BYTES of raw input to tell text from
binary data, compressed data and emptiness. ``split`` cuts text into sections, contiguous
runs of lines of one kind (a ticket body holds several), with the prose between them as
sections of kind ``prose``. Each line is tested against a fixed handful of anchored patterns
(one alternation of every kind's start, the current section's continuation, and for a serving
log its engine's shape), on at most MAX_MATCH_CHARS of the line, so the cost is linear in the
input and no pattern backtracks over a long line. Past MAX_SECTIONS sections the rest is one
section of kind ``skipped``.

A kind's *start* is a line only that kind prints (``==============NVSMI LOG==============``,
``NVRM version:``, a vLLM ``INFO 11-29 16:29:57 [file.py:12]`` line); its *continuation* is
what may follow inside it (an indented ``Key : value`` line in ``nvidia-smi -q``; any line in
a serving log, whose process prints tracebacks and progress bars between its log lines).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from moptd.collectors.driver import parse_modprobe_output
from moptd.kernel.logparse import parse_kernel_log

SNIFF_BYTES = 64 << 10
MAX_MATCH_CHARS = 1024
# A ticket holds a handful of pastes; past this many sections the rest is one unused section.
MAX_SECTIONS = 256

# kind -> what a person calls it
LABELS: dict[str, str] = {
    "kernel-log": "kernel log",
    "nvidia-smi-q": "nvidia-smi -q",
    "nvidia-smi-xml": "nvidia-smi -q -x",
    "nvidia-smi-table": "nvidia-smi",
    "nvidia-smi-failure": "nvidia-smi failure",
    "vllm-log": "vLLM log",
    "sglang-log": "SGLang log",
    "trtllm-log": "TensorRT-LLM log",
    "onnxruntime-log": "ONNX Runtime log",
    "python-log": "Python/PyTorch log",
    "modprobe": "modprobe output",
    "lsmod": "lsmod",
    "proc-modules": "/proc/modules",
    "dev-nodes": "ls -l /dev/nvidia*",
    "driver-version": "/proc/driver/nvidia/version",
    "dkms-status": "dkms status",
    "uname-r": "uname -r",
    "meminfo": "/proc/meminfo",
    "df": "df -P",
    "prometheus": "/metrics scrape",
    "moptd-samples": "moptd NVML samples",
    "fabricmanager-log": "NVIDIA Fabric Manager log",
    "container-cli": "nvidia-container-cli error",
    "journal-nvidia-fabricmanager": "NVIDIA Fabric Manager journal",
    "journal-nvidia-persistenced": "nvidia-persistenced journal",
    "prose": "text",
    "skipped": "not read",
}

_MONTH = r"(?:[Jj]an|[Ff]eb|[Mm]ar|[Aa]pr|[Mm]ay|[Jj]un|[Jj]ul|[Aa]ug|[Ss]ep|[Oo]ct|[Nn]ov|[Dd]ec)"
_WDAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"
_FACILITY = r"(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])"
_LEVEL = r"(?:emerg|alert|crit|err|warn|notice|info|debug)"
_KERNEL = (
    rf"(?:{_FACILITY}\s*:{_LEVEL}\s*: |<\d{{1,3}}>)?"  # dmesg --decode, dmesg --raw (pstore)
    r"(?:\x1b\[[0-9;]{0,32}m)?"  # dmesg --color=always: the stamp in green
    r"(?:\d{1,3},\d{1,20},\d{1,20},[^;\n]{0,40};"  # /dev/kmsg
    r"|\[\s*\d{1,10}\.\d{1,9}\]"  # dmesg
    rf"|\[{_WDAY} {_MONTH} [ \d]\d \d\d:\d\d:\d\d \d{{4}}\]"  # dmesg -T
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d "  # dmesg --time-format iso
    # journalctl -o short-iso, rsyslog: the host and the program after the stamp (an
    # application's own ISO-stamped log is not a kernel log)
    rf"|{_ISO} (?:\S+ )?[\w.@/-]{{1,64}}(?:\[\d+\])?: "  # --no-hostname: no host
    rf"|{_MONTH} [ \d]\d \d\d:\d\d:\d\d (?:\S+ )?[\w.@/-]{{1,64}}(?:\[\d+\])?: "  # syslog
    r'|\{.{0,400}"(?:MESSAGE|__CURSOR|_TRANSPORT)"\s*:'  # journalctl -o json
    # talosctl dmesg: "192.168.11.119: kern: err: [2026-04-22T21:25:20.466440686Z]: "
    rf"|[\w.:-]{{1,255}}: {_FACILITY}: *(?:{_LEVEL}|warning): \[{_ISO}\]: "
    # a kernel message without its stamp, as NVIDIA's documents and dmesg's continuation
    # lines print it, or as `journalctl -o cat`-like pastes keep it ("kernel: NVRM: ...")
    r"|(?:NVRM|nvidia-nvswitch\d*|nvidia-nvlink|nvidia-modeset|nvidia-uvm|nvidia_uvm): "
    r"|kernel: )"
)
_VLLM = (
    r"(?:\([^()\n]{1,60}pid=\d+[^()\n]{0,20}\) )?"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
)
_SGLANG = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: (?:DP|PP|TP|EP)\d+)*\] "
_TRTLLM = r"(?:\[\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d\] )?\[(?:TensorRT-LLM|TRT-LLM|TRT)\]"
# onnxruntime's own logger (`2024-03-27 06:33:23.219728338 [E:onnxruntime:Default, file:line
# func] ...`, Windows with 7 digits) and its Python binding's session-retry block
_ONNXRUNTIME = (
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{1,9} \[[VIWEF]:onnxruntime:"
    r"|\*{15} EP Error \*{15}|EP Error .{0,400}"
)
_PYTHON = (
    r"Traceback \(most recent call last\):"
    r'|  File "[^"\n]{1,300}", line \d+'
    r"|(?:[A-Za-z_][\w.]{0,80}(?:Error|Exception|OutOfMemoryError)): "
    r"|CUDA out of memory\. Tried to allocate "
    r"|INFO:     "  # uvicorn, in front of vLLM and SGLang
    # PyTorch's c10 logging without vLLM's prefix: "[rank0]:[E219 12:00:00.1 x.cpp:1]",
    # older "[E ProcessGroupNCCL.cpp:916] " (moptd.serving.logrecord's record shapes)
    r"|(?:\[rank\d{1,6}\]:)?\[[EWIF](?:\d{3,4} \d\d:\d\d:\d\d\.\d{1,9})?(?: \d{1,10})? ?"
    r"[\w.]{1,200}\.(?:cpp|cc|h|cu):\d{1,7}\] "
    # NCCL with NCCL_DEBUG set: "host:pid:tid [dev] NCCL INFO ...", "... NCCL WARN ..."
    r"|[\w.-]{1,255}:\d{1,10}:\d{1,10} \[\d{1,4}\] (?:[\w./-]{1,200}:\d{1,7} )?"
    r"(?:\(\w{1,100}\) )?NCCL (?:WARN|INFO|ABORT) "
    r"|terminate called after throwing an instance of "  # a C++ exception's end (c10::Error)
)
# A serving log read back through the journal (`journalctl -u vllm`: "Aug 19 18:34:30 host
# vllm[8707]: ", -o short-iso) or `docker logs --timestamps` ("2025-04-06T07:55:21.1Z "): the
# emitter's record follows the collector's prefix (vllm#12474, vllm#16107,
# community-scripts/ProxmoxVED#2047). Such a journal line is no kernel line.
# docker compose's "service-1  | " (or a log viewer's bare "  | ") may stand in front of either.
_PROGRAM = r"(?!kernel:)[\w.@/-]{1,64}(?:\[\d+\])?: "
_COLLECTOR = (
    r"(?:[\w.-]{0,80} +\| )?"
    rf"(?:{_MONTH} [ \d]\d \d\d:\d\d:\d\d (?:\S+ )?{_PROGRAM}"
    rf"|{_ISO} (?:\S+ {_PROGRAM})?)?"
)
_SERVING_BODY = rf"(?:{_VLLM}|{_SGLANG}|{_TRTLLM}|{_PYTHON})"
# not a kernel line: a serving record behind the journal's prefix, or the indented line of a
# traceback under a program's prefix (kernel's own indented call traces keep "kernel:")
_KERNEL = rf"(?!{_COLLECTOR}(?:{_SERVING_BODY}|[ \t]+\S)){_KERNEL}"
_VLLM, _SGLANG, _TRTLLM, _PYTHON = (
    rf"(?:{_COLLECTOR})?(?:{p})" for p in (_VLLM, _SGLANG, _TRTLLM, _PYTHON)
)
# kind -> the pattern of a line that starts it (tested at the start of the line)
_STARTS: tuple[tuple[str, str], ...] = (
    # its header, or a line of its body: indented, the colon aligned far right (a paste of
    # the middle of a dump; the reader then says what is missing)
    ("nvidia-smi-q", r"=+NVSMI LOG=+\s*$|[ \t]{4,}\S[^:\n]*?\S {8,}: \S"),
    ("nvidia-smi-xml", r"\s*(?:<\?xml |<!DOCTYPE nvidia_smi_log|<nvidia_smi_log\b)"),
    ("nvidia-smi-table", r"\|\s*NVIDIA-SMI \d"),
    (
        "nvidia-smi-failure",
        r"NVIDIA-SMI has failed because|Failed to initialize NVML: |No devices were found\s*$"
        r"|Unable to determine the device handle for (?:GPU|gpu)"
        # the container toolkit's hook, alone or inside docker's error
        r"|.{0,400}?nvidia-container-cli: initiali[sz]ation error: nvml error: ",
    ),
    # its other refusals, alone or inside the engine's error or journal line (docker's
    # "... stderr: nvidia-container-cli: mount error: ...: unknown."): moptd.kernel.daemon_log
    ("container-cli", r".{0,1000}?nvidia-container-cli: [a-z]{1,20} error:"),
    # the daemons' journal lines without the journal's stamp (with it they are a kernel-log
    # paste, whose daemon lines are read too): moptd.kernel.daemon_log
    (
        "journal-nvidia-fabricmanager",
        r"(?:nv-fabricmanager|nvidia-fabricmanager-start\.sh)(?:\[\d{1,10}\])?: ",
    ),
    ("journal-nvidia-persistenced", r"nvidia-persistenced(?:\[\d{1,10}\])?: "),
    ("driver-version", r"NVRM version: "),
    (
        "modprobe",
        r"(?:modprobe|insmod|rmmod): (?:ERROR|FATAL|WARNING)\b|FATAL: (?:Error inserting|Module) ",
    ),
    ("lsmod", r"Module\s+Size\s+Used by\s*$|nvidia[\w]*\s+\d+\s+\d+(?:\s+[\w,-]+)?\s*$"),
    ("proc-modules", r"[\w-]+ \d+ (?:\d+|-) \S+ (?:Live|Loading|Unloading) 0x[0-9a-fA-F]+"),
    (
        "dev-nodes",
        r"[cbdlps-][-rwxsStT]{9}[.+@]?\s+\d+\s+\S+\s+\S+\s.*/dev/nvidia"
        r"|ls: cannot access '?/dev/nvidia",
    ),
    ("dkms-status", r"[\w.+-]+(?:/|, )[\w.+~-]+(?:, [^,:\n]+){0,3}: (?:installed|built|added)"),
    ("meminfo", r"MemTotal:\s+\d+ kB"),
    ("df", r"Filesystem\s+(?:1024-blocks|1K-blocks|\d+-blocks)\s+Used\s+Avail"),
    ("prometheus", r"# (?:HELP|TYPE) [a-zA-Z_:][\w:]* "),
    (
        "fabricmanager-log",
        r"\[[A-Z][a-z]{2} [ \d]\d \d{4} \d\d:\d\d:\d\d\] "
        r"\[(?:INFO|WARNING|ERROR|DEBUG)\] \[tid \d+\]",
    ),
    ("moptd-samples", r'\{"t": ?\d+(?:\.\d+)?, ?"'),
    ("kernel-log", _KERNEL),
    ("vllm-log", _VLLM),
    ("sglang-log", _SGLANG),
    ("trtllm-log", _TRTLLM),
    ("onnxruntime-log", _ONNXRUNTIME),
    ("python-log", _PYTHON),
)
_GROUP = {kind: f"k{i}" for i, (kind, _) in enumerate(_STARTS)}
_KIND_OF_GROUP = {g: k for k, g in _GROUP.items()}
_START = re.compile("|".join(f"(?P<{_GROUP[k]}>{p})" for k, p in _STARTS))
_SERVING = ("vllm-log", "sglang-log", "trtllm-log", "onnxruntime-log", "python-log")
# one family: a serving log's lines of several engines' shapes are one section
_FAMILY = {k: ("serving-log" if k in _SERVING else k) for k, _ in _STARTS}
_ENGINE = {k: re.compile(p) for k, p in _STARTS if k in _SERVING}

# family -> what may continue a section of it (besides its own start lines)
_CONT: dict[str, re.Pattern[str]] = {
    "nvidia-smi-q": re.compile(
        r"[ \t]+\S|[^:\n]*\S\s+: |GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
    ),
    "nvidia-smi-xml": re.compile(r"."),  # until </nvidia_smi_log>: values may stand alone
    "nvidia-smi-table": re.compile(r"[|+]"),
    "nvidia-smi-failure": re.compile(r"NVML library version: "),
    "driver-version": re.compile(r"GCC version: "),
    "modprobe": re.compile(r"(?:modprobe|insmod|rmmod): "),
    "lsmod": re.compile(r"[\w-]+\s+\d+\s+\d+(?:\s+[\w,-]+)?\s*$"),
    "proc-modules": re.compile(r"[\w-]+ \d+ (?:\d+|-) \S+ (?:Live|Loading|Unloading) "),
    "dev-nodes": re.compile(
        r"[cbdlps-][-rwxsStT]{9}[.+@]?\s+\d+\s|/dev/nvidia[\w-]*:\s*$|total \d+"
    ),
    "dkms-status": re.compile(r"[\w.+-]+(?:/|, )[\w.+~-]+.*: "),
    "meminfo": re.compile(r"[\w()]+:\s+\d+(?: kB)?\s*$"),
    "df": re.compile(r"\S+\s+\d+\s+\d+\s+\d+\s+\d+%\s+/"),
    "prometheus": re.compile(r"# |[a-zA-Z_:][\w:]*(?:\{| \S)"),  # labels may pass the cut
    "moptd-samples": re.compile(r'\{"t": ?\d'),
    "kernel-log": re.compile(r"[ \t]+\S"),  # kmsg dictionary lines, continued messages
    "serving-log": re.compile(r"[ \t]+\S"),
}
# a line just before a start that belongs to it (nvidia-smi prints the date, then a border)
_PRE: dict[str, re.Pattern[str]] = {
    "nvidia-smi-table": re.compile(
        rf"{_WDAY} {_MONTH} [ \d]\d \d\d:\d\d:\d\d \d{{4}}\s*$|\+-{{10,}}[-+]*\+\s*$"
    ),
}
# a second line of these starts a new document (concatenated dumps)
_DOC_START: dict[str, re.Pattern[str]] = {
    "nvidia-smi-q": re.compile(r"=+NVSMI LOG=+"),
    "nvidia-smi-table": re.compile(r"\|\s*NVIDIA-SMI \d"),
    "nvidia-smi-xml": re.compile(r"\s*<\?xml "),
}
_XML_END = re.compile(r"\s*</nvidia_smi_log>")
# logs whose messages run on over lines of any shape
_ANY_NEXT_LINE = frozenset({"serving-log", "fabricmanager-log"})
# uname -r: 6.18.44-fc-v657-gpu, 5.15.0-105-generic, 4.18.0-553.el8_10.x86_64 (not "1.0")
_UNAME = re.compile(r"\d+\.\d+(?:\.\d+[-+~\w.]*|-[-+~\w.]+)\s*$")


@dataclass
class Section:
    """Lines ``first``..``last`` (1-based, inclusive) of the text, of one kind."""

    kind: str
    first: int
    last: int
    lines: list[str] = field(default_factory=list, repr=False)

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass(frozen=True)
class Sniffed:
    """``text`` when the input is text; otherwise ``kind`` says what it is instead."""

    kind: str  # "text", "empty", "binary", "gzip", "bzip2", "xz", "zstd", "zip"
    reason: str = ""


_MAGIC = (
    (b"\x1f\x8b", "gzip", "gzip-compressed data; unpack it (gunzip) or pass a .tar.gz bundle"),
    (b"BZh", "bzip2", "bzip2-compressed data; unpack it (bunzip2) first"),
    (b"\xfd7zXZ\x00", "xz", "xz-compressed data; unpack it (unxz) first"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd-compressed data; unpack it (unzstd) first"),
    (b"PK\x03\x04", "zip", "a zip archive; unpack it and pass the files or the folder"),
)


def sniff(head: bytes) -> Sniffed:
    """Text or not, from the first bytes of an input (at most SNIFF_BYTES are looked at)."""
    head = head[:SNIFF_BYTES]
    if not head.strip():
        return Sniffed("empty", "empty" if not head else "only white space")
    for magic, kind, reason in _MAGIC:
        if head.startswith(magic):
            return Sniffed(kind, reason)
    if b"\0" in head:
        return Sniffed("binary", "binary data (NUL bytes), not text")
    text = head.decode("utf-8", "replace")
    bad = text.count("\ufffd")
    # a cut in the middle of a multi-byte character at the end is not garbage
    if bad > 8 and bad * 20 > len(text):
        return Sniffed(
            "binary", f"binary data ({bad} bytes in the first {len(head)} are not UTF-8)"
        )
    controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f\v\x1b")
    if controls * 20 > len(text):
        return Sniffed("binary", "binary data (control characters), not text")
    return Sniffed("text")


def start_kind(line: str) -> str | None:
    """The kind a line starts, or None."""
    m = _START.match(line[:MAX_MATCH_CHARS])
    return _KIND_OF_GROUP[m.lastgroup] if m is not None and m.lastgroup else None


def split(text: str) -> list[Section]:
    """The text as sections; every line but the blank ones between sections is in exactly
    one of them."""
    lines = text.splitlines()
    if len(lines) == 1 and _UNAME.match(lines[0][:MAX_MATCH_CHARS]):
        return [Section("uname-r", 1, 1, lines)]
    out: list[Section] = []
    cur: Section | None = None
    family = ""
    docs = 0  # document starts seen in the current section
    blank_run = 0
    for n, line in enumerate(lines, start=1):
        probe = line[:MAX_MATCH_CHARS]
        if not probe.strip():
            blank_run += 1
            continue
        kind = start_kind(probe)
        fam = _FAMILY.get(kind, "") if kind else ""
        joined = False
        if cur is not None and cur.kind != "prose":
            if fam and fam == family:
                doc = _DOC_START.get(family)
                joined = not (doc is not None and doc.match(probe) and docs > 0)
                if family == "nvidia-smi-xml" and _ends_xml(cur):
                    joined = False
            elif not fam and _continues(family, cur, probe, blank_run):
                joined = True
        if joined and cur is not None:
            _extend(cur, lines, n, blank_run)
            if family in _DOC_START and _DOC_START[family].match(probe):
                docs += 1
        elif kind is not None:
            start = n
            pre = _PRE.get(fam)
            if pre is not None and cur is not None and cur.kind == "prose" and blank_run == 0:
                while cur.lines and pre.match(cur.lines[-1][:MAX_MATCH_CHARS]):
                    cur.lines.pop()
                    cur.last -= 1
                    start -= 1
                if not cur.lines:
                    cur = None
            if cur is not None:
                out.append(cur)
                cur = None
            if len(out) >= MAX_SECTIONS:
                out.append(Section("skipped", start, len(lines), lines[start - 1 :]))
                break
            cur = Section(kind, start, n, lines[start - 1 : n])
            family = fam
            docs = 1 if fam in _DOC_START and _DOC_START[fam].match(probe) else 0
        elif cur is not None and cur.kind == "prose":
            _extend(cur, lines, n, blank_run)
        else:
            if cur is not None:
                out.append(cur)
                cur = None
            if len(out) >= MAX_SECTIONS:
                out.append(Section("skipped", n, len(lines), lines[n - 1 :]))
                break
            cur = Section("prose", n, n, [line])
            family = ""
        blank_run = 0
    if cur is not None:
        out.append(cur)
    return _join_serving([_refine(s) for s in out], lines)


def _join_serving(sections: list[Section], lines: list[str]) -> list[Section]:
    """Text between two stretches of one serving log is that process's output too (a
    progress bar after a blank line): one section."""
    out: list[Section] = []
    for s in sections:
        if (
            len(out) >= 2
            and s.kind in _SERVING
            and out[-1].kind == "prose"
            and out[-2].kind == s.kind
        ):
            out.pop()
            first = out.pop().first
            s = Section(s.kind, first, s.last, lines[first - 1 : s.last])
        out.append(s)
    return out


def _extend(cur: Section, lines: list[str], n: int, blank_run: int) -> None:
    cur.lines.extend(lines[n - 1 - blank_run : n])
    cur.last = n


def _continues(family: str, cur: Section, line: str, blank_run: int) -> bool:
    if family in _ANY_NEXT_LINE and blank_run == 0:
        return True  # a process prints anything between its log lines
    if family == "nvidia-smi-xml" and _ends_xml(cur):
        return False
    cont = _CONT.get(family)
    return cont is not None and cont.match(line) is not None


def _ends_xml(cur: Section) -> bool:
    return bool(cur.lines) and _XML_END.match(cur.lines[-1]) is not None


def _refine(s: Section) -> Section:
    """A serving-log section's engine: the one whose line shape it holds most; a plain
    Python traceback is a Python/PyTorch log. An XML text that is not nvidia-smi's, prose."""
    if _FAMILY.get(s.kind) == "serving-log":
        counts = dict.fromkeys(_SERVING[:-1], 0)  # every engine's shape but plain Python
        for line in s.lines:
            probe = line[:MAX_MATCH_CHARS]
            for kind in counts:
                if _ENGINE[kind].match(probe):
                    counts[kind] += 1
                    break
        best = max(counts, key=lambda k: counts[k])
        s.kind = best if counts[best] else "python-log"
    elif s.kind == "nvidia-smi-xml" and not any("<nvidia_smi_log" in ln for ln in s.lines[:8]):
        s.kind = "prose"
    elif s.kind == "prose" and len(s.lines) <= MAX_READ_AS_PROSE_LINES:
        s.kind = _read_by_the_readers(s)
    return s


# A prose section of at most this many lines is offered to the kernel-log and modprobe
# readers too; a longer one is somebody's text, and reading it twice would cost.
MAX_READ_AS_PROSE_LINES = 20_000


def _read_by_the_readers(s: Section) -> str:
    """The readers know more formats than the line patterns above (dmesg -H, journals in
    other locales or as JSON over several lines, grep -n numbers, modprobe's older
    wording): a section most of whose lines the kernel-log reader dates is a kernel log, one
    the modprobe reader finds a failure in is modprobe output; else it stays prose."""
    text = s.text
    lines = sum(1 for ln in s.lines if ln.strip())
    dated = sum(1 for r in parse_kernel_log(text) if r.fmt != "plain")
    if lines and dated * 2 >= lines:
        return "kernel-log"
    if dated and text.lstrip().startswith("{"):
        return "kernel-log"  # journalctl -o json-pretty: one record spans a dozen lines
    if parse_modprobe_output(text):
        return "modprobe"
    return "prose"


def whole_file_kind(sections: list[Section]) -> str | None:
    """The kind of a file all of whose recognised sections are one serving log (with prose
    around it: a process's output holds lines of no known shape), else None."""
    kinds = {s.kind for s in sections if s.kind != "prose"}
    if len(kinds) == 1:
        (kind,) = kinds
        if kind in _SERVING:
            return kind
    return None
