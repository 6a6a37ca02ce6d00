"""The host-side NVIDIA daemons' own logs, read record by record: nvidia-fabricmanager's
and nvidia-persistenced's journals, Fabric Manager's log file, and nvidia-container-cli's
errors where a container engine passed them on (issue 29, "never silent").

A line is parsed first (the collector's prefix, then the emitter and the level), then its
message is looked up in that emitter's catalog (moptd/catalog/emitters/<emitter>.yaml):
the code there, benign (no event), or, for an error record no entry knows,
UNCLASSIFIED_ERROR quoting it. Record shapes, as the catalogs' ``record`` say:

- journald / syslog: ``2025-04-29T13:55:26+0000 host nv-fabricmanager[104230]: msg``
  (``journalctl -o short-iso``) or ``Nov 05 13:55:26 host nv-fabricmanager[104230]: msg``
  (short; with or without the host); the program decides the emitter;
- Fabric Manager's own log (/var/log/fabricmanager.log):
  ``[Apr 29 2025 13:55:26] [ERROR] [tid 104230] msg``, the level in brackets;
- nvidia-container-cli: ``nvidia-container-cli: <stage> error: <detail>`` anywhere in a line
  (docker's ``... stderr: nvidia-container-cli: ...: unknown.``, a kubelet event);
- a bare message, as ``journalctl -o cat`` prints it: the file's emitter (``emitter``).

Pure: no file is opened here; nothing raises on bad input; texts are capped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from moptd.catalog.emitters import BENIGN, Message, lookup
from moptd.kernel.logparse import _iso_time, _short_time
from moptd.kernel.unclassified import Tally
from moptd.observations import NODE, Event

FABRICMANAGER = "nvidia-fabricmanager"
PERSISTENCED = "nvidia-persistenced"
CONTAINER_CLI = "nvidia-container-toolkit"
EMITTERS = (FABRICMANAGER, PERSISTENCED, CONTAINER_CLI)
STREAM = "daemon_logs.error"
UNCLASSIFIED = "UNCLASSIFIED_ERROR"
MAX_TEXT = 4096
MAX_LINE = MAX_TEXT * 2

# syslog program -> emitter. Fabric Manager's binary is nv-fabricmanager (its journal tag);
# the start script of the package logs under its own name.
_PROGRAMS = {
    "nv-fabricmanager": FABRICMANAGER,
    "nvidia-fabricmanager": FABRICMANAGER,
    "nvidia-fabricmanager-start.sh": FABRICMANAGER,
    "nvidia-persistenced": PERSISTENCED,
    "nvidia-container-cli": CONTAINER_CLI,
}
_TAG = r"(?P<tag>[^\s:\[]{1,64})(?:\[\d{1,10}\])?: ?(?P<msg>.*)"
_ISO_TS = r"(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)"
_SHORT_TS = r"(?P<ts>(?:[^\W\d_]{3,5}\.?|\d{1,2}[月월]) [ \d]\d \d\d:\d\d:\d\d)"
_JOURNAL = (
    (re.compile(rf"{_ISO_TS} (?:\S+ )?{_TAG}"), "iso"),
    (re.compile(rf"{_SHORT_TS} (?:\S+ )?{_TAG}"), "short"),
)
# the program's tag alone, as a paste without the journal's stamp keeps it, or Talos's
# syslogd "content" ("nvidia-persistenced: Started (14)"): these programs only
_TAG_ONLY = re.compile(_TAG)
# Fabric Manager's log file: "[Apr 29 2025 13:55:26] [ERROR] [tid 841] msg"
_FM_FILE = re.compile(
    r"\[(?P<ts>[A-Z][a-z]{2} [ \d]?\d \d{4} \d\d:\d\d:\d\d)\] \[(?P<level>[A-Z]+)\] "
    r"\[tid \d+\] ?(?P<msg>.*)"
)
# "nvidia-container-cli: initialization error: nvml error: driver not loaded", inside
# whatever wraps it; the message runs to the engine's ": unknown." or the line's end
CLI_MARK = "nvidia-container-cli: "
_CLI_STAGE = re.compile(r"[a-z]{1,20} error:")
# what docker and runc put after the hook's stderr: escaped newlines and quotes, ": unknown."
_WRAP_CHARS = " \t.\"'\\"
# syslog priorities by name (journalctl -o verbose / rsyslog templates keep none in short
# forms: the level is then the catalog's, or the failure words below)
_ERROR_LEVELS = frozenset({"ERROR", "ERR", "CRITICAL", "CRIT", "FATAL", "ALERT", "EMERG"})
# an error record where the format keeps no level: the words the daemons print on failure
_FAILED = re.compile(
    r"\b(?:error|failed|failure|fatal|unable|cannot|could not|not ready|timed? ?out|"
    r"invalid|don't match|doesn't match|exited)\b",
    re.IGNORECASE,
)
# What systemd says about a unit is systemd's record, not the daemon's: "Starting NVIDIA
# fabric manager service..." is read for the daemon's emitter only by the service checks.


@dataclass(frozen=True, slots=True)
class DaemonRecord:
    """One record of a daemon: its emitter, level ("" unknown), message, time, line."""

    emitter: str
    message: str
    level: str = ""
    t: float | None = None
    line: int = 0


def parse_line(
    line: str, emitter: str | None = None, year: int | None = None, line_no: int = 0
) -> DaemonRecord | None:
    """One line of a daemon's log; None when it is no record of these emitters (another
    program's journal line, a banner). ``emitter`` is the file's own (a unit's journal,
    Fabric Manager's log), for lines that carry no program."""
    line = line.rstrip("\r\n")[:MAX_LINE]
    if not line.strip() or line.startswith("-- "):
        return None
    cli = _cli_message(line)
    if cli is not None:
        return DaemonRecord(CONTAINER_CLI, _cap(cli), "", _stamp(line, year), line_no)
    m = _FM_FILE.match(line)
    if m is not None:
        t = _fm_time(m.group("ts"))
        return DaemonRecord(FABRICMANAGER, _cap(m.group("msg")), m.group("level"), t, line_no)
    for rx, kind in _JOURNAL:
        m = rx.match(line)
        if m is None:
            continue
        own = _PROGRAMS.get(m.group("tag"))
        if own is None:
            return None  # systemd's, the kernel's, another program's line
        t = _iso_time(m.group("ts")) if kind == "iso" else _short(m.group("ts"), year)
        return DaemonRecord(own, _cap(m.group("msg").strip()), "", t, line_no)
    m = _TAG_ONLY.match(line)
    own = _PROGRAMS.get(m.group("tag")) if m is not None else None
    if m is not None and own is not None:
        return DaemonRecord(own, _cap(m.group("msg").strip()), "", None, line_no)
    if emitter is not None and emitter != CONTAINER_CLI:
        return DaemonRecord(emitter, _cap(line.rstrip()), "", None, line_no)
    return None


def parse_daemon_log(
    text: str, emitter: str | None = None, year: int | None = None
) -> list[DaemonRecord]:
    """Every record of these emitters in ``text`` (any of the shapes above, mixed)."""
    out: list[DaemonRecord] = []
    for n, line in enumerate(text.splitlines(), start=1):
        rec = parse_line(line, emitter, year, n)
        if rec is not None:
            out.append(rec)
    return out


def classify(rec: DaemonRecord) -> tuple[str | None, Message | None]:
    """(the code the record's message says, the catalog entry): the entry's code; None
    for a benign entry or a record that is no error; UNCLASSIFIED_ERROR for an error that
    no entry knows."""
    msg = lookup((rec.emitter,), rec.message)
    if msg is not None:
        return (None, msg) if msg.code == BENIGN else (msg.code, msg)
    if is_error(rec):
        return UNCLASSIFIED, None
    return None, None


def is_error(rec: DaemonRecord) -> bool:
    if rec.level:
        return rec.level.upper() in _ERROR_LEVELS
    if rec.emitter == CONTAINER_CLI:
        return True  # the CLI prints only when it refuses the container
    return _FAILED.search(rec.message) is not None


class Reader:
    """Records to ``daemon_logs.error`` events; the unclassified messages of each emitter
    are tallied (deduplicated, counted, bounded) as the kernel's are."""

    def __init__(self) -> None:
        self._tally = Tally()

    def events(self, records: list[DaemonRecord], source: str, default_t: float) -> list[Event]:
        out: list[Event] = []
        for rec in records:
            code, msg = classify(rec)
            if code is None:
                continue
            fields: dict[str, object] = {
                "emitter": rec.emitter,
                "diagnosis": code,
                "diagnoses": [code],  # explain shows a finding the events of its own code
                "message": rec.message[:200],
                "source": source,
            }
            if msg is not None:
                fields["matched"] = msg.text  # the catalog entry (rules may tell entries apart)
            if rec.level:
                fields["level"] = rec.level
            elif msg is not None and msg.level:
                fields["level"] = msg.level
            if code == UNCLASSIFIED:
                quoted, more = self._tally.add(NODE, rec.emitter, rec.message)
                fields.update(messages=quoted, more=more)
            if rec.line:
                fields["line"] = rec.line
            t = rec.t if rec.t is not None else default_t
            out.append(Event(STREAM, NODE, t, fields, rec.message))
        return out


def _cli_message(line: str) -> str | None:
    """The CLI's message in a line, without the engine's wrapping; None when the line has
    none. No regex runs past the stage word: the unwrapping is a linear strip."""
    at = line.find(CLI_MARK)
    if at < 0:
        return None
    msg = line[at + len(CLI_MARK) :]
    if _CLI_STAGE.match(msg) is None:
        return None
    while True:
        before = msg
        msg = msg.rstrip(_WRAP_CHARS)
        if msg.endswith(": unknown"):
            msg = msg[: -len(": unknown")]
        elif msg.endswith("\\n"):  # an escaped newline ("\\n", as runc quotes stderr)
            msg = msg[:-1]
        if msg == before:
            return msg


def _cap(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT]


def _stamp(line: str, year: int | None) -> float | None:
    for rx, kind in _JOURNAL:
        m = rx.match(line)
        if m is not None:
            return _iso_time(m.group("ts")) if kind == "iso" else _short(m.group("ts"), year)
    m = re.match(_ISO_TS, line)
    return _iso_time(m.group("ts")) if m else None


def _short(ts: str, year: int | None) -> float | None:
    return _short_time(ts, year if year is not None else datetime.now(UTC).year)


def _fm_time(ts: str) -> float | None:
    # the log's local time without a zone; bundles are taken to be UTC (docs/xid.md)
    try:
        return datetime.strptime(
            " ".join(ts.split()) + " +0000", "%b %d %Y %H:%M:%S %z"
        ).timestamp()
    except ValueError:
        return None
