"""Serving collector: engine /metrics, probes, and what the managed serving process shows.

Endpoints come from ``collectors.serving.endpoints`` and from the managed process
(``collectors.serving.managed``). One failed endpoint marks only its own scrape failed
(``serving.up`` 0); the other endpoints and the collector go on. The generation probe
runs beside the collection passes, so an engine that hangs on it does not delay them.

The collector only reads. The daemon runs the managed process (moptd/daemon/managed.py)
and hands the collector a ``ManagedView`` of it; a one-shot collection (``status
--offline``, ``explain``, ``doctor``) has none, and still scrapes the managed endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol
from urllib.parse import urlsplit

if TYPE_CHECKING:  # annotations only: configuration loading need not load aiohttp
    import aiohttp

from moptd.collector import (
    Collector,
    CollectorContext,
    Option,
    OptionError,
    Unavailable,
)
from moptd.durations import parse_duration
from moptd.loopback import is_loopback
from moptd.observations import Batch, Event, labels_of
from moptd.serving import gates, proctree
from moptd.serving.engines import ENGINES, EngineView, add_running_totals, read_page
from moptd.serving.http import FetchError, new_session, request
from moptd.serving.logsource import LogFollower, fill_log_state
from moptd.serving.probes import ProbeResult, probe_generate, probe_health, probe_models
from moptd.serving.promtext import PromLimitError, PromParseError, ScrapeLimits
from moptd.serving.signals import (
    MAX_ENVIRON_BYTES,
    HistogramWindow,
    cuda_environ,
    fill_engine_gpus,
    fill_view,
)
from moptd.serving.spec import (
    Endpoint,
    Managed,
    SpecError,
    model_of,
    parse_endpoints,
    parse_managed,
)


@dataclass
class _EndpointState:
    window: HistogramWindow | None = None
    failures: int = 0
    over_limit: int = 0  # scrapes refused for a scrape limit
    running_totals: dict[str, float] = field(default_factory=dict)  # an engine's per-read counts
    model: str = ""
    generate: ProbeResult | None = None
    generate_task: asyncio.Task[ProbeResult] | None = None
    generate_at: float = 0.0
    # a scrape whose collect() timed out may still be mapping its page in the thread
    reading: threading.Lock = field(default_factory=threading.Lock)


class ManagedView(Protocol):
    """The managed serving process as the collector may see it: what it reports, never a
    way to start, stop or restart it."""

    @property
    def subject(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def version(self) -> str:
        """The server version its log announced; "" until it did."""
        ...

    async def refresh(self) -> None:
        """Read the process's state where it is not known in-process (systemctl show)."""
        ...

    def fill(self, batch: Batch, now: float) -> None:
        """The process's own signals: up, starting, restarts, crash loop, log state."""
        ...

    def note_healthy(self) -> None:
        """/health answered: the server is up even if its log never says it listens
        (SGLang, TRT-LLM)."""
        ...


def targets(options: Mapping[str, Any]) -> tuple[list[Endpoint], Managed | None]:
    """The configured endpoints and the managed process. SpecError names a wrong key;
    ValueError when one name is both an endpoint and the managed process."""
    endpoints = parse_endpoints(options.get("endpoints", []))
    managed = parse_managed(options.get("managed") or None)
    if managed is not None and managed.name in {e.name for e in endpoints}:
        raise ValueError(f"serving name {managed.name!r} is both an endpoint and managed")
    return endpoints, managed


def _check(parse: Callable[[Any, str], object]) -> Callable[[Any], None]:
    """A config-time check: the same parser the collector uses, its errors keyed below the
    option so the config loader can name the file line."""

    def check(value: Any) -> None:
        try:
            parse(value, "")
        except SpecError as exc:
            raise OptionError(exc.key, str(exc).split(": ", 1)[-1]) from None

    return check


_LIMITS = ScrapeLimits()  # the defaults


def _check_endpoints(value: Any) -> None:
    _check(parse_endpoints)(value)
    for i, ep in enumerate(parse_endpoints(value, "")):
        host = urlsplit(ep.url).hostname or ""
        if not is_loopback(host):
            # the trust model (docs/security.md): pages and probe answers come from this
            # host's own engines; another host's would be input from the network
            raise OptionError(
                f"[{i}].url", f"must be a loopback URL (127.0.0.1, ::1, localhost), not {ep.url!r}"
            )


class ServingCollector(Collector):
    name = "serving"
    default_interval = 5.0
    default_timeout = 10.0
    options: ClassVar[Mapping[str, Option]] = {
        "endpoints": Option(
            list,
            [],
            "Serving endpoints to scrape and probe: a list of {name, url, engine "
            f"({', '.join(ENGINES)}), probes (health, models, generate), model, metrics_path}}.",
            check=_check_endpoints,
        ),
        "managed": Option(
            dict,
            {},
            "The serving process moptd runs itself: {name, engine, command, env, user, host, "
            "port, model_dir, device (gpu, cpu), min_free_gpu_memory, probes, backend "
            "(process, systemd), restart, backoff_initial, backoff_max, crash_loop_count, "
            "crash_loop_window, stop_grace, log_lines, log_file}. See docs/serving.md.",
            check=_check(parse_managed),
        ),
        "scrape_timeout": Option((int, float), 3.0, "Seconds for one /metrics scrape."),
        "max_response_bytes": Option(int, 8 << 20, "Largest /metrics body accepted."),
        "quantile_window": Option((int, float, str), "5m", "Window of the latency quantiles."),
        # Prometheus's scrape limits: a page past one fails its scrape (serving.up 0) and
        # counts in moptd_serving_scrapes_over_limit_total.
        "sample_limit": Option(
            int, _LIMITS.sample_limit, "Most samples one /metrics page may hold."
        ),
        "label_limit": Option(int, _LIMITS.label_limit, "Most labels one sample may carry."),
        "label_name_length_limit": Option(
            int, _LIMITS.label_name_length_limit, "Longest label name, in characters."
        ),
        "label_value_length_limit": Option(
            int, _LIMITS.label_value_length_limit, "Longest label value, in characters."
        ),
    }

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.endpoints: list[Endpoint] = []
        self.managed: Managed | None = None
        self.managed_view: ManagedView | None = None
        self._state: dict[str, _EndpointState] = {}
        self._session: aiohttp.ClientSession | None = None
        self._cpu = proctree.BusiestCpu()
        self._model_files: tuple[float, gates.ModelFiles | None] = (0.0, None)
        self._followers: list[LogFollower] = []
        self._limits = ScrapeLimits()

    def _publish(self, events: list[Event]) -> None:
        self.ctx.publish(events)

    def watch_managed(self, view: ManagedView) -> None:
        """The daemon runs the managed process; from now on its signals come with ours."""
        self.managed_view = view

    async def start(self) -> None:
        # SpecError names the key; the runtime reports it as this collector's failure.
        self.endpoints, self.managed = targets(
            {key: self.option(key) for key in ("endpoints", "managed")}
        )
        for e in self.endpoints:
            if e.log_file or e.journal_unit:
                follower = LogFollower(
                    f"serving:{e.name}",
                    self._publish,
                    Path(e.log_file) if e.log_file else None,
                    e.journal_unit or None,
                )
                await follower.start()
                self._followers.append(follower)
        if self.managed is not None:
            self.endpoints.append(self.managed.endpoint())
        self._limits = ScrapeLimits(*(int(self.option(key)) for key in ScrapeLimits._fields))

    async def stop(self) -> None:
        for st in self._state.values():
            if st.generate_task is not None:
                st.generate_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await st.generate_task
        for follower in self._followers:
            await follower.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None
        await super().stop()

    def window(self) -> float:
        return parse_duration(self.option("quantile_window"))

    async def collect(self) -> Batch:
        if not self.endpoints:
            raise Unavailable("no serving endpoint configured (collectors.serving.endpoints)")
        if self._session is None:
            self._session = new_session()
        now = time.time()
        batches = await asyncio.gather(*(self._endpoint(ep, now) for ep in self.endpoints))
        out = Batch()
        for b in batches:
            out.extend(b)
        for follower in self._followers:
            if follower.file is not None:
                follower.feed(await self.blocking(follower.read_file), now)
            fill_log_state(out, follower.subject, follower.state, now)
        view = self.managed_view
        if view is not None:
            await view.refresh()
            view.fill(out, now)
            if view.pid is not None:
                cpu = await self.blocking(proctree.group_cpu, self.ctx.procfs, view.pid)
                share = self._cpu.update(now, cpu)
                if share is not None:
                    out.add("serving.busiest_process_cpu", view.subject, share)
                environ = await self.blocking(_environ, self.ctx.procfs, view.pid)
                fill_engine_gpus(out, view.subject, [view.pid, *cpu], environ)
        if self.managed is not None:
            await self._model_files_of(self.managed, out, now)
        return out

    async def _model_files_of(self, m: Managed, out: Batch, now: float) -> None:
        subject = f"serving:{m.name}"
        model_dir = m.model_dir or (Path(p) if (p := model_of(m.command)) else None)
        if model_dir is None:
            return
        checked, files = self._model_files
        if files is None or now - checked > 60:
            files = await self.blocking(_scan, model_dir)
            self._model_files = (now, files)
        if files is not None:
            out.add("serving.model_tokenizer_present", subject, float(files.has_tokenizer))
            out.add("serving.model_unsafe_weights", subject, float(files.unsafe_only))

    async def _endpoint(self, ep: Endpoint, now: float) -> Batch:
        b = Batch()
        s = f"serving:{ep.name}"
        st = self._state.setdefault(ep.name, _EndpointState())
        assert self._session is not None
        view, filled, error, seconds, over_limit = await self._scrape(ep, s, st, now)
        if view is None:
            st.failures += 1
        st.over_limit += over_limit
        b.add("serving.up", s, 0.0 if view is None else 1.0)
        b.add("serving.scrape_duration", s, seconds)
        b.add("serving.scrape_failures", s, float(st.failures))
        b.add("serving.scrapes_over_limit", s, float(st.over_limit))
        b.describe(s, endpoint=ep.url, engine=ep.engine, scrape_error=error)
        # +Inf, -Inf and NaN from an engine are no measurement: absent, not values (a KV
        # cache "inf full" fired KV_CACHE_PRESSURE; issue 30, item 8)
        filled.samples = [x for x in filled.samples if _finite(x.value)]
        b.extend(filled)
        await self._probes(b, s, ep, st, now)
        mv = self.managed_view
        version = mv.version if mv is not None and mv.subject == s else ""
        b.add(
            "serving.info",
            s,
            1.0,
            labels_of(engine=ep.engine, version=version, model=st.model, endpoint=ep.url),
        )
        return b

    async def _scrape(
        self, ep: Endpoint, s: str, st: _EndpointState, now: float
    ) -> tuple[EngineView | None, Batch, str, float, bool]:
        """The page's view and its samples, or None with the error; the seconds it took;
        whether a scrape limit refused it."""
        assert self._session is not None
        t0 = time.monotonic()
        limit = float(self.option("scrape_timeout"))
        try:
            r = await request(
                self._session,
                "GET",
                ep.url + ep.metrics_path,
                deadline=limit,
                max_bytes=int(self.option("max_response_bytes")),
            )
            if r.status != 200:
                raise FetchError(f"{ep.url}{ep.metrics_path}: HTTP {r.status}")
            if not r.body.strip():
                # Every engine's page carries at least its process series: an empty 200 is a
                # broken server or proxy, not a page that happens to say nothing.
                raise FetchError(f"{ep.url}{ep.metrics_path}: empty body")
            # A valid page near the size cap takes a second to parse: off the event loop,
            # so the daemon's own /metrics and API answer meanwhile; and so is the mapping
            # onto samples (a hostile page's thousand lines cost a millisecond there too).
            # One endpoint's state is only touched by its own scrape, one at a time.
            view, filled = await asyncio.to_thread(self._read, ep, r.body, s, st, now)
        except (FetchError, PromParseError, ValueError) as exc:
            # UnicodeDecodeError and JSON errors are ValueErrors too
            over = isinstance(exc, PromLimitError)
            return None, Batch(), str(exc)[:300], time.monotonic() - t0, over
        return view, filled, "", time.monotonic() - t0, False

    def _read(
        self, ep: Endpoint, body: bytes, s: str, st: _EndpointState, now: float
    ) -> tuple[EngineView, Batch]:
        view = _engine_view(ep, body, self._limits)
        filled = Batch()
        with st.reading:
            add_running_totals(ep.engine, view, st.running_totals)
            self._fill(filled, s, st, view, now)
        return view, filled

    def _fill(self, b: Batch, s: str, st: _EndpointState, view: EngineView, now: float) -> None:
        if view.model:
            st.model = view.model
        if st.window is None:
            st.window = HistogramWindow(self.window())
        fill_view(b, s, view, st.window, now)

    async def _probes(self, b: Batch, s: str, ep: Endpoint, st: _EndpointState, now: float) -> None:
        assert self._session is not None
        limit = float(self.option("scrape_timeout"))
        results: list[ProbeResult] = []
        if "health" in ep.probes:
            results.append(await probe_health(self._session, ep.url, limit))
        if "models" in ep.probes:
            r = await probe_models(self._session, ep.url, limit)
            if r.models and not st.model:
                st.model = r.models[0]
            results.append(r)
        if "generate" in ep.probes:
            task = st.generate_task
            if task is not None and task.done():
                st.generate = None if task.cancelled() else task.result()
                st.generate_task = None
            model = ep.model or st.model
            if st.generate_task is None and model and now - st.generate_at >= ep.generate_every:
                st.generate_at = now
                st.generate_task = asyncio.create_task(
                    probe_generate(self._session, ep.url, model, ep.generate_deadline)
                )
            if st.generate is not None:
                results.append(st.generate)
        for r in results:
            lab = labels_of(probe=r.probe)
            b.add("serving.probe_success", s, 1.0 if r.ok else 0.0, lab)
            b.add("serving.probe_latency", s, r.seconds, lab)
            if r.probe == "health":
                b.add("serving.healthy", s, 1.0 if r.ok else 0.0)
                mv = self.managed_view
                if r.ok and mv is not None and mv.subject == s:
                    mv.note_healthy()
            if not r.ok:
                b.describe(s, **{f"probe_{r.probe}_error": r.detail[:300]})


def _engine_view(ep: Endpoint, body: bytes, limits: ScrapeLimits) -> EngineView:
    return read_page(ep.engine, ep.metrics_path, body, limits)


def _environ(procfs: Path, pid: int) -> dict[str, str] | None:
    """The CUDA variables of the engine's environment as it started (None: unreadable)."""
    try:
        with open(procfs / str(pid) / "environ", "rb") as fh:
            return cuda_environ(fh.read(MAX_ENVIRON_BYTES))
    except OSError:
        return None


def _scan(path: Path) -> gates.ModelFiles | None:
    try:
        return gates.scan_model_dir(path)
    except OSError:
        return None


def _finite(value: object) -> bool:
    return not isinstance(value, float) or math.isfinite(value)
