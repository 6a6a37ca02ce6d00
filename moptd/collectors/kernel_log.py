"""Kernel collector: follow the kernel log, publish parsed and attributed events as they
arrive, and report Xid counters and the follower's own counts on each pass.

The source is /dev/kmsg (default) or the systemd journal's kernel transport. Records are
parsed on the loop in slices (see moptd.kernel.kmsg), so a burst of records delays other
collectors by one slice at most.

Where reading starts: in the daemon (``ctx.positions`` is the findings database), just
after the committed position, or at the start of this boot when there is none; a
one-shot command (``explain --offline``, ``doctor``, ``status --offline``) reads the whole
boot in its one pass and keeps no position. Each event carries the position of the record
it came from (``fields["log_position"]``); the database commits it with the event, in one
transaction, so a SIGKILL at any moment neither loses nor repeats an event. Records that
gave no event move the position on each pass (and at start and stop), queued behind the
events published before them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Protocol

from moptd.collector import Collector, CollectorContext, Option, Unavailable
from moptd.gpu.identities import gpu_identities
from moptd.kernel.attribution import Attributor
from moptd.kernel.incidents import IncidentTracker
from moptd.kernel.journal import CURSOR, JournalFollower
from moptd.kernel.kmsg import (
    POSITION_FIELD,
    KmsgFollower,
    Position,
    StateError,
    load_position,
)
from moptd.kernel.logparse import KernelRecord
from moptd.kernel.xid import catalog as xid_catalog
from moptd.kernel.xid_tally import KERNEL, XidTally
from moptd.observations import NODE, Batch, Event
from moptd.proc.pods import DEFAULT_ROOT as POD_LOG_DIR
from moptd.proc.pods import PodIndex

log = logging.getLogger(__name__)

# Where moptd before the findings database kept the position; read once, on upgrade.
LEGACY_STATE_FILE = "kernel_log.json"


class _Follower(Protocol):
    records_read: int
    records_lost: int
    boot_id: str

    def open(self) -> None: ...
    def attach(self, loop: asyncio.AbstractEventLoop) -> None: ...
    def close(self) -> None: ...
    def position(self) -> Position: ...
    def read_slice(self) -> bool: ...


class KernelLogCollector(Collector):
    name = "kernel"
    default_interval = 5.0
    default_timeout = 10.0
    options: ClassVar[Mapping[str, Option]] = {
        "source": Option(str, "kmsg", "kmsg (read /dev/kmsg) or journal (systemd-python)."),
        "kmsg_path": Option(str, "/dev/kmsg", "The kmsg device (tests point it elsewhere)."),
        "incident_gap": Option(
            (int, float), 180, "Seconds of silence that end an Xid incident on one GPU."
        ),
        "gpu_map_interval": Option(
            (int, float), 300, "Seconds between refreshes of the PCI address -> GPU map."
        ),
        "pod_log_dir": Option(
            str,
            POD_LOG_DIR,
            "The kubelet's pod log directory, whose <namespace>_<pod>_<uid> entries name "
            "the pod of an Xid's process (its cgroup gives the UID); under paths.host_root.",
        ),
    }

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.attributor = Attributor(
            procfs=ctx.procfs,
            incidents=IncidentTracker(float(self.option("incident_gap"))),
            pods=PodIndex(lambda: ctx.host_path(str(self.option("pod_log_dir")))),
        )
        self.follower: _Follower | None = None
        self._unavailable = ""
        self.xids = ctx.xids if ctx.xids is not None else XidTally()
        self._map_at = -1e18
        self._source = ""
        self._saved: Position | None = None  # the position last handed to ctx.positions
        self._legacy = False  # a position file of an earlier moptd is still there
        self._lost = 0  # records lost that a kernel.log_gap event has reported

    async def start(self) -> None:
        source = str(self.option("source"))
        boot_time = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
        if source not in ("kmsg", "journal"):
            self._unavailable = f"collectors.kernel.source: unknown source {source!r}"
            raise Unavailable(self._unavailable)
        self._source = source
        resume = await self._committed_position(source)
        follower: _Follower
        if source == "kmsg":
            path = Path(str(self.option("kmsg_path")))
            follower = KmsgFollower(
                path,
                self._on_records,
                boot_time=boot_time,
                resume=resume,
                on_replay=self._on_replay,
            )
        else:
            follower = JournalFollower(self._on_records, resume=resume)
        try:
            await self.blocking(follower.open)
        except (OSError, Unavailable) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            where = self.option("kmsg_path") if source == "kmsg" else "the systemd journal"
            self._unavailable = f"cannot read {where}: {reason}"
            raise Unavailable(self._unavailable) from None
        await self._refresh_gpus()
        if self.ctx.positions is not None:
            # The Xid catalog is YAML, parsed on first use: here, off the loop, rather than
            # in the reader callback when the first Xid arrives (about 100 ms on the loop).
            # Not in a one-shot pass (`explain`/`status --offline`, doctor): it reads the
            # boot in collect() and parses the catalog there if an Xid is in it; a ring
            # without one never needs it (20-35 ms of the call, BENCHMARKS.md)
            await self.blocking(xid_catalog)
        self.follower = follower
        # At once, before any record: a restart a moment from now resumes in this boot.
        await self._save_position()
        follower.attach(asyncio.get_running_loop())
        self.xids.kernel_following = True  # this collector reports the Xid counter now

    async def _committed_position(self, source: str) -> Position | None:
        """The daemon's committed position (or the legacy file's, once); None in a one-shot
        command, which reads the whole boot."""
        positions = self.ctx.positions
        if positions is None:
            return None
        saved = await self.blocking(positions.load_position, source)
        if saved is not None:
            self._saved = Position(saved.boot_id, saved.seq, saved.cursor)
            return self._saved
        legacy = self.ctx.state_dir / LEGACY_STATE_FILE
        try:
            old = await self.blocking(load_position, legacy)
        except StateError as exc:
            log.warning("%s; reading the kernel log from the start of this boot", exc)
            old = None
        self._legacy = old is not None or legacy.exists()
        return old

    async def _save_position(self) -> None:
        """Hand the position to ctx.positions when it moved (queued behind every event
        published so far, so it never commits ahead of them)."""
        positions, follower = self.ctx.positions, self.follower
        if positions is None or follower is None:
            return
        pos = follower.position()
        if pos == self._saved:
            return
        done = positions.save_position(self._source, pos.boot_id, pos.seq, pos.cursor)
        self._saved = pos
        if self._legacy and isinstance(done, concurrent.futures.Future):
            # the database holds the position now: the old file would only mislead later
            await asyncio.wrap_future(done)
            await self.blocking((self.ctx.state_dir / LEGACY_STATE_FILE).unlink, True)
            self._legacy = False

    def _on_replay(self, records: list[KernelRecord]) -> None:
        """Records whose events were stored before a restart: they rebuild the parser's
        state (a message spread over records, the GPU UUIDs, Xid incidents), no more."""
        for rec in records:
            self.attributor.events(rec, rec.t or 0.0)

    async def _refresh_gpus(self) -> None:
        if time.monotonic() - self._map_at < float(self.option("gpu_map_interval")):
            return
        self._map_at = time.monotonic()
        try:
            index, uuid, _ = await self.blocking(gpu_identities, self.ctx.procfs)
        except Exception as exc:  # noqa: BLE001 - without a map, events name PCI addresses
            log.debug("GPU map refresh failed: %s", exc)
            return
        self.attributor.set_gpus(index, uuid)

    def _on_records(self, records: list[KernelRecord]) -> None:
        now = time.time()
        events: list[Event] = []
        boot_id = self.follower.boot_id if self.follower is not None else ""
        for rec in records:
            position = {
                "source": self._source,
                "boot_id": boot_id,
                "seq": rec.seq,
                "cursor": rec.meta.get(CURSOR, ""),
            }
            for ev in self.attributor.events(rec, now):
                fields = {**ev.fields, POSITION_FIELD: position}
                events.append(Event(ev.stream, ev.subject, ev.t, fields, ev.text))
        gap = self._gap(now)
        if gap is not None:
            events.insert(0, gap)
        for ev in events:
            if ev.stream == "kernel.xid":
                code = int(ev.fields["code"])  # type: ignore[call-overload]
                self.xids.add(KERNEL, ev.subject, code, ev.t)
        if events:
            self.ctx.publish(events)

    def _gap(self, now: float) -> Event | None:
        """The records the follower found missing since the last call, as an event: a
        counter alone in /metrics is no finding (KERNEL_LOG_RECORDS_LOST)."""
        total = self.follower.records_lost if self.follower is not None else 0
        lost, self._lost = total - self._lost, total
        if lost <= 0:
            return None
        text = (
            f"{lost} kernel-log records were overwritten before moptd read them "
            f"({total} since moptd started): what they said, Xids included, is unknown"
        )
        fields: dict[str, object] = {"lost": lost, "total": total, "source": self._source}
        return Event("kernel.log_gap", NODE, now, fields, text)

    async def collect(self) -> Batch:
        if self._unavailable or self.follower is None:
            raise Unavailable(self._unavailable or "not started")
        await self._refresh_gpus()
        if self.ctx.positions is None:
            # a one-shot pass: the whole boot, now, in slices with the loop free between
            follower, more = self.follower, True
            while more:
                more = follower.read_slice()
                await asyncio.sleep(0)
        else:
            await self._save_position()
        b = Batch()
        b.add("kernel.records_read", NODE, float(self.follower.records_read))
        b.add("kernel.records_lost", NODE, float(self.follower.records_lost))
        self.xids.report(b)  # the kernel log's Xids and NVML's, each once
        for subject in {s.subject for s in b.samples if s.signal == "gpu.xid_last_time"}:
            uuid = self.attributor.uuid_for(subject.split(":", 1)[1])
            if uuid and subject.count(":") > 1:  # a gpu:<bus> subject NVML does not describe
                b.describe(subject, uuid=uuid)
        return b

    async def stop(self) -> None:
        if self.follower is not None:
            self.xids.kernel_following = False
            self.follower.close()
            await self._save_position()
            self.follower = None
        await super().stop()
