"""The host-side NVIDIA daemons' logs: nvidia-fabricmanager's and nvidia-persistenced's
journals, Fabric Manager's own log file, and nvidia-container-cli's errors as the container
engines' journals carry them (issue 29). Parsed by moptd.kernel.daemon_log into
``daemon_logs.error`` events: a catalogued message's code, or UNCLASSIFIED_ERROR quoting
an error record no catalog entry knows.

Live, ``journalctl -u UNIT -o short-iso`` runs on the collector's thread (never on the
loop): the whole boot on the first pass (its last ``max_lines``), then after the cursor the
pass before ended at. The log file is read from where the last pass stopped (from its last
``max_bytes`` the first time; from the start again when it was replaced or truncated).
Over a bundle (``recorded``), the Source answers the same journalctl calls from the
bundle's files (moptd.bundle.sources) and ``fabricmanager_log`` names the bundle's copy.

A source that cannot be read is said: without journalctl, or when journalctl cannot read a
journal (none kept, none mounted under the host root), the collector is unavailable with the
reason (`moptd status`; the rules read its namespace as unknown); a journalctl that does not
answer, or a log file that exists but cannot be read, fails the pass with the reason. Never
an empty all-clear. A log file that does
not exist is a host without Fabric Manager (or one that logs to the journal only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

from moptd.collector import Collector, CollectorContext, Option, OptionError, Unavailable
from moptd.kernel.daemon_log import (
    CONTAINER_CLI,
    FABRICMANAGER,
    PERSISTENCED,
    Reader,
    parse_daemon_log,
)
from moptd.observations import Batch

UNIT_EMITTER = {
    "nvidia-fabricmanager": FABRICMANAGER,
    "nvidia-persistenced": PERSISTENCED,
}
FABRICMANAGER_LOG = "/var/log/fabricmanager.log"  # Fabric Manager User Guide: LOG_FILE_NAME
CURSOR_MARK = "-- cursor: "
JOURNAL_TIMEOUT = 15.0


def journal_argv(units: Sequence[str]) -> list[str]:
    """The first pass's call: this boot's records of ``units`` (what a bundle stands for)."""
    argv = ["journalctl"]
    for unit in units:
        argv += ["-u", unit]
    return [*argv, "-b", "-o", "short-iso", "--no-pager"]


def _no_entries(stdout: str, stderr: str) -> bool:
    """journalctl --show-cursor exits 1 when the unit has no record: that is an answer (the
    daemon logged nothing), unlike a journal that cannot be read (no files, no access)."""
    return stdout.strip() == "-- No entries --" and "journal" not in stderr.lower()


def _check_units(value: object) -> None:
    if not isinstance(value, list) or not all(isinstance(u, str) and u for u in value):
        raise OptionError("", "a list of systemd unit names")


class DaemonJournalCollector(Collector):
    name = "daemon_logs"
    default_interval = 30.0
    default_timeout = 20.0
    options: ClassVar[Mapping[str, Option]] = {
        "units": Option(
            list,
            list(UNIT_EMITTER),
            "The NVIDIA daemons' systemd units whose journals are read (journalctl -u).",
            _check_units,
        ),
        "container_units": Option(
            list,
            ["docker", "containerd"],
            "Container engines' units whose journal lines carrying nvidia-container-cli's "
            "errors are read (the rest of their lines is not).",
            _check_units,
        ),
        "fabricmanager_log": Option(
            str,
            FABRICMANAGER_LOG,
            "Fabric Manager's own log file (its config's LOG_FILE_NAME); under paths.host_root.",
        ),
        "max_lines": Option(int, 20000, "Journal lines read per unit on the first pass."),
        "max_bytes": Option(int, 4 << 20, "Bytes of the log file read on the first pass."),
    }

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.reader = Reader()
        self._cursors: dict[str, str] = {}
        self._file: tuple[int, int, int] | None = None  # (device, inode, offset read to)

    async def collect(self) -> Batch:
        return await self.blocking(self.read)

    def read(self) -> Batch:
        """One pass over the journals and the log file (blocking: the collector's thread)."""
        b = Batch()
        now = self.ctx.clock.now()
        year = datetime.fromtimestamp(now, UTC).year
        units = [u for u in self.option("units") if isinstance(u, str)]
        engines = [u for u in self.option("container_units") if isinstance(u, str)]
        for unit in units:
            recs = parse_daemon_log(self._journal([unit]), UNIT_EMITTER.get(unit), year)
            b.events.extend(self.reader.events(recs, f"journal:{unit}", now))
        if engines:
            # only nvidia-container-cli's lines: the engines' own records are not read
            recs = parse_daemon_log(self._journal(engines), None, year)
            recs = [r for r in recs if r.emitter == CONTAINER_CLI]
            b.events.extend(self.reader.events(recs, "journal:" + ",".join(engines), now))
        log = str(self.option("fabricmanager_log") or "")
        if log:
            recs = parse_daemon_log(self._read_file(self._log_path(log)), FABRICMANAGER, year)
            b.events.extend(self.reader.events(recs, log, now))
        return b

    def _log_path(self, log: str) -> Path:
        return Path(log) if self.ctx.recorded else self.ctx.host_path(log)

    def _journal(self, units: list[str]) -> str:
        argv = journal_argv(units)
        if self.ctx.recorded:
            source = self.ctx.source
            answer = source.run(argv) if source is not None else None
            return answer or ""
        return self._journalctl(",".join(units), argv)

    def _journalctl(self, key: str, argv: list[str]) -> str:
        exe = shutil.which("journalctl")
        if exe is None:
            raise Unavailable("journalctl not found: the NVIDIA daemons' journals cannot be read")
        cursor = self._cursors.get(key)
        args = [exe, *argv[1:], "--show-cursor"]
        if cursor:
            args = [a for a in args if a != "-b"] + ["--after-cursor", cursor]
        else:
            args += ["-n", str(int(self.option("max_lines")))]
        if self.ctx.host_root != Path("/"):
            args += ["-D", str(self.ctx.host_path("/var/log/journal"))]
        try:
            res = subprocess.run(
                args, capture_output=True, text=True, errors="replace",
                timeout=JOURNAL_TIMEOUT, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"journalctl -u {key}: no answer in {JOURNAL_TIMEOUT:g} s") from None
        if res.returncode != 0 and not _no_entries(res.stdout, res.stderr):
            # no journal here (none kept, not mounted under the host root, no access): the
            # source is unavailable, which `moptd status` shows with this reason and the
            # rules read as unknown, never as an empty (healthy) journal
            why = res.stderr.strip().splitlines()[-1:] or [f"exit status {res.returncode}"]
            raise Unavailable(f"journalctl -u {key}: {why[0][:200]}")
        lines = res.stdout.splitlines()
        if lines and lines[-1].startswith(CURSOR_MARK):
            self._cursors[key] = lines.pop()[len(CURSOR_MARK) :].strip()
        return "\n".join(lines)

    def _read_file(self, path: Path) -> str:
        """What the log file gained since the last pass ("" when it does not exist)."""
        try:
            with path.open("rb") as fh:
                st = os.fstat(fh.fileno())
                dev, ino, done = self._file or (st.st_dev, st.st_ino, -1)
                if (dev, ino) != (st.st_dev, st.st_ino) or done > st.st_size:
                    done = -1  # replaced (logrotate) or truncated: read it from the start
                start = done if done >= 0 else max(0, st.st_size - int(self.option("max_bytes")))
                fh.seek(start)
                data = fh.read(max(0, st.st_size - start))
                end = start + len(data)
        except FileNotFoundError:
            self._file = None
            return ""
        except OSError as exc:
            raise RuntimeError(f"cannot read {path}: {exc.strerror or exc}") from None
        if start > 0 and done < 0:  # the first pass began mid-file: drop the cut line
            data = data.split(b"\n", 1)[-1]
        self._file = (st.st_dev, st.st_ino, end)
        return data.decode("utf-8", "replace")
