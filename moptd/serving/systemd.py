"""The systemd backend: the serving process runs as ``moptd-serving@NAME.service``.

The unit (systemd/moptd-serving@.service) keeps the server in its own sandbox and
restarts it on any exit; moptd writes its environment file, runs the gates, starts and
stops it through systemctl, reads its state with ``systemctl show`` and follows its log
in the journal through the same parsers as the child-process backend.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from moptd.observations import Batch, Event
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
from moptd.serving.spec import Managed

log = logging.getLogger(__name__)

ENV_DIR = Path("/etc/moptd/serving")
SHOW_PROPERTIES = (
    "ActiveState",
    "SubState",
    "MainPID",
    "NRestarts",
    "ExecMainStatus",
    "ExecMainCode",
    "Result",
)


def unit_name(name: str) -> str:
    return f"moptd-serving@{name}.service"


def systemctl_argv(action: str, name: str) -> list[str]:
    """start | stop | restart | reset-failed | show."""
    unit = unit_name(name)
    if action == "show":
        return ["systemctl", "show", unit, "--property=" + ",".join(SHOW_PROPERTIES)]
    if action in ("start", "restart"):
        # --no-block: model loading takes minutes; the state comes from `show` later
        return ["systemctl", action, "--no-block", unit]
    if action in ("stop", "reset-failed"):
        return ["systemctl", action, unit]
    raise ValueError(f"unknown systemctl action {action!r}")


def journal_argv(name: str, follow: bool = True, lines: int = 0) -> list[str]:
    return journal_follow_argv(unit_name(name), follow, lines)


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
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"moptd-serving-{spec.name}"
        )

    async def _blocking(self, fn: Callable[..., object], *args: object) -> object:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def start(self) -> None:
        results = await self._blocking(self.gates, self.spec)
        assert isinstance(results, list)
        self.last_gates = results
        failed = [g for g in results if not g.ok]
        if failed:
            self.state, self.reason = "gated", "; ".join(g.reason for g in failed)
            now = time.time()
            self.publish(refusal_events(self.subject, failed, now))
            return
        await self._blocking(self._write_env)
        await self._blocking(self.run, systemctl_argv("start", self.spec.name))
        self.state = "starting"
        await self._follow_journal()

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

    async def _follow_journal(self) -> None:
        self._journal = JournalTail(
            journal_argv(self.spec.name), self._on_lines, f"serving {self.spec.name}"
        )
        await self._journal.start()

    def _on_lines(self, lines: list[str], now: float) -> None:
        events = log_events(
            lines,
            now,
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
        elif active in ("activating", "deactivating", "failed", "inactive"):
            self.state = {"activating": "starting", "deactivating": "stopping"}.get(active, active)

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
            "gates": [
                {"check": g.check, "ok": g.ok, "code": g.code, "reason": g.reason}
                for g in self.last_gates
            ],
        }


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
