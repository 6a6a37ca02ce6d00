"""NVML collector: per-GPU telemetry, compute processes and Xid events.

Readings come in five cost tiers (moptd/gpu/readings.py): static at start and
every ``static_interval``, slow every ``slow_interval``, costly (total energy and two
clock-event counters, 0.6-3 ms of CPU each) every ``costly_interval`` (total energy, the
dearest call, only every ``energy_interval``), profile (GPM
metrics between consecutive GPM samples, 1-3 ms) every ``profile_interval``, fast every
tick; each tier's age is exported as gpu.sample_age{tier}.
The GPUs are read one after another on one shared reader thread (one thread wake-up per
tick, not one per GPU: on the GPU host the wake-ups cost more CPU than the NVML calls),
under a per-GPU deadline. A GPU whose NVML call hangs (a GPU in recovery) holds up the
ones behind it for one deadline at most: it then keeps the stuck thread as its own, the
others move to a new shared thread, and from then on it is read alone. A hung GPU gets
gpu.nvml_error = 10 (NVML_ERROR_TIMEOUT) and is skipped until its call returns; a lost one
gets gpu.lost = 1.
Reads are pipelined: a tick reports the read the previous tick started (so fast values are
one interval old, as gpu.sample_age says) and starts the next one without waiting for it,
which saves an event-loop wake-up per tick (measured in 2026-11, kept in git history:
bench/results/h200x2-2026-11-29-b/pipelined_vs_waiting.txt).
NVML Xid events are read by a dedicated daemon thread and published as gpu.xid_event
events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from moptd.collector import Collector, CollectorContext, Option, Unavailable
from moptd.gpu.batch import (
    FastSamples,
    add_ages,
    add_ages_at,
    add_profile,
    add_slow,
    add_static,
    age_keys,
    new_sample,
)
from moptd.gpu.readings import (
    BackendUnavailable,
    FastReading,
    GpuBackend,
    GpuLost,
    NvmlCallError,
    ProfileReading,
    SlowReading,
    StaticReading,
    merge_costly,
)
from moptd.kernel.xid_tally import NVML, XidTally
from moptd.observations import NODE, Batch, Event, Labels, Sample, gpu_subject
from moptd.proc.info import ProcessInfo, process_info
from moptd.proc.pods import DEFAULT_ROOT as POD_LOG_DIR
from moptd.proc.pods import PodIndex
from moptd.worker import Worker

log = logging.getLogger(__name__)

NVML_ERROR_TIMEOUT = 10
XID_WAIT_MS = 1000  # how long one Xid wait blocks; stop() waits this long at most
NVML_ERROR_UNKNOWN = 999
DRIVER_SIGNS = (Path("/dev/nvidiactl"),)
TIERS = ("static", "fast", "slow", "costly", "energy", "profile")
_TIMED = ("static", "slow", "costly", "energy", "profile")  # the tiers with an interval option
_FAST_ONLY = ("fast",)
# Built once: every tick of every GPU sends them (the collector's own CPU is held to 1.5x
# the bare NVML reads, issue 32).
_INIT_OK = Sample("gpu.nvml_init_error", NODE, 0.0)
_QUEUED, _RUNNING, _DONE, _CANCELLED = 0, 1, 2, 3
_READ_STATE = threading.Lock()  # a _Read's state moves under it (thread and loop race)


class _Read:
    """One GPU's read handed to a reader thread: the part of concurrent.futures.Future the
    collector uses. A Future builds a Condition for each read and takes it, in Python, on
    every query; on the GPU host each line run after the idle second between ticks costs
    several times its cost in a loop, and the collector's own work is held to half the
    bare reads' (BENCHMARKS.md, "Issue 32, GPU part"). done() is true once finished or
    cancelled, as a Future's; only a queued read can be cancelled."""

    __slots__ = ("_on_done", "state", "value")

    def __init__(self) -> None:
        self.state = _QUEUED
        self.value: _Pass | None = None
        self._on_done: Callable[[object], None] | None = None

    def done(self) -> bool:
        return self.state >= _DONE

    def running(self) -> bool:
        return self.state == _RUNNING

    def cancelled(self) -> bool:
        return self.state == _CANCELLED

    def result(self) -> _Pass:
        assert self.value is not None, "read not finished"
        return self.value

    def start(self) -> bool:
        """The reader thread takes the read: False when it was cancelled meanwhile."""
        with _READ_STATE:
            if self.state != _QUEUED:
                return False
            self.state = _RUNNING
            return True

    def cancel(self) -> bool:
        with _READ_STATE:
            if self.state != _QUEUED:
                return False
            self.state = _CANCELLED
            call = self._on_done
        if call is not None:
            call(self)
        return True

    def finish(self, value: _Pass) -> None:
        with _READ_STATE:
            self.value = value
            self.state = _DONE
            call = self._on_done
        if call is not None:
            call(self)

    def add_done_callback(self, fn: Callable[[object], None]) -> None:
        with _READ_STATE:
            if self.state < _DONE:
                self._on_done = fn
                return
        fn(self)


@dataclass
class _GpuState:
    """What the collector remembers about one GPU between ticks."""

    static: StaticReading | None = None
    fast: FastReading | None = None
    slow: SlowReading | None = None
    costly: SlowReading | None = None
    profile: ProfileReading | None = None
    # The samples of the static, slow and profile readings, built once per new reading: they are
    # re-sent every tick (the store replaces a source's snapshot whole) but change rarely.
    static_batch: Batch = field(default_factory=Batch)
    slow_batch: Batch = field(default_factory=Batch)
    profile_batch: Batch = field(default_factory=Batch)
    read_at: dict[str, float] = field(default_factory=dict)  # tier -> time of last good read
    worker: Worker | None = None  # its own thread, once it has hung; else the shared one
    pending: _Read | None = None
    pending_since: float = 0.0  # when the pending read was started
    last: tuple[_Pass, float] | None = None  # the last finished read and when it started
    # What _report sends every tick, composed when a read changes it, not every tick:
    subject: str = ""
    fast_samples: FastSamples | None = None  # rebuilt where a fast value changed
    head: list[Sample] = field(default_factory=list)  # static samples and gpu.lost 0
    error: Sample | None = None  # gpu.nvml_error of the newest read
    tail: list[Sample] = field(default_factory=list)  # slow and profile samples
    attrs: dict[str, dict[str, str]] = field(default_factory=dict)  # of all three batches
    ages: tuple[tuple[str, Labels], ...] = ()  # the tiers read so far, for gpu.sample_age
    recheck_at: float = 0.0  # no tier but fast is due before this (see _due)


@dataclass(slots=True)
class _Pass:
    """The outcome of one read of one GPU (runs on that GPU's thread)."""

    static: StaticReading | None = None
    fast: FastReading | None = None
    slow: SlowReading | None = None
    costly: SlowReading | None = None
    profile: ProfileReading | None = None
    energy_read: bool = False  # the costly read included total energy
    error: int = 0
    lost: GpuLost | None = None


def _countdown(count: int) -> tuple[Callable[[object], None], asyncio.Future[None]]:
    """A done-callback for a tick's GPU reads, and a future it resolves when the last read
    finishes: one wake-up of the loop per tick instead of one per GPU (each costs a pipe
    write and an epoll return, which on the GPU host cost more CPU than the reads)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    left = [count]
    lock = threading.Lock()

    def resolve() -> None:
        if not done.done():
            done.set_result(None)

    def finished(_: object) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            try:
                loop.call_soon_threadsafe(resolve)
            except RuntimeError:  # a hung read returned after the loop closed
                pass

    return finished, done


class NvmlCollector(Collector):
    name = "nvml"
    default_interval = 1.0
    default_timeout = 5.0
    options: ClassVar[Mapping[str, Option]] = {
        "backend": Option(str, "live", "live (NVML) or recorded (replay `recording`)."),
        "pod_log_dir": Option(
            str,
            POD_LOG_DIR,
            "The kubelet's pod log directory, whose <namespace>_<pod>_<uid> entries name "
            "the pod of a process (its cgroup gives the UID); under paths.host_root.",
        ),
        "recording": Option(str, "", "Recording file for backend: recorded."),
        "replicate": Option(int, 1, "Recorded backend: present each recorded GPU N times."),
        "slow_interval": Option((int, float), 5.0, "Seconds between slow-tier reads."),
        "costly_interval": Option(
            (int, float),
            10.0,
            "Seconds between reads of the costly tier (the HW thermal and power-brake "
            "clock-event counters, one 0.6 ms call a GPU). Total energy is read with it "
            "every energy_interval.",
        ),
        # Total energy costs 3.1 ms a read on an H200 (bench/results/h200x1-2026-12-02) and
        # NVML has no cheaper call that gives the same value (fields 83 and 191 cost the
        # same; integrating power.draw is a different number). The bare amortised floor of
        # every other value at the default cadences is 303 µs a GPU a second (fast 23 µs
        # every 1 s, slow 1023 µs every 5 s, fields 270+271 633 µs every 10 s, static
        # 3741 µs every 300 s, same run). Energy every 60 s adds 3108 / 60 = 52 µs, 0.17 of
        # that floor: the amortised cost stays within 1.2x of it (every 10 s it was 2.0x).
        # The counter is cumulative, so a slower read loses no energy, only freshness.
        "energy_interval": Option(
            (int, float),
            60.0,
            "Seconds between reads of the total-energy counter (3 ms of CPU a GPU; read with "
            "the costly tier when due). 60 s keeps moptd's amortised NVML cost within 1.2x "
            "of the bare calls of every other value.",
        ),
        "profile_interval": Option(
            (int, float),
            5.0,
            "Seconds between reads of the profile tier (NVML GPM: SM, tensor, DRAM and pipe "
            "activity, PCIe and NVLink throughput, averaged over the interval; one GPM "
            "sample, 40-55 µs, and one metrics computation, 1-3 ms, a GPU). Only GPUs with "
            "GPM (Hopper and newer) pay the metrics computation.",
        ),
        "static_interval": Option((int, float), 300.0, "Seconds between static-tier reads."),
        "gpu_deadline": Option(
            (int, float), 2.0, "Seconds one GPU's read may take before it counts as hung."
        ),
        "xid_events": Option(bool, True, "Read NVML Xid events in a dedicated thread."),
    }

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.backend: GpuBackend | None = None
        self._ready = False
        self._gpus: dict[int, _GpuState] = {}
        self._procs: dict[int, ProcessInfo | None] = {}
        self._pods = PodIndex(lambda: self.ctx.host_path(str(self.option("pod_log_dir"))))
        self._procs_lock = threading.Lock()
        self._xid_thread: threading.Thread | None = None
        self.xids = ctx.xids if ctx.xids is not None else XidTally()
        self._stopping = threading.Event()
        self._shared: Worker | None = None  # reads every GPU that has not hung
        # Read once: collect() runs every second, cold, so each lookup it skips counts.
        self._every = {tier: float(self.option(f"{tier}_interval")) for tier in _TIMED}
        self._deadline = float(self.option("gpu_deadline"))
        self._slow_taken = True  # a slow read came in since processes were last pruned

    # --- backend ------------------------------------------------------------------------
    def make_backend(self) -> GpuBackend:
        # imported here: reading the configuration imports this module for its options,
        # and `moptd explain` must not load pynvml for that (BENCHMARKS.md, issue 31)
        kind = self.option("backend")
        if kind == "recorded":
            # and the recorded backend (nvidia-smi's XML parser with it) only for a recording
            from moptd.gpu.recorded import RecordedBackend

            path = self.option("recording")
            if not path:
                raise ValueError("collectors.nvml.recording must name a file for backend recorded")
            return RecordedBackend.from_file(Path(path), int(self.option("replicate")))
        if kind != "live":
            raise ValueError(f"collectors.nvml.backend: {kind!r} is not live or recorded")
        from moptd.gpu.backend import NvmlBackend

        return NvmlBackend()

    def _driver_present(self) -> bool:
        if (self.ctx.procfs / "driver" / "nvidia").exists():
            return True
        return any(p.exists() for p in DRIVER_SIGNS)

    async def _ensure_ready(self) -> GpuBackend:
        if self.backend is not None and self._ready:
            return self.backend
        if self.backend is None:
            self.backend = self.make_backend()
        backend = self.backend
        try:
            await self.blocking(backend.init)
        except BackendUnavailable as exc:
            if self._driver_present():
                raise RuntimeError(f"NVML init failed though a driver is present: {exc}") from None
            raise Unavailable(f"NVIDIA driver not loaded: {exc}") from None
        self._ready = True
        for i in range(backend.device_count()):
            if i not in self._gpus:
                self._gpus[i] = _GpuState(subject=gpu_subject(i), fast_samples=FastSamples(i))
        if self.option("xid_events") and self._xid_thread is None:
            self._start_xid_thread(backend)
        return backend

    async def start(self) -> None:
        try:
            await self._ensure_ready()
        except Unavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - retried on every collect
            log.warning("nvml: %s", exc)

    async def stop(self) -> None:
        self._stopping.set()
        hung = False
        for st in self._gpus.values():
            if st.pending is not None and not st.pending.done():
                hung = True
            if st.worker is not None:
                st.worker.shutdown()
                st.worker = None
        if self._shared is not None:
            self._shared.shutdown()
            self._shared = None
        if self._xid_thread is not None:
            # The Xid thread must be out of its wait before NVML frees the event set under
            # it; the wait returns within XID_WAIT_MS (or at once, where it can be woken).
            if self.backend is not None:
                self.backend.stop_waiting()
            await asyncio.to_thread(self._xid_thread.join, XID_WAIT_MS / 1000 + 1.0)
            if self._xid_thread.is_alive():
                log.info("nvml: the Xid wait did not return")
                hung = True
            self._xid_thread = None
        if self.backend is not None and self._ready and not hung:
            # NVML shutdown while a call hangs could block the daemon's exit; skip it then.
            await asyncio.to_thread(self.backend.shutdown)
        elif hung:
            log.info("nvml: a call is still hanging; not shutting NVML down")
        self._ready = False
        await super().stop()

    # --- collection ---------------------------------------------------------------------
    async def collect(self) -> Batch:
        backend = self.backend
        if backend is None or not self._ready:
            backend = await self._ensure_ready()
        now = self.ctx.clock.now()
        deadline = self._deadline
        batch = Batch()
        # NVML started (a failed start raises above): what a bundle reads from nvidia-smi's
        # own messages, so rule driver-nvml-init decides live as well
        batch.samples.append(_INIT_OK)
        # Pipelined: a tick reports the read started on the previous tick (long finished;
        # the age of each tier is exported) and starts the next read without waiting for
        # it. Waiting woke the event loop once more per tick, which cost more CPU than the
        # NVML calls themselves. Only a GPU that was never read is waited for, so the first
        # collection is complete.
        harvested: set[int] = set()
        overdue = False
        for index, st in self._gpus.items():
            pending = st.pending
            if pending is None:
                continue
            if pending.state >= _DONE:
                if pending.state == _DONE:
                    self._harvest(index, st, pending.result(), st.pending_since)
                    harvested.add(index)
                st.pending = None
            elif now - st.pending_since >= deadline:
                overdue = True
        if overdue:
            self._isolate_hung(now, deadline)
        # A GPU never read yet is waited for, so the first collection is complete.
        first: list[tuple[int, tuple[str, ...]]] = []
        later: list[tuple[int, tuple[str, ...]]] = []
        for index, st in self._gpus.items():
            if st.pending is not None:
                continue  # still reading (or hanging): no second read behind it
            tiers = _FAST_ONLY if now < st.recheck_at else self._due(st, now)
            (first if st.last is None else later).append((index, tiers))
        first_reads = self._start(backend, first, now) if first else {}
        self._start(backend, later, now)
        if first_reads:
            all_done, tick_done = _countdown(len(first_reads))
            for fut in first_reads.values():
                fut.add_done_callback(all_done)
            await asyncio.wait({tick_done}, timeout=deadline)
            again: list[tuple[int, tuple[str, ...]]] = []
            for index, fut in first_reads.items():
                st = self._gpus[index]
                if fut.done() and not fut.cancelled():
                    self._harvest(index, st, fut.result(), st.pending_since)
                    harvested.add(index)
                    st.pending = None
                    # and the read the next tick will report
                    # (the first read covered every tier; the next one needs only fast)
                    again.append((index, _FAST_ONLY))
            self._start(backend, again, now)
        done_at = self.ctx.clock.now()
        for index, st in self._gpus.items():
            late = st.pending is not None and done_at - st.pending_since >= deadline
            if st.last is None or (late and index not in harvested):
                self._report_hung(batch, index, st, done_at)
            else:
                # the newest finished read; while the next is under way and not yet late,
                # the last one still stands
                self._report(batch, index, st, st.last[0], done_at)
        if self._slow_taken:
            self._drop_departed_processes()
            self._slow_taken = False
        if not self.xids.kernel_following:
            self.xids.report(batch)  # else the kernel collector reports the shared counter
        return batch

    def _start(
        self,
        backend: GpuBackend,
        reads: list[tuple[int, tuple[str, ...]]],
        now: float,
    ) -> dict[int, _Read]:
        """Start reads: a GPU with a thread of its own on it, the rest as one job on the
        shared thread. Each GPU gets its own _Read either way."""
        started: dict[int, _Read] = {}
        shared: list[tuple[int, tuple[str, ...], _Read]] = []
        for index, tiers in reads:
            st = self._gpus[index]
            rd = _Read()
            st.pending, st.pending_since = rd, now
            started[index] = rd
            if st.worker is not None:
                st.worker.post(self._read_gpus, backend, [(index, tiers, rd)])
            else:
                shared.append((index, tiers, rd))
        if shared:
            if self._shared is None:
                self._shared = Worker("moptd-nvml-reader")
            self._shared.post(self._read_gpus, backend, shared)
        return started

    def _read_gpus(
        self,
        backend: GpuBackend,
        reads: list[tuple[int, tuple[str, ...], _Read]],
    ) -> None:
        """A reader thread's job: each GPU in turn, each result handed over as it is
        read. A read cancelled meanwhile (it waited behind a hung GPU) is skipped."""
        for index, tiers, rd in reads:
            if rd.start():
                rd.finish(self._read_gpu(backend, index, tiers))

    def _isolate_hung(self, now: float, deadline: float) -> None:
        """A shared read past its deadline means the shared thread is stuck in one GPU's
        call. That GPU keeps the stuck thread as its own; the reads queued behind it are
        cancelled (and started again now on a new shared thread)."""
        stuck = [
            (index, st)
            for index, st in self._gpus.items()
            if st.worker is None
            and st.pending is not None
            and st.pending.state < _DONE
            and now - st.pending_since >= deadline
        ]
        if not stuck or self._shared is None:
            return
        for index, st in stuck:
            assert st.pending is not None
            if st.pending.running():
                log.warning("nvml: GPU %d stopped answering; reading it on its own thread", index)
                st.worker = self._shared
            elif st.pending.cancel():
                st.pending = None
        self._shared = None  # the next shared job starts a new thread

    def _harvest(self, index: int, st: _GpuState, res: _Pass, read_at: float) -> None:
        st.last = (res, read_at)
        self._take(index, st, res, read_at)

    async def settle(self, limit: float = 5.0) -> None:
        """Wait until no read is under way (tests and benchmarks: the next collect then
        reports the read the previous one started)."""
        # Polled: a read ends on a reader thread and has room for one callback, which the
        # first tick's countdown may hold; this is for tests and benchmarks only.
        end = time.monotonic() + limit
        while time.monotonic() < end and any(  # noqa: ASYNC110
            st.pending is not None and not st.pending.done() for st in self._gpus.values()
        ):
            await asyncio.sleep(0.001)

    def _due(self, st: _GpuState, now: float) -> tuple[str, ...]:
        if now < st.recheck_at:
            return _FAST_ONLY
        every = self._every
        read_at = st.read_at
        # A little slack so a tier due "now" is not pushed a whole tick later by jitter.
        slack = 0.05
        static = st.static is None or now - read_at.get("static", 0.0) >= every["static"] - slack
        slow = st.slow is None or now - read_at.get("slow", 0.0) >= every["slow"] - slack
        costly = st.costly is None or now - read_at.get("costly", 0.0) >= every["costly"] - slack
        energy = st.costly is None or now - read_at.get("energy", 0.0) >= every["energy"] - slack
        costly = costly or energy  # energy is read by the costly call
        profile = (
            st.profile is None or now - read_at.get("profile", 0.0) >= every["profile"] - slack
        )
        if not (static or slow or costly or profile):
            return _FAST_ONLY
        tiers = ["fast"]
        if static:
            tiers.insert(0, "static")
        if slow:
            tiers.append("slow")
        if costly:
            tiers.append("costly")
        if energy:
            tiers.append("energy")
        if profile:
            tiers.append("profile")
        return tuple(tiers)

    def _read_gpu(self, backend: GpuBackend, index: int, tiers: tuple[str, ...]) -> _Pass:
        """Runs on the GPU's own thread. GpuLost ends the pass; other errors skip a tier."""
        out = _Pass()
        try:
            for tier in tiers:
                try:
                    if tier == "fast":  # first: most ticks read nothing else
                        out.fast = backend.read_fast(index)
                    elif tier == "static":
                        out.static = backend.read_static(index)
                    elif tier == "costly":
                        with_energy = "energy" in tiers
                        out.costly = backend.read_costly(index, energy=with_energy)
                        out.energy_read = with_energy
                    elif tier == "energy":
                        pass  # read with the costly tier, just above
                    elif tier == "profile":
                        out.profile = backend.read_profile(index)
                    else:
                        out.slow = backend.read_slow(index)
                        self._attribute(out.slow)
                except NvmlCallError as exc:
                    log.debug("nvml: %s", exc)
                    out.error = exc.code
        except GpuLost as exc:
            out.lost = exc
        except Exception:
            log.warning("nvml: unexpected error reading GPU %d", index, exc_info=True)
            out.error = NVML_ERROR_UNKNOWN
        return out

    def _attribute(self, slow: SlowReading) -> None:
        """Look up each new process once (blocking /proc reads, on the GPU's thread)."""
        for p in slow.processes:
            with self._procs_lock:
                if p.pid in self._procs:
                    continue
            info = process_info(p.pid, self.ctx.procfs)
            pod = self._pods.lookup(info.pod_uid) if info is not None else None
            if info is not None and pod is not None:
                info = dataclasses.replace(info, pod=pod.name, namespace=pod.namespace)
            with self._procs_lock:
                self._procs[p.pid] = info

    def _report(self, batch: Batch, index: int, st: _GpuState, res: _Pass, now: float) -> None:
        """Add one GPU's samples from its newest read (already taken into `st`); tier ages
        are counted to `now`. The same samples, in the same order, as static_batch, gpu.lost,
        gpu.nvml_error, add_fast, slow_batch, profile_batch and add_ages: all but the fast
        values, the error and the ages are composed once per read that changes them."""
        if res.lost is not None:
            subject = st.subject
            batch.extend(st.static_batch)
            if not st.read_at.get("lost_logged"):
                log.warning("nvml: %s", res.lost)
                st.read_at["lost_logged"] = now
            batch.add("gpu.lost", subject, 1.0)
            batch.add("gpu.nvml_error", subject, float(res.lost.code))
            # A lost GPU's old values must not be read as current.
            st.fast = st.slow = st.costly = st.profile = None
            self._slow_taken = True  # its processes are gone with them
            st.slow_batch = Batch()
            st.profile_batch = Batch()
            self._compose(st)
            return
        if "lost_logged" in st.read_at:
            del st.read_at["lost_logged"]
        out = batch.samples
        out += st.head
        error = st.error
        if error is None or error.value != res.error:
            error = st.error = new_sample("gpu.nvml_error", st.subject, float(res.error))
        out.append(error)
        if st.fast is not None and st.fast_samples is not None:
            st.fast_samples.add(out, st.fast)
        out += st.tail
        add_ages_at(out, st.subject, st.ages, st.read_at, now)
        merged = batch.attrs
        for subject, attrs in st.attrs.items():
            known = merged.get(subject)
            if known is None:
                merged[subject] = dict(attrs)
            else:
                known.update(attrs)

    def _compose(self, st: _GpuState) -> None:
        """What _report sends unchanged from tick to tick, after a read changed it."""
        st.head = [*st.static_batch.samples, Sample("gpu.lost", st.subject, 0.0)]
        st.tail = [*st.slow_batch.samples, *st.profile_batch.samples]
        attrs: dict[str, dict[str, str]] = {}
        for part in (st.static_batch, st.slow_batch, st.profile_batch):
            for subject, values in part.attrs.items():
                attrs.setdefault(subject, {}).update(values)
        st.attrs = attrs
        st.ages = age_keys(t for t in TIERS if t in st.read_at)
        every = self._every
        if st.static is None or st.slow is None or st.costly is None or st.profile is None:
            st.recheck_at = 0.0
        else:
            # the earliest a timed tier can come due, a little early so that _due, which
            # decides, sees it whatever the rounding
            read_at = st.read_at
            st.recheck_at = min(read_at.get(t, 0.0) + every[t] for t in _TIMED) - 0.051

    def _take(self, index: int, st: _GpuState, res: _Pass, read_at: float) -> None:
        """Keep a new read's values and rebuild the samples of the tiers it refreshed."""
        composed = False
        if res.static is not None:
            st.static, st.read_at["static"] = res.static, read_at
            st.static_batch = Batch()
            add_static(st.static_batch, res.static)
            composed = True
        if res.fast is not None:
            if "fast" not in st.read_at:
                composed = True  # a new tier to age
            st.fast, st.read_at["fast"] = res.fast, read_at
        if res.profile is not None:
            st.profile, st.read_at["profile"] = res.profile, read_at
            st.profile_batch = Batch()
            add_profile(st.profile_batch, index, res.profile)
            composed = True
        if res.costly is not None:
            if res.energy_read:
                st.read_at["energy"] = read_at
            elif st.costly is not None:  # the last energy value stands until the next read
                res.costly = dataclasses.replace(res.costly, energy=st.costly.energy)
            st.costly, st.read_at["costly"] = res.costly, read_at
            composed = True
        if res.slow is not None:
            st.slow, st.read_at["slow"] = res.slow, read_at
            composed = True
        if res.slow is not None or res.costly is not None:
            self._slow_taken = True
            merged = merge_costly(st.slow, st.costly)
            if merged is not None:
                st.slow_batch = Batch()
                add_slow(st.slow_batch, index, merged)
                self._describe_processes(st.slow_batch, merged)
        if composed:
            self._compose(st)

    def _report_hung(self, batch: Batch, index: int, st: _GpuState, now: float) -> None:
        subject = st.subject
        batch.extend(st.static_batch)
        batch.add("gpu.nvml_error", subject, float(NVML_ERROR_TIMEOUT))
        add_ages(
            batch,
            index,
            {t: now - st.read_at[t] for t in TIERS if t in st.read_at},
        )

    def _describe_processes(self, batch: Batch, slow: SlowReading) -> None:
        for p in slow.processes:
            with self._procs_lock:
                info = self._procs.get(p.pid)
            if info is None:
                continue
            batch.describe(
                f"process:{p.pid}",
                name=info.name,
                user=info.user,
                container=info.container_id,
                container_runtime=info.container_runtime,
                pod_uid=info.pod_uid,
                pod=info.pod,
                namespace=info.namespace,
                unit=info.unit,
                cmdline=info.cmdline,
            )

    def _drop_departed_processes(self) -> None:
        alive = {p.pid for st in self._gpus.values() if st.slow for p in st.slow.processes}
        with self._procs_lock:
            for pid in [pid for pid in self._procs if pid not in alive]:
                del self._procs[pid]

    # --- Xid events ---------------------------------------------------------------------
    def _start_xid_thread(self, backend: GpuBackend) -> None:
        loop = asyncio.get_running_loop()
        self._stopping.clear()
        self._xid_thread = threading.Thread(
            target=self._xid_loop, args=(backend, loop), name="moptd-nvml-xid", daemon=True
        )
        self._xid_thread.start()

    def _xid_loop(self, backend: GpuBackend, loop: asyncio.AbstractEventLoop) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                pairs = backend.wait_xid(XID_WAIT_MS)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive NVML errors
                failures += 1
                if failures == 1:
                    log.warning("nvml: waiting for Xid events failed: %s", exc)
                self._stopping.wait(min(60.0, 5.0 * failures))
                continue
            failures = 0
            if not pairs:
                continue
            t = self.ctx.clock.now()
            events = [
                Event(
                    "gpu.xid_event",
                    gpu_subject(index),
                    t,
                    {"code": xid, "source": "nvml"},
                    f"NVML Xid {xid} on GPU {index}",
                )
                for index, xid in pairs
            ]
            try:
                loop.call_soon_threadsafe(self._publish, events)
            except RuntimeError:  # the loop closed under us: the daemon is stopping
                return

    def _publish(self, events: list[Event]) -> None:
        # into the shared Xid counter too: where the kernel log is closed to moptd, NVML
        # is the only source of moptd_xid_errors_total
        for ev in events:
            self.xids.add(NVML, ev.subject, int(ev.fields["code"]), ev.t)  # type: ignore[call-overload]
        self.ctx.publish(events)
