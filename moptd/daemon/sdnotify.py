"""systemd integration: notifications (READY, WATCHDOG, STOPPING) and journal priorities.

Notifications go through systemd-python (the ``systemd`` extra) when it is importable and
otherwise through a standard-library sender: one datagram to $NOTIFY_SOCKET, where an
abstract socket name starts with '@'. Both read the same environment, so behaviour does not
depend on which one is installed.
"""

from __future__ import annotations

import datetime as dt
import importlib
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import TextIO

from moptd.termsafe import escape_text

log = logging.getLogger(__name__)


def _load_systemd_notify() -> Callable[[str], bool] | None:
    try:
        # Imported by name: the extra is optional and ships no type information.
        daemon = importlib.import_module("systemd.daemon")
    except ImportError:
        return None
    send = daemon.notify

    def notify(state: str) -> bool:
        # sd_notify's errors arrive as OSError (a socket nobody listens on); like the
        # fallback, a lost notification must never stop the daemon.
        try:
            return bool(send(state))
        except OSError as exc:
            log.debug("sd_notify %r failed: %s", state, exc)
            return False

    return notify


_systemd_notify = _load_systemd_notify()


def backend() -> str:
    """Which sender is in use: "systemd-python" or "stdlib"."""
    return "systemd-python" if _systemd_notify is not None else "stdlib"


def notify(state: str) -> bool:
    """Send one notification; False when not run under systemd or the send failed."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return False
    if _systemd_notify is not None:
        return _systemd_notify(state)
    return notify_stdlib(state)


def notify_stdlib(state: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        # A lost notification must never stop the daemon; systemd will time it out.
        log.debug("sd_notify %r failed: %s", state, exc)
        return False
    return True


def watchdog_interval() -> float | None:
    """Half the watchdog period systemd asked for, or None when there is no watchdog."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None


# syslog priorities, as sd-daemon(3) "<N>" prefixes that journald turns into PRIORITY=.
_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def priority_of(levelno: int) -> int:
    for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= level:
            return _PRIORITY[level]
    return _PRIORITY[logging.DEBUG]


class EscapingFormatter(logging.Formatter):
    """A log record's message is one line with every control and bidi character escaped
    (moptd.termsafe): a kernel record or an engine's error quoted in it can neither move a
    terminal's cursor nor start a journal line of its own with a priority it chose
    (issue 30, item 4). A traceback keeps its newlines and nothing else."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_text(record.message, newline=False)
        return super().formatMessage(record)

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return escape_text(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return escape_text(super().formatStack(stack_info))


class JournalPrefixFormatter(EscapingFormatter):
    """Prefixes every line with "<N>" so journald records the level as the priority.

    Only for a stream connected to the journal (StandardError=journal): elsewhere the
    prefix would be noise. Multi-line messages (tracebacks) keep the priority on every
    line, since journald reads each line as a record.
    """

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{priority_of(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


def stream_is_journal(stream: TextIO = sys.stderr) -> bool:
    """True when `stream` is the journal stream systemd handed us ($JOURNAL_STREAM)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    try:
        st = os.fstat(stream.fileno())
        return (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError, AttributeError):
        return False


class TimestampFormatter(EscapingFormatter):
    """Starts every record with its time, RFC 3339 with milliseconds and the UTC offset
    (2026-12-05T13:02:32.123+00:00): `docker logs`, a terminal or a file redirect carry no
    time of their own, and a log line without one cannot be put beside a kernel or an
    engine log. Under journald the journal stamps each line instead."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        when = dt.datetime.fromtimestamp(record.created, dt.UTC).astimezone()
        return when.isoformat(timespec="milliseconds")


def log_formatter(fmt: str, stream: TextIO = sys.stderr) -> logging.Formatter:
    """The formatter for the daemon's log stream: with priorities under journald, with a
    timestamp anywhere else."""
    if stream_is_journal(stream):
        return JournalPrefixFormatter(fmt)
    return TimestampFormatter("%(asctime)s " + fmt)
