"""Kernel collector: follow the kernel log, publish parsed and attributed events as they
arrive, and report Xid counters and the follower's own counts on each pass.

The source is /dev/kmsg (default) or the systemd journal's kernel transport. Records are
parsed on the loop in slices (see moptd.kernel.kmsg), so a burst of records delays other
collectors by one slice at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Protocol

from moptd.collector import Collector, CollectorContext, Option, Unavailable
from moptd.gpu.identities import gpu_identities
from moptd.kernel.attribution import Attributor
from moptd.kernel.incidents import IncidentTracker
from moptd.kernel.journal import JournalFollower
from moptd.kernel.kmsg import KmsgFollower
from moptd.kernel.logparse import KernelRecord
from moptd.kernel.xid import catalog as xid_catalog
from moptd.observations import NODE, Batch, Event, labels_of

log = logging.getLogger(__name__)

STATE_FILE = "kernel_log.json"


class _Follower(Protocol):
    records_read: int
    records_lost: int

    def open(self) -> None: ...
    def attach(self, loop: asyncio.AbstractEventLoop) -> None: ...
    def close(self) -> None: ...
    def save(self) -> None: ...


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
    }

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.attributor = Attributor(
            procfs=ctx.procfs, incidents=IncidentTracker(float(self.option("incident_gap")))
        )
        self.follower: _Follower | None = None
        self._unavailable = ""
        self._xid_counts: dict[tuple[str, int], int] = {}
        self._xid_last: dict[str, float] = {}
        self._map_at = -1e18
        self._save_failing = False

    async def start(self) -> None:
        source = str(self.option("source"))
        state = self.ctx.state_dir / STATE_FILE
        boot_time = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
        follower: _Follower
        if source == "kmsg":
            path = Path(str(self.option("kmsg_path")))
            follower = KmsgFollower(path, state, self._on_records, boot_time=boot_time)
        elif source == "journal":
            follower = JournalFollower(state, self._on_records)
        else:
            self._unavailable = f"collectors.kernel.source: unknown source {source!r}"
            raise Unavailable(self._unavailable)
        try:
            await self.blocking(follower.open)
        except (OSError, Unavailable) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            where = self.option("kmsg_path") if source == "kmsg" else "the systemd journal"
            self._unavailable = f"cannot read {where}: {reason}"
            raise Unavailable(self._unavailable) from None
        await self._refresh_gpus()
        # The Xid catalog is YAML, parsed on first use: here, off the loop, rather than in
        # the reader callback when the first Xid arrives (about 100 ms on the loop).
        await self.blocking(xid_catalog)
        follower.attach(asyncio.get_running_loop())
        self.follower = follower

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
        for rec in records:
            events.extend(self.attributor.events(rec, now))
        for ev in events:
            if ev.stream == "kernel.xid":
                key = (ev.subject, int(ev.fields["code"]))  # type: ignore[call-overload]
                self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
                self._xid_last[ev.subject] = ev.t
        if events:
            self.ctx.publish(events)

    async def collect(self) -> Batch:
        if self._unavailable or self.follower is None:
            raise Unavailable(self._unavailable or "not started")
        await self._refresh_gpus()
        try:
            await self.blocking(self.follower.save)
        except OSError as exc:
            # A full or read-only state directory costs the resume position after a restart,
            # not the kernel log: reading and counting go on, and the save is retried.
            if not self._save_failing:
                log.warning("cannot save the kernel-log position (retrying each pass): %s", exc)
            self._save_failing = True
        else:
            if self._save_failing:
                log.info("kernel-log position saved again")
            self._save_failing = False
        b = Batch()
        b.add("kernel.records_read", NODE, float(self.follower.records_read))
        b.add("kernel.records_lost", NODE, float(self.follower.records_lost))
        for (subject, code), n in sorted(self._xid_counts.items()):
            b.add("gpu.xid_errors", subject, float(n), labels_of(xid=str(code)))
        for subject, t in self._xid_last.items():
            b.add("gpu.xid_last_time", subject, t)
            uuid = self.attributor.uuid_for(subject.split(":", 1)[1])
            if uuid and subject.count(":") > 1:  # a gpu:<bus> subject NVML does not describe
                b.describe(subject, uuid=uuid)
        return b

    async def stop(self) -> None:
        follower, self.follower = self.follower, None
        if follower is not None:
            follower.close()
            try:
                await self.blocking(follower.save)
            except Exception as exc:  # noqa: BLE001 - shutting down: say so and go on
                log.warning("could not save the kernel-log position: %s", exc)
        await super().stop()
