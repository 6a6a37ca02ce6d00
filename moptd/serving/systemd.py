"""The systemd backend: the serving process runs as ``moptd-serving@NAME.service``.

The unit (systemd/moptd-serving@.service) keeps the server in its own sandbox and
restarts it on any exit; moptd writes its environment file, runs the gates, starts and
stops it through systemctl, reads its state with ``systemctl show`` and follows its log
in the journal through the same parsers as the child-process backend.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import grp
import json
import logging
import math
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from moptd.observations import Batch, Event
from moptd.proc.listeners import port_held_by_unit
from moptd.serving.gates import GateResult, refusal_events
from moptd.serving.logparse import LogState
from moptd.serving.logring import LogRing
from moptd.serving.logsource import (
    JournalTail,
    fill_managed,
    journal_follow_argv,
    log_events,
)
from moptd.serving.prestart import prestart_gates
from moptd.serving.spec import Managed, unit_name

log = logging.getLogger(__name__)

# In moptd's own StateDirectory: the unit's ProtectSystem=strict keeps /etc read-only
# for moptd, and systemd (root) reads EnvironmentFile= before it drops privileges, so
# the file need not be readable by moptd-serving (it may hold tokens).
ENV_DIR = Path("/var/lib/moptd/serving")
# The unit is up or on its way up: moptd adopts it instead of starting it.
ADOPT_STATES = ("active", "activating", "reloading")
SHOW_PROPERTIES = (
    "ActiveState",
    "SubState",
    "MainPID",
    "NRestarts",
    "ExecMainStatus",
    "ExecMainCode",
    "Result",
    "ExecMainStartTimestamp",
)


def systemctl_argv(action: str, name: str) -> list[str]:
    """start | stop | restart | reset-failed | show."""
    unit = unit_name(name)
    if action == "show":
        return [
            "systemctl",
            "show",
            unit,
            "--property=" + ",".join(SHOW_PROPERTIES),
            "--timestamp=unix",  # ExecMainStartTimestamp=@1796190620
        ]
    if action in ("start", "restart"):
        # --no-block: model loading takes minutes; the state comes from `show` later
        return ["systemctl", action, "--no-block", unit]
    if action in ("stop", "reset-failed"):
        return ["systemctl", action, unit]
    raise ValueError(f"unknown systemctl action {action!r}")


def journal_argv(name: str, follow: bool = True, lines: int = 0) -> list[str]:
    return journal_follow_argv(unit_name(name), follow, lines)


def follow_argv(name: str, since: float, boot: str | None = None) -> list[str]:
    """The unit's journal from `since` (unix seconds) on, followed. `since` is the running
    invocation's start when moptd adopts the unit (a restarted moptd still sees the
    start-up lines: the version, the KV-cache size), and the moment before `systemctl
    start` otherwise, so no line printed before the follow begins is lost. short-unix
    keeps each line's journal time, so a line printed while moptd was down is an event
    of that time, not of now.

    `boot` is the journal's own current boot id (newest_boot_id): journalctl --follow
    shows nothing at all when the boot id this process sees in /proc differs from the
    journal's, which is what moptd's sandbox gets inside systemd-nspawn (its
    ProtectKernelTunables= / ProtectControlGroups= remount /proc/sys, and the container's
    own boot_id over-mount is lost: measured in tests/test_nspawn_systemd.py)."""
    argv = ["journalctl", "--unit", unit_name(name)]
    if boot:
        argv.append(f"--boot={boot}")
    argv += ["--since", f"@{since:.6f}", "--output", "short-unix", "--quiet", "--no-pager"]
    return [*argv, "--follow"]


def split_short_unix(line: str) -> tuple[float, str] | None:
    """``1796190620.529576 HOST IDENT[PID]: MESSAGE`` -> (time, MESSAGE); None for a line
    without that shape (journalctl's own ``-- ... --`` markers)."""
    stamp, _, rest = line.partition(" ")
    try:
        t = float(stamp)
    except ValueError:
        return None
    if not math.isfinite(t):
        return None
    _host, _, rest = rest.partition(" ")
    _ident, sep, message = rest.partition(": ")
    if not sep:
        return None
    return t, message


BOOT_ID_ARGV = ["journalctl", "--lines", "1", "--output", "json", "--no-pager", "--quiet"]


def newest_boot_id(json_line: str) -> str | None:
    """_BOOT_ID of the journal's newest entry (BOOT_ID_ARGV's output): the running boot,
    read from the journal itself rather than from /proc."""
    try:
        entry = json.loads(json_line.strip().splitlines()[-1]) if json_line.strip() else {}
    except ValueError:
        return None
    boot = entry.get("_BOOT_ID") if isinstance(entry, dict) else None
    if isinstance(boot, str) and len(boot) == 32 and all(c in "0123456789abcdef" for c in boot):
        return boot
    return None


def start_time(show: dict[str, str]) -> float | None:
    """ExecMainStartTimestamp=@SECONDS (systemctl show --timestamp=unix), else None."""
    value = show.get("ExecMainStartTimestamp", "")
    if not value.startswith("@"):
        return None
    try:
        t = float(value[1:])
    except ValueError:
        return None
    return t if math.isfinite(t) and t > 0 else None


def render_env_file(m: Managed) -> str:
    """/etc/moptd/serving/NAME.env: SERVING_CMD and the server's environment. The unit
    runs ``exec $SERVING_CMD`` through sh, which splits on blanks without honouring
    quotes, so an argument with a blank cannot be passed this way."""
    for arg in m.command:
        if any(c.isspace() for c in arg) or "'" in arg or '"' in arg:
            raise ValueError(
                f"command argument {arg!r}: the systemd backend cannot pass blanks or quotes"
            )
    lines = ["# written by moptd from collectors.serving.managed; edits are overwritten"]
    lines.append("SERVING_CMD=" + " ".join(m.command))
    for key, value in sorted(m.env.items()):
        lines.append(f"{key}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def parse_show(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


class SystemdSupervisor:
    def __init__(
        self,
        spec: Managed,
        publish: Callable[[list[Event]], None],
        env_dir: Path = ENV_DIR,
        gates: Callable[[Managed], list[GateResult]] = prestart_gates,
        run: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
    ) -> None:
        self.spec = spec
        self.subject = f"serving:{spec.name}"
        self.publish = publish
        self.env_dir = env_dir
        self.gates = gates
        self.run = run or _run
        self.ring = LogRing(spec.log_lines)
        self.log_state = LogState()
        self.state = "stopped"
        self.reason = ""
        self.pid: int | None = None
        self.show: dict[str, str] = {}
        self.last_gates: list[GateResult] = []
        self._journal: JournalTail | None = None
        self.journal_problem = ""
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"moptd-serving-{spec.name}"
        )

    async def _blocking(self, fn: Callable[..., object], *args: object) -> object:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def start(self) -> None:
        await self.refresh()
        active = self.show.get("ActiveState", "")
        if active in ADOPT_STATES:
            # moptd restarted while its unit runs: the pre-start gates are for a server
            # that is not running yet; its port and GPU memory are its own now.
            log.info(
                "serving %s: %s is %s (pid %s); following it",
                self.spec.name,
                unit_name(self.spec.name),
                active,
                self.pid,
            )
            await self._follow_journal(start_time(self.show) or time.time())
            return
        results = await self._blocking(self._gates_with_own_port)
        assert isinstance(results, list)
        self.last_gates = results
        failed = [g for g in results if not g.ok]
        if failed:
            self._refuse(failed)
            return
        try:
            await self._blocking(self._write_env)
        except OSError as exc:
            path = self.env_dir / f"{self.spec.name}.env"
            reason = f"cannot write {path}: {exc.strerror or exc}"
            self._refuse([GateResult("env_file", False, "", reason)])
            return
        since = time.time()
        r = await self._blocking(self.run, systemctl_argv("start", self.spec.name))
        assert isinstance(r, subprocess.CompletedProcess)
        if r.returncode != 0:
            detail = (r.stderr or r.stdout).strip()[:500] or f"exit status {r.returncode}"
            reason = f"systemctl start {unit_name(self.spec.name)} failed: {detail}"
            self._refuse([GateResult("systemctl", False, "", reason)])
            return
        self.state = "starting"
        await self._follow_journal(since)

    def _gates_with_own_port(self) -> list[GateResult]:
        """The gates, except that a port held by the unit itself is no conflict: a unit
        still stopping (KillMode=mixed gives it TimeoutStopSec=) holds it a while, and
        systemd queues the start behind the stop."""
        unit = unit_name(self.spec.name)
        out: list[GateResult] = []
        for g in self.gates(self.spec):
            if g.code == "PORT_CONFLICT" and port_held_by_unit(self.spec.port, unit):
                g = GateResult("port", True, "", f"port {self.spec.port} is held by {unit}")
            out.append(g)
        return out

    def _refuse(self, failed: list[GateResult]) -> None:
        """Not started, and it shows: the state, the reason, one serving.gate event per
        cause and an error in the log. Never a silent "stopped"."""
        self.state, self.reason = "gated", "; ".join(g.reason for g in failed)
        self.publish(refusal_events(self.subject, failed, time.time()))
        log.error("serving %s not started: %s", self.spec.name, self.reason)

    def _write_env(self) -> None:
        self.env_dir.mkdir(parents=True, exist_ok=True)
        path = self.env_dir / f"{self.spec.name}.env"
        tmp = path.with_suffix(".env.tmp")
        # created 0640 (the environment may hold tokens), never briefly under the umask
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(render_env_file(self.spec))
        os.chmod(tmp, 0o640)  # O_CREAT's mode is masked by the umask; this is not
        tmp.replace(path)

    async def _follow_journal(self, since: float) -> None:
        problem = journal_access_problem()
        if problem:
            self.journal_problem = problem
            log.error("serving %s: %s", self.spec.name, problem)
        boot: str | None = None
        try:
            r = await self._blocking(self.run, BOOT_ID_ARGV)
            assert isinstance(r, subprocess.CompletedProcess)
            boot = newest_boot_id(r.stdout)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("serving %s: journalctl: %s", self.spec.name, exc)
        self._journal = JournalTail(
            follow_argv(self.spec.name, since, boot),
            self._on_lines,
            f"serving {self.spec.name}",
        )
        await self._journal.start()

    def _on_lines(self, lines: list[str], now: float) -> None:
        events: list[Event] = []
        for line in lines:
            parsed = split_short_unix(line)
            if parsed is None:
                continue  # journalctl's own markers, not the server's output
            t, message = parsed
            events += log_events(
                [message],
                min(t, now),
                self.subject,
                self.ring,
                self.log_state,
                lambda st: self.state == "stopping" or st.shutting_down,
            )
        if events:
            self.publish(events)

    async def stop(self) -> None:
        """Stop following; the unit keeps running (it is not moptd's child)."""
        if self._journal is not None:
            await self._journal.stop()

    async def stop_unit(self) -> None:
        self.state = "stopping"
        await self._blocking(self.run, systemctl_argv("stop", self.spec.name))

    async def restart(self) -> None:
        await self._blocking(self.run, systemctl_argv("reset-failed", self.spec.name))
        await self._blocking(self.run, systemctl_argv("restart", self.spec.name))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def refresh(self) -> None:
        try:
            r = await self._blocking(self.run, systemctl_argv("show", self.spec.name))
        except OSError as exc:
            self.reason = f"systemctl: {exc}"
            return
        assert isinstance(r, subprocess.CompletedProcess)
        self.show = parse_show(r.stdout)
        pid = self.show.get("MainPID", "0")
        self.pid = int(pid) if pid.isdigit() and pid != "0" else None
        active = self.show.get("ActiveState", "")
        if self.show.get("Result") == "start-limit-hit":
            self.state = "crash_loop"
        elif active == "active":
            self.state = "running"
        elif active in ("activating", "deactivating"):
            self.state = {"activating": "starting", "deactivating": "stopping"}[active]
        elif active in ("failed", "inactive") and self.state != "gated":
            # a refusal keeps its state and reason: an inactive unit is what it causes
            self.state = active

    def fill(self, batch: Batch, now: float) -> None:
        s = self.subject
        fill_managed(batch, s, self.pid, self.state, self.log_state, self.spec.command, now)
        restarts = self.show.get("NRestarts", "")
        if restarts.isdigit():
            batch.add("serving.restarts", s, float(restarts))
        batch.describe(
            s,
            managed="systemd",
            unit=unit_name(self.spec.name),
            state=self.state,
            reason=self.reason,
            pid=str(self.pid or ""),
            version=self.log_state.version,
        )

    def status(self) -> dict[str, object]:
        return {
            "name": self.spec.name,
            "backend": "systemd",
            "unit": unit_name(self.spec.name),
            "state": self.state,
            "reason": self.reason,
            "pid": self.pid,
            "systemd": dict(self.show),
            "journal_problem": self.journal_problem,
            "gates": [
                {"check": g.check, "ok": g.ok, "code": g.code, "reason": g.reason}
                for g in self.last_gates
            ],
        }


JOURNAL_READERS = ("systemd-journal", "adm", "wheel")  # journalctl(1): groups that see all


def journal_access_problem() -> str:
    """Why journalctl would show this process none of the serving unit's lines, or ""."""
    if os.geteuid() == 0:
        return ""
    mine = {os.getegid(), *os.getgroups()}
    for name in JOURNAL_READERS:
        try:
            if grp.getgrnam(name).gr_gid in mine:
                return ""
        except KeyError:
            continue
    return (
        "cannot read the serving unit's journal: not root and in none of the groups "
        f"{', '.join(JOURNAL_READERS)}, so its log-based signals stay empty "
        "(the shipped moptd.service sets SupplementaryGroups=systemd-journal)"
    )


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
