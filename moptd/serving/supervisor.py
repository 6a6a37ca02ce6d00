"""The managed serving process: gates, start, stop, restart with back-off, crash loops.

Any exit moptd did not ask for is a failure, status 0 included: vLLM's API server can
exit 0 after its engine core died (vllm#48966). The process runs in its own session so a
stop reaches the whole group (API server, engine core, workers): SIGTERM, then SIGKILL
after the grace period. Its output goes through a bounded ring and the log parsers; the
records are published as events as they come.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from moptd.observations import Batch, Event
from moptd.serving import orphan
from moptd.serving.gates import GateResult, refusal_events
from moptd.serving.logparse import LogState
from moptd.serving.logring import LineSplitter, LogRing
from moptd.serving.logsource import fill_managed, log_events
from moptd.serving.prestart import prestart_gates
from moptd.serving.spec import Managed

log = logging.getLogger(__name__)

LOG_FILE_MAX = 16 << 20  # the on-disk copy rotates to .1 at this size
STOP_SETTLE = 2.0  # seconds stop() lets the supervision loop finish before cancelling it

Publish = Callable[[list[Event]], None]


def backoff_delay(failures: int, initial: float, maximum: float) -> float:
    """initial, 2x, 4x ... capped; ``failures`` counts the failures in a row (>= 1)."""
    if failures <= 0:
        return 0.0
    return float(min(maximum, initial * (2 ** min(failures - 1, 30))))


class Supervisor:
    def __init__(
        self,
        spec: Managed,
        publish: Publish,
        log_dir: Path | None = None,
        gates: Callable[[Managed], list[GateResult]] = prestart_gates,
    ) -> None:
        self.spec = spec
        self.subject = f"serving:{spec.name}"
        self.publish = publish
        self.gates = gates
        self.ring = LogRing(spec.log_lines)
        self.log_state = LogState()
        self.log_path = spec.log_file or (log_dir / "log.txt" if log_dir else None)
        self._record_dir = log_dir  # where the record of the started process is kept
        self.state = "stopped"  # stopped|gated|starting|running|backoff|crash_loop|stopping
        self.reason = ""
        self.pid: int | None = None
        self.started_at: float | None = None
        self.restarts = 0
        self.failures_in_row = 0
        self.last_exit: dict[str, object] = {}
        self.last_gates: list[GateResult] = []
        self._failure_times: deque[float] = deque(maxlen=max(1, spec.crash_loop_count))
        self._stopping = False
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"moptd-serving-{spec.name}"
        )
        self._log_fh: Any = None

    # --- control ---

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._stopping = False
            self.state = "starting"
            self._task = asyncio.create_task(self._run(), name=f"serving-{self.spec.name}")

    async def stop(self) -> None:
        """Stop the process (whole group) and the supervision loop."""
        self._stopping = True
        self._wake.set()
        await self._terminate()
        if self._task is not None:
            # The loop ends by itself once the watcher has seen the pipe close and
            # published the exit; cancelled before that, the exit event was lost.
            await asyncio.wait({self._task}, timeout=STOP_SETTLE)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.state = "stopped"
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    async def restart(self) -> None:
        """Operator restart: not a failure, and it clears a crash loop."""
        self.failures_in_row = 0
        self._failure_times.clear()
        if self._proc is not None and self._proc.returncode is None:
            self._restart_requested = True
            await self._terminate()
        self._wake.set()
        if self._task is None or self._task.done():
            await self.start()

    def amend(self, args: tuple[str, ...], env: Mapping[str, str]) -> list[str]:
        """A remedy's changed setting (remediation restart_with), in force from the next
        start until moptd restarts: the arguments not already in the command are added, the
        variables set. Returns what changed, for the audit."""
        added = [a for a in args if a not in self.spec.command]
        changed = [f"{k}={v}" for k, v in env.items() if self.spec.env.get(k) != v]
        if added or changed:
            self.spec = dataclasses.replace(
                self.spec,
                command=(*self.spec.command, *added),
                env={**self.spec.env, **env},
            )
        return added + changed

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- the loop ---

    _restart_requested = False

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self.state = "starting"
            results = await loop.run_in_executor(self._executor, self._checks)
            self.last_gates = results
            failed = [g for g in results if not g.ok]
            if failed:
                self.state, self.reason = "gated", "; ".join(g.reason for g in failed)
                now = time.time()
                self.publish(refusal_events(self.subject, failed, now))
                log.warning("serving %s not started: %s", self.spec.name, self.reason)
                self.failures_in_row += 1
                await self._sleep(
                    backoff_delay(
                        self.failures_in_row, self.spec.backoff_initial, self.spec.backoff_max
                    )
                )
                continue
            try:
                await self._spawn()
            except OSError as exc:
                # A command that does not exist or cannot run: a failure like a crash.
                self.reason = f"cannot start {self.spec.command[0]}: {exc.strerror or exc}"
                log.warning("serving %s: %s", self.spec.name, self.reason)
                self._exit_event(None, None, expected=False, detail=self.reason)
                if not await self._after_failure():
                    return
                continue
            expected = await self._watch()
            if self.stopping():
                return
            if expected:
                continue  # an operator restart
            if self.spec.restart == "never":
                self.state = "stopped"
                return
            if not await self._after_failure():
                return

    def _checks(self) -> list[GateResult]:
        # an orphan an earlier moptd left is stopped first (or refuses the start)
        refused = orphan.orphan_gate(self._record_dir, self.spec.stop_grace)
        return refused or self.gates(self.spec)

    def stopping(self) -> bool:
        return self._stopping

    async def _after_failure(self) -> bool:
        """Count the failure; back off; False when a crash loop stops the restarts."""
        now = time.time()
        self._failure_times.append(now)
        self.failures_in_row += 1
        n = self.spec.crash_loop_count
        if (
            len(self._failure_times) >= n
            and now - self._failure_times[0] <= self.spec.crash_loop_window
        ):
            self.state = "crash_loop"
            self.reason = (
                f"{n} failures within {self.spec.crash_loop_window:g}s; "
                "not restarting (moptd serving restart clears it)"
            )
            log.error("serving %s: %s", self.spec.name, self.reason)
            return False
        delay = backoff_delay(
            self.failures_in_row, self.spec.backoff_initial, self.spec.backoff_max
        )
        self.state = "backoff"
        await self._sleep(delay)
        if not self._stopping:
            self.restarts += 1
        return not self._stopping

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _spawn(self) -> None:
        env = dict(os.environ)
        env.update(self.spec.env)
        kwargs: dict[str, Any] = {}
        if self.spec.user is not None:
            kwargs["user"] = self.spec.user
        self._proc = await asyncio.create_subprocess_exec(
            *self.spec.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stop reaches every child
            preexec_fn=orphan.die_with_parent(),  # no server outlives a SIGKILLed moptd
            **kwargs,
        )
        # pid and start time together, before any await: a remedy asked for in between
        # would find the engine running with no start time and be refused for good
        # ("start time is unknown" has no retry)
        self.pid = self._proc.pid
        self.started_at = time.time()
        if self._record_dir is not None:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, orphan.write_record, self._record_dir, self.pid
            )
        self.log_state = LogState()
        self.state = "running"
        self.reason = ""
        log.info("serving %s started, pid %d", self.spec.name, self.pid)

    async def _watch(self) -> bool:
        """Follow the output until the process exits; True when the exit was asked for."""
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        splitter = LineSplitter()
        while True:
            chunk = await proc.stdout.read(65536)
            if not chunk:
                break
            self._lines(splitter.feed(chunk))
        self._lines(splitter.flush())
        rc = await proc.wait()
        self._kill_group(signal.SIGKILL)  # children left behind by a dead leader
        if self._record_dir is not None:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, orphan.clear_record, self._record_dir
            )
        expected = self._stopping or self._restart_requested
        self._restart_requested = False
        sig = -rc if rc < 0 else None
        self._exit_event(rc if rc >= 0 else None, sig, expected)
        ran = time.time() - (self.started_at or time.time())
        if not expected and ran >= self.spec.healthy_after:
            self.failures_in_row = 0
        self.pid = None
        self._proc = None
        if not expected:
            self.reason = f"exited with status {rc}" if rc >= 0 else f"killed by signal {sig}"
            log.warning("serving %s %s (not asked to stop)", self.spec.name, self.reason)
        return expected

    def _exit_event(
        self, rc: int | None, sig: int | None, expected: bool, detail: str = ""
    ) -> None:
        fields: dict[str, object] = {
            "exit_code": -1 if rc is None else rc,
            "signal": sig or 0,
            "expected": expected,
        }
        self.last_exit = dict(fields, t=time.time(), detail=detail)
        self.publish([Event("serving.process_exit", self.subject, time.time(), fields, detail)])

    def _lines(self, lines: list[str]) -> None:
        if not lines:
            return
        now = time.time()
        # vLLM prints EngineDeadError while it shuts down on request
        events = log_events(
            lines,
            now,
            self.subject,
            self.ring,
            self.log_state,
            lambda _: self._stopping or self._restart_requested,
        )
        if events:
            self.publish(events)
        self._write_log(lines)

    def _write_log(self, lines: list[str]) -> None:
        if self.log_path is None:
            return
        try:
            if self._log_fh is None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                # the server's log may show prompts: 0640, not whatever the umask allows
                fd = os.open(
                    self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640
                )
                self._log_fh = os.fdopen(fd, "a", encoding="utf-8")
            self._log_fh.write("".join(line + "\n" for line in lines))
            self._log_fh.flush()
            if self._log_fh.tell() > LOG_FILE_MAX:
                self._log_fh.close()
                self._log_fh = None
                self.log_path.replace(self.log_path.with_suffix(".txt.1"))
        except OSError as exc:
            log.warning("serving %s: cannot write %s: %s", self.spec.name, self.log_path, exc)
            self.log_path = None

    async def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        self.state = "stopping"
        self._kill_group(signal.SIGTERM)
        try:
            async with asyncio.timeout(self.spec.stop_grace):
                await proc.wait()
        except TimeoutError:
            log.warning(
                "serving %s ignored SIGTERM for %gs; SIGKILL", self.spec.name, self.spec.stop_grace
            )
            self._kill_group(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await proc.wait()

    def _kill_group(self, sig: int) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    # --- what the collector reports ---

    async def refresh(self) -> None:
        """Nothing to ask: the child's state is known here."""

    def status(self) -> dict[str, object]:
        return {
            "name": self.spec.name,
            "backend": "process",
            "state": self.state,
            "reason": self.reason,
            "pid": self.pid,
            "started_at": self.started_at,
            "restarts": self.restarts,
            "failures_in_row": self.failures_in_row,
            "last_exit": self.last_exit,
            "gates": [
                {"check": g.check, "ok": g.ok, "code": g.code, "reason": g.reason}
                for g in self.last_gates
            ],
            "log_lines": len(self.ring),
            "log_lines_dropped": self.ring.dropped,
        }

    def fill(self, batch: Batch, now: float) -> None:
        s = self.subject
        fill_managed(batch, s, self.pid, self.state, self.log_state, self.spec.command, now)
        batch.add("serving.restarts", s, float(self.restarts))
        if not self.log_state.cuda_graphs and "--enforce-eager" in self.spec.command:
            batch.add("serving.cuda_graphs_enabled", s, 0.0)
        batch.describe(
            s,
            managed="process",
            state=self.state,
            reason=self.reason,
            pid=str(self.pid or ""),
            version=self.log_state.version,
        )
