"""Kernel-log records from any of the formats a person or a tool hands us.

One parser serves the live follower (raw /dev/kmsg records) and bundle replay (``dmesg``
in its time formats, ``journalctl -k`` in its short, short-iso and short-monotonic outputs
with or without the host, a syslog paste), detecting the format per line so that a file
mixing formats still parses. Nothing here raises on bad input: a line that
is not a record becomes a record without a time, and every text is capped in length so a
pathological line cannot grow memory without bound.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

MAX_TEXT = 8192  # a kernel record is at most ~1 KiB; more is a paste accident
MAX_DICT = 16  # kmsg dictionary entries kept per record

_RAW = re.compile(
    r"(?P<pri>\d{1,4}),(?P<seq>\d{1,20}),(?P<us>\d{1,20}),(?P<rest>[^;]*);(?P<msg>.*)"
)
_DMESG = re.compile(r"(?:<(?P<pri>\d{1,4})>)?\[\s*(?P<ts>\d{1,12}\.\d{1,9})\]\s?(?P<msg>.*)")
_DMESG_T = re.compile(
    r"\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]?\d \d{2}:\d{2}:\d{2} \d{4})\]\s?(?P<msg>.*)"
)
_ISO = re.compile(
    r"(?P<ts>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)"
    r" (?P<host>\S+) (?P<tag>[^\s:\[]+)(?:\[\d+\])?: ?(?P<msg>.*)"
)
# syslog / journalctl's short format. The month is the locale's abbreviation (journalctl
# and rsyslog print strftime's %b): "Nov", but "nov", "mar", "Okt" or "Mär" under another
# LANG (_MONTHS). The host is left out by journalctl --no-hostname ("Nov 29 ... kernel: ").
_SHORT_TS = r"(?P<ts>(?:[^\W\d_]{3,5}\.?|\d{1,2}[月월]) [ \d]\d \d{2}:\d{2}:\d{2})"
_SHORT = re.compile(_SHORT_TS + r" (?P<host>\S+) (?P<tag>[^\s:\[]+)(?:\[\d+\])?: ?(?P<msg>.*)")
_SHORT_NO_HOST = re.compile(_SHORT_TS + r" (?P<tag>[^\s:\[]+)(?:\[\d+\])?: ?(?P<msg>.*)")
_ISO_NO_HOST = re.compile(
    r"(?P<ts>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)"
    r" (?P<tag>[^\s:\[]+)(?:\[\d+\])?: ?(?P<msg>.*)"
)
# journalctl -o short-monotonic: "[    1.343565] archlinux kernel: msg" (no host with
# --no-hostname). Only the kernel's tag is taken for that format: "[ 5.0] usb 1-1: msg" is
# a dmesg record whose text happens to have the same shape.
_MONOTONIC_TAG = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,252} )?kernel: ?")
# Month abbreviations (%b) of the C locale and of glibc's localedata for de, es, it, pt, nl,
# sv, da, pl, fr and nb (/usr/share/i18n/locales/<ll_CC>, LC_TIME abmon; fr and nb end some
# with ".", "nov." and "déc.", looked up without it): no two name different months. zh, ja
# and ko print the number and 月 / 월 ("11月 15 14:15:47", _MONTHS has them too; ja, ko and
# zh_TW pad 1-9 with a space, which a paste rarely keeps).
_MONTHS: dict[str, int] = {}
for _n, _names in enumerate(
    (
        "jan ene gen sty janv",
        "feb fev lut févr",
        "mar mär mrt mars",
        "apr abr kwi avril april",
        "may mai mag mei maj",
        "jun giu cze juin juni",
        "jul lug lip juil juli",
        "aug ago sie août",
        "sep set wrz sept",
        "oct okt ott out paź",
        "nov lis",
        "dec dez dic gru déc des",
    ),
    start=1,
):
    for _name in _names.split():
        _MONTHS[_name] = _n
    _MONTHS[f"{_n}月"] = _MONTHS[f"{_n}월"] = _n
# dmesg --time-format iso: "2025-01-21T04:41:44,283302+00:00 msg" (a comma before the
# microseconds, which journalctl and rsyslog never print)
_DMESG_ISO = re.compile(
    r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2},\d{1,9}(?:[+-]\d{2}:?\d{2})?) (?P<msg>.*)"
)
# dmesg -H / --reltime: "[Jan18 08:23] msg" at the first record of a minute (util-linux's
# "%b%e %H:%M", no year, no seconds), then "[  +0.000031] msg", the time since the record
# before
_DMESG_HUMAN = re.compile(
    r"\[(?P<mon>[^\W\d_]{3})(?P<day>[ \d]?\d) (?P<hm>\d{2}:\d{2})\] ?(?P<msg>.*)"
)
_DMESG_DELTA = re.compile(r"\[\s*\+(?P<delta>\d{1,12}\.\d{1,9})\] ?(?P<msg>.*)")
_DMESG_HUMAN_START = re.compile(r"\[(?:[^\W\d_]|\s*\+)")
# dmesg --decode (-x): "kern  :warn  : " before whatever time format was asked for
_DECODE = re.compile(r"(?P<fac>[a-z][a-z0-9]{1,7}) *:(?P<lvl>[a-z]{3,6}) *: ?(?P<rest>.*)")
# talosctl dmesg (Talos Linux, which has no dmesg or journalctl on the node): "NODE:
# FACILITY: LEVEL: [RFC3339 time]: msg", the level padded and spelled "warning"
# (vllm-project/vllm#40652, open-gpu-kernel-modules#1118: "192.168.11.119: kern: err:
# [2026-04-22T21:25:20.466440686Z]: nvidia-nvswitch1: SXid ...")
_TALOS = re.compile(
    r"(?P<node>[\w.:-]{1,255}): (?P<fac>[a-z][a-z0-9]{1,7}): *(?P<lvl>[a-z]{3,7}): "
    r"\[(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:?\d{2}))\]: ?"
    r"(?P<msg>.*)"
)
_FACILITIES = (
    "kern user mail daemon auth syslog lpr news uucp cron authpriv ftp res0 res1 res2 res3 "
    "local0 local1 local2 local3 local4 local5 local6 local7"
).split()
_LEVELS = "emerg alert crit err warn notice info debug".split()


def facility_name(facility: int) -> str:
    """syslog's name of a facility number ("kern" 0, "user" 1, ...)."""
    return _FACILITIES[facility] if 0 <= facility < len(_FACILITIES) else str(facility)


# dmesg --color=always (util-linux): SGR colour around the time stamp and the subsystem
# prefix ("ESC[32m[ 7386.259769] ESC[0mESC[33mNVRM: ESC[0mAPI mismatch ..."); taken off
# before the line is read (tests/fixtures/kernel-color/SOURCE.md)
_SGR = re.compile(r"\x1b\[[0-9;]{0,32}m")
_PRINTK_TIME = re.compile(r"\[\s*\d{1,12}\.\d{1,9}\]\s?")
_HEX_RUN = re.compile(r"(?:\\x[0-9a-fA-F]{2})+")
# A line number a paste tool put in front (`grep -n`: "943:" / "943-", `cat -n`: "  3315\t"),
# taken off when a known record format follows it
_LINE_NUMBER = re.compile(
    r"\s*\d{1,9}(?:\t| +|[:-])"
    r"(?=(?:[^\W\d_]{3}|\d{1,2}[月월]) [ \d]\d \d\d:|\[|<\d|\d{4}-\d\d-\d\d[T ]|\{)"
)


@dataclass(slots=True)
class KernelRecord:
    """One kernel-log record. ``t`` is Unix seconds when known; ``uptime`` seconds since boot."""

    text: str
    t: float | None = None
    uptime: float | None = None
    seq: int | None = None
    level: int | None = None
    facility: int | None = None
    fmt: str = "plain"
    line: int = 0  # 1-based line of the source where the record starts (0: live)
    meta: dict[str, str] = field(default_factory=dict)  # kmsg dictionary (SUBSYSTEM, DEVICE)


def _cap(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT]


def _unescape_kmsg(text: str) -> str:
    # /dev/kmsg escapes every byte below 0x20, from 0x7f up and the backslash as \xNN: a run
    # of escapes is bytes, decoded as UTF-8 (one at a time, U+202E came out as mojibake)
    if "\\x" not in text:
        return text
    return _HEX_RUN.sub(
        lambda m: bytes.fromhex(m.group().replace("\\x", "")).decode("utf-8", "replace"), text
    )


def parse_raw_record(data: str, boot_time: float | None = None, line: int = 0) -> KernelRecord:
    """One /dev/kmsg record: ``PRI,SEQ,USEC,FLAGS[,..];message`` then `` KEY=value`` lines."""
    head, _, tail = data.partition("\n")
    m = _RAW.fullmatch(head.rstrip("\r"))
    if m is None:
        return KernelRecord(_cap(head), line=line)
    pri = int(m.group("pri"))
    uptime = int(m.group("us")) / 1e6
    rec = KernelRecord(
        _cap(_unescape_kmsg(m.group("msg"))),
        t=None if boot_time is None else boot_time + uptime,
        uptime=uptime,
        seq=int(m.group("seq")),
        level=pri & 7,
        facility=pri >> 3,
        fmt="kmsg",
        line=line,
    )
    for entry in tail.split("\n"):
        add_dict_entry(rec, entry)
    return rec


def add_dict_entry(rec: KernelRecord, entry: str) -> None:
    key, sep, value = entry.strip().partition("=")
    if sep and key and len(rec.meta) < MAX_DICT:
        rec.meta[key[:64]] = _unescape_kmsg(value[:256])


def _dmesg_t_time(ts: str) -> float | None:
    # dmesg -T prints local time without a zone; bundles are taken to be UTC (docs/xid.md)
    try:
        dt = datetime.strptime(" ".join(ts.split()) + " +0000", "%a %b %d %H:%M:%S %Y %z")
    except ValueError:
        return None
    return dt.timestamp()


def _iso_time(ts: str) -> float | None:
    try:
        dt = datetime.fromisoformat(ts.replace(",", ".").replace(" ", "T", 1))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _short_time(ts: str, year: int) -> float | None:
    month_name, day, clock = ts.split()
    month = _MONTHS.get(month_name.lower().rstrip("."))
    if month is None:
        return None
    try:
        hour, minute, second = (int(x) for x in clock.split(":"))
        dt = datetime(year, month, int(day), hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None
    return dt.timestamp()


def _syslog_text(msg: str) -> str:
    # rsyslog escapes control characters as #NNN (octal): #012 is a newline
    msg = msg.replace("#012", "\n").replace("#011", "\t")
    return _PRINTK_TIME.sub("", msg, count=1) if msg.startswith("[") else msg


def _dmesg_body(text: str, boot_time: float | None, line_no: int) -> KernelRecord | None:
    """``[uptime] msg`` (with an optional ``<pri>``) or ``[ctime] msg`` (dmesg -T)."""
    if text[:1] not in ("[", "<"):
        return None
    m = _DMESG.fullmatch(text)
    if m is not None:
        uptime = float(m.group("ts"))
        pri = m.group("pri")
        msg, fmt = m.group("msg"), "dmesg"
        monotonic = pri is None and msg.find("kernel:", 0, 262) >= 0
        tag = _MONOTONIC_TAG.match(msg) if monotonic else None
        if tag is not None:
            msg, fmt = msg[tag.end() :], "monotonic"
        return KernelRecord(
            _cap(msg),
            None if boot_time is None else boot_time + uptime,
            uptime,
            level=None if pri is None else int(pri) & 7,
            facility=None if pri is None else int(pri) >> 3,
            fmt=fmt,
            line=line_no,
        )
    m = _DMESG_T.fullmatch(text)
    if m is not None:
        return KernelRecord(
            _cap(m.group("msg")), _dmesg_t_time(m.group("ts")), fmt="dmesg-T", line=line_no
        )
    return None


def _dmesg_human(
    text: str, year: int | None, before: float | None, line_no: int
) -> KernelRecord | None:
    """A dmesg -H line: its minute, or the record before's time plus its delta."""
    if _DMESG_HUMAN_START.match(text) is None:
        return None
    m = _DMESG_DELTA.fullmatch(text)
    if m is not None:
        t = None if before is None else before + float(m.group("delta"))
        return KernelRecord(_cap(m.group("msg")), t, fmt="dmesg-H", line=line_no)
    m = _DMESG_HUMAN.fullmatch(text)
    if m is None:
        return None
    y = year if year is not None else datetime.now(UTC).year
    stamp = f"{m.group('mon')} {m.group('day').strip()} {m.group('hm')}:00"
    return KernelRecord(_cap(m.group("msg")), _short_time(stamp, y), fmt="dmesg-H", line=line_no)


def _dmesg_iso(text: str, line_no: int) -> KernelRecord | None:
    m = _DMESG_ISO.fullmatch(text)
    if m is None:
        return None
    return KernelRecord(
        _cap(m.group("msg")), _iso_time(m.group("ts")), fmt="dmesg-iso", line=line_no
    )


MAX_JSON_LINES = 256  # a journalctl -o json-pretty object longer than this is not one


def _micros(value: object) -> float | None:
    # the journal's timestamps are decimal strings of microseconds
    text = str(value)
    return int(text) / 1e6 if text.isdigit() and len(text) <= 20 else None


def _json_record(text: str, line_no: int) -> tuple[bool, KernelRecord | None]:
    """A ``journalctl -o json`` / ``json-pretty`` entry: (True, the kernel's record or None
    for another program's entry), or (False, None) when the text is not a JSON object."""
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError):
        return False, None
    if not isinstance(entry, dict):
        return False, None
    transport = entry.get("_TRANSPORT")
    if transport != "kernel" and not (
        transport is None and entry.get("SYSLOG_IDENTIFIER") == "kernel"
    ):
        return True, None
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # the journal's form of a message that is not UTF-8
        data = bytes(b for b in message[: MAX_TEXT * 2] if isinstance(b, int) and 0 <= b < 256)
        message = data.decode("utf-8", "replace")
    rec = KernelRecord(
        _cap(message if isinstance(message, str) else ""),
        _micros(entry.get("__REALTIME_TIMESTAMP")),
        _micros(entry.get("_SOURCE_MONOTONIC_TIMESTAMP")),
        fmt="json",
        line=line_no,
    )
    for key, into in (("PRIORITY", "level"), ("SYSLOG_FACILITY", "facility")):
        value = str(entry.get(key, ""))
        if value.isdigit() and len(value) <= 3:
            setattr(rec, into, int(value))
    for key, name in (("_KERNEL_SUBSYSTEM", "SUBSYSTEM"), ("_KERNEL_DEVICE", "DEVICE")):
        if isinstance(entry.get(key), str):
            add_dict_entry(rec, f"{name}={entry[key]}")
    return True, rec


def parse_line(
    line: str, boot_time: float | None = None, year: int | None = None, line_no: int = 0
) -> KernelRecord | None:
    """One line in any supported format; None for lines that are not kernel records
    (another program's syslog line, a journal banner)."""
    line = line.rstrip("\r\n")
    if len(line) > MAX_TEXT * 2:
        line = line[: MAX_TEXT * 2]
    if not line.strip() or line.startswith("-- ") or line == "--":
        return None  # a journal banner, grep's separator of context groups
    if "]: " in line[:320]:
        rec = _talos(line, line_no)
        if rec is not None:
            return rec
    if line[0].isdigit():
        m = _RAW.fullmatch(line)
        if m is not None:
            return parse_raw_record(line, boot_time, line_no)
        rec = _dmesg_iso(line, line_no)
        if rec is not None:
            return rec
        if "月" in line[:3] or "월" in line[:3]:
            rec, other = _short(line, year, line_no)
            if rec is not None or other:
                return rec
        m = _ISO_NO_HOST.fullmatch(line)
        if m is None or m.group("tag") != "kernel":
            m = _ISO.fullmatch(line) or m
        if m is not None:
            if m.group("tag") != "kernel":
                return None
            return KernelRecord(
                _cap(_syslog_text(m.group("msg"))),
                _iso_time(m.group("ts")),
                fmt="iso",
                line=line_no,
            )
    elif line[0] in "[<":
        rec = _dmesg_body(line, boot_time, line_no)
        if rec is not None:
            return rec
    elif line[0] == "{":
        parsed, rec = _json_record(line, line_no)
        if parsed:
            return rec
    elif line[0].isalpha():
        if line[0].islower():
            rec = _decoded(line, boot_time, line_no)
            if rec is not None:
                return rec
        rec, other = _short(line, year, line_no)
        if rec is not None or other:
            return rec
    return KernelRecord(_cap(line), fmt="plain", line=line_no)


def _talos(line: str, line_no: int) -> KernelRecord | None:
    m = _TALOS.fullmatch(line)
    if m is None or m.group("fac") not in _FACILITIES:
        return None
    level = m.group("lvl")
    level = "warn" if level == "warning" else level
    if level not in _LEVELS:
        return None
    return KernelRecord(
        _cap(m.group("msg")),
        _iso_time(m.group("ts")),
        level=_LEVELS.index(level),
        facility=_FACILITIES.index(m.group("fac")),
        fmt="talos",
        line=line_no,
    )


def _decoded(line: str, boot_time: float | None, line_no: int) -> KernelRecord | None:
    """dmesg --decode: "kern  :warn  : " before the record in its time format."""
    m = _DECODE.fullmatch(line)
    if m is None or m.group("fac") not in _FACILITIES or m.group("lvl") not in _LEVELS:
        return None
    rest = m.group("rest")
    rec = _dmesg_body(rest, boot_time, line_no) or _dmesg_iso(rest, line_no)
    if rec is None:
        rec = KernelRecord(_cap(rest), fmt="dmesg", line=line_no)
    rec.level = _LEVELS.index(m.group("lvl"))
    rec.facility = _FACILITIES.index(m.group("fac"))
    return rec


def _short(line: str, year: int | None, line_no: int) -> tuple[KernelRecord | None, bool]:
    """A syslog / journalctl short line: (the kernel's record, False), (None, True) for
    another program's line, (None, False) when the line is not in this format."""
    m = _SHORT_NO_HOST.fullmatch(line)
    if m is None or m.group("tag") != "kernel":
        # "Nov 29 16:21:26 host kernel: ..." (the host-less pattern reads the host as a
        # tag); a host-less line of another program ("... gdm3[7055]: msg") is left as is
        m = _SHORT.fullmatch(line) or m
    if m is None:
        return None, False
    if m.group("tag") != "kernel":
        return None, True
    y = year if year is not None else datetime.now(UTC).year
    rec = KernelRecord(
        _cap(_syslog_text(m.group("msg"))),
        _short_time(m.group("ts"), y),
        fmt="syslog",
        line=line_no,
    )
    return rec, False


def parse_kernel_log(
    text: str, boot_time: float | None = None, year: int | None = None
) -> list[KernelRecord]:
    """Every record of a kernel log in any supported format (auto-detected per line).

    ``boot_time`` (Unix seconds) turns seconds-since-boot into wall time; ``year`` dates
    the year-less ``journalctl -k``/syslog stamps (default: the current year). Indented
    lines continue the record above: kmsg dictionary entries (`` DEVICE=+pci:...``) or
    further lines of a multi-line message. ``journalctl -o json`` entries are one per line,
    ``-o json-pretty`` entries span the lines from ``{`` to ``}``.
    """
    out: list[KernelRecord] = []
    pretty: list[str] = []  # the lines of a json-pretty object read so far
    start = 0
    human_t: float | None = None  # the time of the last dmesg -H record
    for n, raw in enumerate(text.splitlines(), start=1):
        if "\x1b" in raw:
            raw = _SGR.sub("", raw)
        first = raw[:1]
        if first.isdigit() or first == " " or first == "\t":
            numbered = _LINE_NUMBER.match(raw)
            if numbered is not None:
                raw = raw[numbered.end() :]
                first = raw[:1]
        if pretty:
            pretty.append(raw[: MAX_TEXT * 2])
            if raw.lstrip().startswith("}"):
                parsed, rec = _json_record("\n".join(pretty), start)
                if parsed:
                    out.extend([] if rec is None else [rec])
                    pretty = []
                    continue
            elif len(pretty) < MAX_JSON_LINES and sum(map(len, pretty)) < MAX_TEXT * 8:
                continue
            # not an object after all, or too long for one: its lines are read as lines
            out.extend(_each_line(pretty, start, boot_time, year))
            pretty = []
            continue
        if (first == "{" or first == " " or first == "\t") and raw.strip() == "{":
            pretty, start = [raw], n
            continue
        if out and raw[:1] in (" ", "\t") and raw.strip():
            prev = out[-1]
            if prev.fmt == "kmsg":
                add_dict_entry(prev, raw)
                continue
            if prev.fmt != "plain":
                if len(prev.text) < MAX_TEXT:
                    prev.text = _cap(prev.text + "\n" + raw.strip())
                continue
        human = None
        if _DMESG_HUMAN_START.match(raw) is not None:
            human = _dmesg_human(raw.rstrip("\r\n")[: MAX_TEXT * 2], year, human_t, n)
        rec = human or parse_line(raw, boot_time, year, n)
        if human is not None:
            human_t = human.t
        if rec is not None:
            out.append(rec)
    out.extend(_each_line(pretty, start, boot_time, year))
    return out


def _each_line(
    lines: list[str], first: int, boot_time: float | None, year: int | None
) -> list[KernelRecord]:
    recs = (parse_line(raw, boot_time, year, first + i) for i, raw in enumerate(lines))
    return [r for r in recs if r is not None]


def read_kernel_log(
    path: Path, boot_time: float | None = None, year: int | None = None
) -> list[KernelRecord]:
    """A kernel-log file; undecodable bytes are replaced, never fatal."""
    return parse_kernel_log(path.read_bytes().decode("utf-8", "replace"), boot_time, year)
