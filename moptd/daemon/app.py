"""Wires the daemon together and runs it until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import time
from pathlib import Path

from aiohttp import web

from moptd import safefs
from moptd.clock import SystemClock
from moptd.collectors import registry
from moptd.collectors.serving import ServingCollector
from moptd.config import Config, ConfigError, load_config, split_listen
from moptd.daemon import sdnotify
from moptd.daemon.api import make_api_app
from moptd.daemon.assemble import build_collectors as build_collectors
from moptd.daemon.assemble import make_runtime as make_runtime
from moptd.daemon.auth import ApiAuth, load_token
from moptd.daemon.exporter import MetricsEndpoint
from moptd.daemon.heap import freeze_start_up_heap
from moptd.daemon.http import CAP, CappedSite, capped_app, make_runner
from moptd.daemon.managed import ManagedProcess, managed_process
from moptd.daemon.remediation import Remediator
from moptd.daemon.runtime import CollectorRuntime
from moptd.daemon.socket_group import give_to_group
from moptd.daemon.statelock import StateDirBusy, lock_state_dir
from moptd.daemon.webconfig import BasicAuth, WebConfig, load_web_config
from moptd.diagnose.service import RuleService
from moptd.findings.db import FILE_NAME, FindingsDB
from moptd.findings.service import Diagnosis
from moptd.proc.listeners import describe_holders
from moptd.store import SignalStore

log = logging.getLogger(__name__)


# Signal namespaces each collector provides; while a collector is unavailable or failing,
# rules over its namespaces see *unknown*, not an empty (healthy-looking) store.
NAMESPACES: dict[str, tuple[str, ...]] = {"nvml": ("gpu", "process"), "host": ("node",)}


def missing_namespaces(runtime: CollectorRuntime) -> frozenset[str]:
    out: set[str] = set()
    for name, health in runtime.health.items():
        if health.state in ("unavailable", "failed", "pending"):
            out.update(NAMESPACES.get(name, (name,)))
    return frozenset(out)


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.clock = SystemClock()
        self.store = SignalStore(
            self.clock,
            retention=config.retention,
            max_points=config.max_points,
            max_events=config.max_events,
            max_series=config.max_series,
        )
        self.runtime = make_runtime(config, self.store)
        # Built here, started only by run(): the serving collector just watches it.
        self.managed: ManagedProcess | None = managed_process(
            config, _serving_collector(self.runtime), self.runtime.publish
        )
        self.rules = RuleService(
            self.store, self.clock, config.rule_paths, tick_budget=config.rule_tick_budget
        )
        db = FindingsDB(config.state_dir / FILE_NAME)
        for collector, _, _ in self.runtime.collectors.values():
            collector.ctx.positions = db  # the kernel log's place, committed with its events
        # Ticks the rules (every rule_interval, and at once when an event arrives), keeps
        # every transition and event in state_dir/findings.db, feeds /v1/events.
        self.diagnosis = Diagnosis(
            self.store,
            self.rules,
            db,
            interval=config.rule_interval,
            before_tick=self._set_missing,
        )
        # acts on findings as remediation: says (off by default); the one actuator
        self.remediator = Remediator(config.remediation, self.managed, self.diagnosis, self.store)
        self._reload: asyncio.Task[None] | None = None
        self._reload_wanted = False
        self.started = time.time()
        self._runners: list[web.AppRunner] = []
        self._stop = asyncio.Event()
        self._web: WebConfig | None = None
        self._lock: int | None = None  # the state directory's lock, held while running
        self._socket_bound = False
        self._auth: ApiAuth | None = None  # its token is read again on SIGHUP

    def _set_missing(self) -> None:
        self.rules.missing = missing_namespaces(self.runtime)

    def _sighup(self) -> None:
        # The same reload as POST /v1/rules/reload (Diagnosis.reload). A storm of signals
        # coalesces: while a reload runs, further signals ask for one more, which reads the
        # files as they are after the last signal.
        self._reload_wanted = True
        if self._reload is None or self._reload.done():
            self._reload = asyncio.ensure_future(self._reload_rules())

    async def _reload_rules(self) -> None:
        while self._reload_wanted:
            self._reload_wanted = False
            try:
                await self.diagnosis.reload()
            except Exception:
                log.exception("rule reload failed; the rules in force stay")
            await self._reload_policy()
            await self._reload_token()

    async def _reload_token(self) -> None:
        """SIGHUP reads api.token_file again: a rotated token takes effect without a restart
        (an unreadable file refuses TCP requests until fixed, as at start)."""
        if self._auth is not None and self.config.api_token_file is not None:
            self._auth.token = await asyncio.to_thread(load_token, self.config.api_token_file)

    async def _reload_policy(self) -> None:
        """SIGHUP reads the remediation policy again (the rest of the file needs a restart);
        a file that does not load keeps the policy in force."""
        if self.config.source == "<defaults>":
            return
        try:
            config = await asyncio.to_thread(load_config, Path(self.config.source), registry())
        except ConfigError as exc:
            log.error("remediation policy not reloaded, the one in force stays: %s", exc)
            return
        if config.remediation != self.remediator.policy:
            self.remediator.set_policy(config.remediation)

    async def run(self) -> int:
        if self.config.exporter_web_config is not None:
            # as node_exporter: a broken web configuration stops the start, never falls
            # back to plain, unauthenticated HTTP
            try:
                self._web = load_web_config(self.config.exporter_web_config)
            except ConfigError as exc:
                log.error("exporter.web_config_file: %s", exc)
                return 2
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._sighup)
        if self.rules.errors and not self.rules.ruleset.rules:
            log.error(
                "rules not loaded (%d errors); running without rules until they are fixed "
                "and reloaded with SIGHUP",
                len(self.rules.errors),
            )
        try:
            safefs.ensure_private_dir(self.config.state_dir, 0o750)
            if not os.access(self.config.state_dir, os.W_OK):
                raise OSError(30, "not writable (a read-only file system?)")
        except OSError as exc:
            # A read-only remount (ext4 errors=remount-ro) or a file where the directory
            # should be: exactly when a monitor is needed. Serve anyway; the findings
            # database says itself that it runs in memory (/v1/health degraded).
            log.error(
                "state directory %s is not usable (%s): running without it; findings are "
                "kept in memory and lost at a restart until it is fixed",
                self.config.state_dir,
                exc.strerror or exc,
            )
        try:
            self._lock = lock_state_dir(self.config.state_dir)
        except StateDirBusy as exc:
            log.error("%s", exc)
            return 1
        await self.diagnosis.start()
        await self.remediator.start()
        # Before listening: the first scrape names every collector (pending until it has
        # started and run), not the 0-2 that had started when the port opened (issue 34).
        self.runtime.register()
        try:
            await self._serve()
        except ListenError as exc:
            log.error("%s", exc)
            await self.remediator.stop()
            await self._shutdown()
            await self.diagnosis.stop()
            return 1
        except OSError as exc:
            log.error("cannot listen: %s", exc)
            await self.remediator.stop()
            await self._shutdown()
            await self.diagnosis.stop()
            return 1
        if self.managed is not None:
            await self.managed.start()
        await self.runtime.start()
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    await self.runtime.first_pass.wait()
            freeze_start_up_heap()
            sdnotify.notify("READY=1\nSTATUS=collecting")
            log.info("moptd running: %d collectors", len(self.runtime.collectors))
            await self._stop.wait()
        finally:
            sdnotify.notify("STOPPING=1")
            log.info("moptd stopping")
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            await self.remediator.stop()
            await self.runtime.stop()
            if self.managed is not None:
                await self.managed.stop()
            await self._shutdown()
            await self.diagnosis.stop()
        return 0

    async def _watchdog(self) -> None:
        interval = sdnotify.watchdog_interval()
        if interval is None:
            return
        # Ping only while collection makes progress, so a wedged loop gets restarted.
        last_runs = -1
        while True:
            await asyncio.sleep(interval)
            runs = sum(h.runs for h in self.runtime.health.values())
            if runs != last_runs:
                sdnotify.notify("WATCHDOG=1")
                last_runs = runs

    async def _serve(self) -> None:
        cfg = self.config
        if cfg.exporter_listen:
            app = capped_app()
            app.router.add_get("/metrics", MetricsEndpoint(self.store).handle)
            app.router.add_get("/", _landing)
            web_cfg = self._web
            if web_cfg is not None and web_cfg.users:
                app.middlewares.append(BasicAuth(web_cfg.users).middleware)
            runner = make_runner(app)
            await runner.setup()
            self._runners.append(runner)
            host, port = split_listen(cfg.exporter_listen)
            tls = web_cfg.ssl_context if web_cfg is not None else None
            try:
                await CappedSite(runner, app[CAP], host=host, port=port, ssl=tls).start()
            except OSError as exc:
                raise ListenError(
                    listen_problem(cfg, "exporter.listen", cfg.exporter_listen, exc)
                ) from exc
            log.info(
                "exporter listening on %s://%s/metrics%s",
                "https" if tls else "http",
                cfg.exporter_listen,
                " (basic auth)" if web_cfg is not None and web_cfg.users else "",
            )
        auth = self._auth = ApiAuth(cfg.api_group, load_token(cfg.api_token_file))
        api_app = make_api_app(
            self.store,
            self.runtime,
            self.started,
            self.diagnosis,
            auth,
            self.managed,
            self.remediator,
        )
        api = make_runner(api_app)
        await api.setup()
        self._runners.append(api)
        sock = cfg.api_socket
        try:
            safefs.ensure_dir(sock.parent, 0o755 if sock.parent != cfg.state_dir else 0o750)
            safefs.remove_stale_socket(sock)
        except OSError as exc:
            # never delete or re-mode what is not moptd's: the socket API stays off, the
            # rest (the exporter, a TCP API) serves
            log.error("API socket not started: %s", exc)
        else:
            await CappedSite(api, api_app[CAP], path=str(sock)).start()
            self._socket_bound = True
            os.chmod(sock, cfg.api_socket_mode)
            if cfg.api_group:
                problem = give_to_group(sock, cfg.api_group)
                if problem is not None:
                    log.warning("%s", problem)
            log.info("API listening on %s", sock)
        if cfg.api_listen:
            host, port = split_listen(cfg.api_listen)
            # a budget of its own: a crowd on the port must not take the socket's room
            tcp_cap = api_app[CAP].for_listener()
            try:
                await CappedSite(api, tcp_cap, host=host, port=port).start()
            except OSError as exc:
                raise ListenError(listen_problem(cfg, "api.listen", cfg.api_listen, exc)) from exc
            log.info("API listening on http://%s/v1/", cfg.api_listen)

    async def _shutdown(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self._socket_bound:
            # ours (bound by this run): a stale socket left behind reads as a daemon running
            with contextlib.suppress(OSError):
                safefs.remove_stale_socket(self.config.api_socket)
            self._socket_bound = False


class ListenError(Exception):
    """moptd cannot listen on a configured TCP address; the text says which and why."""


def listen_problem(cfg: Config, key: str, value: str, exc: OSError) -> str:
    """What stops moptd from listening, for the log: the address, the configuration key
    and where it was set, and, when the port is taken, who holds it."""
    where = "the default" if cfg.source == "<defaults>" else f"set in {cfg.source}"
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    text = f"cannot listen on {value} ({key}, {where}): {reason}"
    if exc.errno == errno.EADDRINUSE:
        _, port = split_listen(value)
        text += f"; the port is {describe_holders(port)}"
        text += f". Stop that process, or set {key} to a free host:port"
    return text


def _serving_collector(runtime: CollectorRuntime) -> ServingCollector | None:
    entry = runtime.collectors.get("serving")
    return entry[0] if entry and isinstance(entry[0], ServingCollector) else None


async def _landing(request: web.Request) -> web.Response:
    return web.Response(text="moptd: metrics at /metrics\n")


def run_daemon(config: Config) -> int:
    return asyncio.run(Daemon(config).run())
