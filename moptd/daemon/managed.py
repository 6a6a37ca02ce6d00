"""The managed serving process belongs to the daemon.

``collectors.serving.managed`` names a server moptd runs itself. Only the daemon builds
its supervisor (the child-process or the systemd backend), starts it in ``Daemon.run()``,
restarts it on an API call and stops it on the way out. The serving collector gets a
read-only ``SupervisorView`` of it. Every one-shot path (``status --offline``,
``explain``, ``doctor``, ``record``) runs collectors only, so none of them can start it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from moptd.collectors.serving import ServingCollector, targets
from moptd.config import Config
from moptd.observations import Batch, Event
from moptd.serving.spec import Managed
from moptd.serving.supervisor import Supervisor
from moptd.serving.systemd import SystemdSupervisor

log = logging.getLogger(__name__)


class SupervisorView:
    """What the serving collector may see of the supervisor (collectors.serving.ManagedView)."""

    def __init__(self, supervisor: Supervisor | SystemdSupervisor) -> None:
        self._supervisor = supervisor

    @property
    def subject(self) -> str:
        return self._supervisor.subject

    @property
    def pid(self) -> int | None:
        return self._supervisor.pid

    @property
    def version(self) -> str:
        return self._supervisor.log_state.version

    async def refresh(self) -> None:
        await self._supervisor.refresh()

    def fill(self, batch: Batch, now: float) -> None:
        self._supervisor.fill(batch, now)

    def note_healthy(self) -> None:
        self._supervisor.log_state.started = True


class ManagedProcess:
    """The supervisor of the managed serving process, and the daemon's hold on it."""

    def __init__(
        self, spec: Managed, publish: Callable[[list[Event]], None], state_dir: Path
    ) -> None:
        self.spec = spec
        self.supervisor: Supervisor | SystemdSupervisor
        if spec.backend == "systemd":
            self.supervisor = SystemdSupervisor(spec, publish)
        else:
            self.supervisor = Supervisor(spec, publish, state_dir / "serving" / spec.name)
        self.view = SupervisorView(self.supervisor)
        self.not_ready = ""  # why a remedy holds readiness off; "" while it does not
        self.drained = False  # an operator's drain (moptd serving drain): until undone

    async def start(self) -> None:
        try:
            await self.supervisor.start()
        except Exception:  # the daemon goes on; the collector shows the supervisor's state
            log.exception("serving %s: the supervisor did not start", self.spec.name)

    async def stop(self) -> None:
        try:
            await self.supervisor.stop()
        finally:
            self.supervisor.close()

    # --- remedies (moptd.daemon.remediation is their one caller) ---

    @property
    def started_at(self) -> float | None:
        """When the running engine started; None when it is not running or not known
        (the systemd backend does not say)."""
        if self.supervisor.pid is None:
            return None
        started = getattr(self.supervisor, "started_at", None)
        return float(started) if isinstance(started, int | float) else None

    async def restart_with(self, args: tuple[str, ...], env: Mapping[str, str]) -> list[str]:
        """Restart the engine, with a changed setting when given; what changed."""
        changed: list[str] = []
        if args or env:
            if not isinstance(self.supervisor, Supervisor):
                raise RemedyRefused("restart_with needs the process backend, not systemd")
            changed = self.supervisor.amend(args, env)
        await self.supervisor.restart()
        return changed

    def readiness_off(self, why: str) -> None:
        """Fail /v1/serving/<name>/ready so a balancer stops sending traffic."""
        self.not_ready = why

    def readiness_on(self) -> None:
        self.not_ready = ""

    def drain(self, on: bool) -> None:
        """An operator's drain: readiness off until undone, whatever a remedy does."""
        if on != self.drained:
            log.warning(
                "serving %s: %s by an operator", self.spec.name, "drained" if on else "undrained"
            )
        self.drained = on

    def ready(self) -> tuple[bool, str]:
        """The readiness a balancer reads: off while an operator drains the engine, while a
        remedy holds it off, or while the engine is not running."""
        if self.drained:
            return False, "drained by an operator (moptd serving drain --undo lets it go)"
        if self.not_ready:
            return False, self.not_ready
        state = str(self.supervisor.status().get("state", ""))
        if state != "running":
            return False, f"the engine is {state or 'not running'}"
        return True, "running"


class RemedyRefused(Exception):
    """A remedy that cannot be done on this engine; the audit records it as failed."""


def managed_process(
    config: Config,
    collector: ServingCollector | None,
    publish: Callable[[list[Event]], None],
) -> ManagedProcess | None:
    """The managed process the configuration names, watched by the serving collector; None
    without one, or with the serving collector off. A wrong configuration starts nothing
    (the collector reports the same error as its own failure)."""
    if collector is None:
        return None
    try:
        _, spec = targets(collector.ctx.options)
    except ValueError as exc:  # SpecError is one too
        log.error("managed serving process not started: %s", exc)
        return None
    if spec is None:
        return None
    managed = ManagedProcess(spec, publish, config.state_dir)
    collector.watch_managed(managed.view)
    return managed
