"""Turn matches into attributed events: PCI address -> GPU index and UUID, pid -> process,
user and container, Xid -> incident.

Live, the pid is looked up in /proc at once (the process may exit a moment later); in
replay no procfs is given, since a bundle's pids belong to another host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from moptd.kernel.incidents import IncidentTracker
from moptd.kernel.logparse import KernelRecord, facility_name
from moptd.kernel.nvlink5 import decode_fields
from moptd.kernel.patterns import KernelMatcher, Match
from moptd.kernel.unclassified import Tally, bus_of, emitter_of, is_error
from moptd.kernel.xid import plan_for, xid_info
from moptd.observations import NODE, Event, gpu_subject
from moptd.proc.info import process_info
from moptd.proc.pci import pci_key
from moptd.proc.pods import PodIndex

_GPU_STREAMS = frozenset({"kernel.xid", "kernel.gpu_fallen_off_bus", "kernel.gpu_init_failed"})


class Attributor:
    def __init__(
        self,
        gpu_index_by_bus: Mapping[str, int] | None = None,
        uuid_by_bus: Mapping[str, str] | None = None,
        procfs: Path | None = None,
        incidents: IncidentTracker | None = None,
        pods: PodIndex | None = None,
    ) -> None:
        self.matcher = KernelMatcher()
        self.unclassified = Tally()
        self.incidents = incidents or IncidentTracker()
        self.procfs = procfs
        self.pods = pods
        self.gpu_index_by_bus: dict[str, int] = {}
        self.uuid_by_bus: dict[str, str] = {}
        self.set_gpus(gpu_index_by_bus or {}, uuid_by_bus or {})

    def set_gpus(self, index_by_bus: Mapping[str, int], uuid_by_bus: Mapping[str, str]) -> None:
        self.gpu_index_by_bus = {pci_key(k): v for k, v in index_by_bus.items()}
        self.uuid_by_bus = {pci_key(k): v for k, v in uuid_by_bus.items()}

    def gpu_subject_for(self, bus: str) -> str:
        index = self.gpu_index_by_bus.get(bus)
        return gpu_subject(index if index is not None else bus)

    def uuid_for(self, bus: str) -> str:
        return self.uuid_by_bus.get(bus) or self.matcher.uuid_by_bus.get(bus, "")

    def events(self, rec: KernelRecord, default_time: float = 0.0) -> list[Event]:
        t = rec.t if rec.t is not None else default_time
        # not 0 (kern): written to /dev/kmsg from user space, which cannot claim 0
        facility = facility_name(rec.facility) if rec.facility else None
        out = [self.event(m, t, rec.t, facility) for m in self.matcher.feed(rec.text)]
        if not out:
            out.extend(self._unclassified(rec, t))
        return out

    def _unclassified(self, rec: KernelRecord, t: float) -> list[Event]:
        """A GPU emitter's error record that no pattern classified (UNCLASSIFIED_ERROR)."""
        text = rec.text.split("\n", 1)[0].strip()
        emitter = emitter_of(text)
        if emitter is None or not is_error(rec.level, text, emitter):
            return []
        bus = bus_of(text)
        subject = self.gpu_subject_for(pci_key(bus)) if bus else NODE
        quotes, dropped = self.unclassified.add(subject, emitter, text)
        fields: dict[str, Any] = {
            "emitter": emitter,
            "message": text[:200],
            "level": rec.level,
            "messages": quotes,
            "more": dropped,
        }
        if bus:
            fields["pci_bus_id"] = pci_key(bus)
        return [Event("kernel.unclassified", subject, t, fields, text)]

    def flush(self, t: float) -> list[Event]:
        return [self.event(m, t, t) for m in self.matcher.flush()]

    def event(
        self, m: Match, t: float, known_t: float | None, facility: str | None = None
    ) -> Event:
        fields: dict[str, Any] = dict(m.fields)
        if facility:
            fields["facility"] = facility
        subject = NODE
        bus = str(fields.get("pci_bus_id") or "")
        stream = m.stream
        if stream == "kernel.module_load_failure" and bus:
            # "NVRM: GPU <bus>: RmInitAdapter failed!": that one GPU, not the module.
            stream = "kernel.gpu_init_failed"
        if stream in _GPU_STREAMS:
            subject = self.gpu_subject_for(bus)
            fields["uuid"] = self.uuid_for(bus)
        elif bus and bus in self.gpu_index_by_bus:
            fields["gpu"] = self.gpu_index_by_bus[bus]
        pid = fields.get("pid")
        if isinstance(pid, int) and m.stream in ("kernel.xid", "kernel.nccl_segfault"):
            self._attribute_process(fields, pid)
        if m.stream == "kernel.xid":
            code = int(fields["code"])
            info = xid_info(code)
            fields["mnemonic"] = info.mnemonic
            fields["diagnoses"] = list(info.diagnoses)
            fields.update(decode_fields(code, fields))  # NVLink5: NVIDIA's decode sheet
            fields["plan"] = plan_for(code, fields)
            fields.setdefault("container", "")
            caused_by = fields.get("caused_by")
            fields["incident"] = self.incidents.assign(
                subject, known_t, code, caused_by if isinstance(caused_by, int) else None
            )
        return Event(stream, subject, t, fields, m.text)

    def _attribute_process(self, fields: dict[str, Any], pid: int) -> None:
        if self.procfs is None:
            return
        info = process_info(pid, self.procfs)
        if info is None:
            return
        if not fields.get("process"):
            fields["process"] = info.name
        fields["cmdline"] = info.cmdline[:512]
        fields["user"] = info.user
        fields["container"] = info.container_id
        fields["container_runtime"] = info.container_runtime
        fields["pod_uid"] = info.pod_uid
        pod = self.pods.lookup(info.pod_uid) if self.pods is not None else None
        if pod is not None:
            fields["pod"] = pod.name
            fields["namespace"] = pod.namespace
        fields["unit"] = info.unit


def records_to_events(
    records: Iterable[KernelRecord],
    gpu_index_by_bus: Mapping[str, int] | None = None,
    *,
    uuid_by_bus: Mapping[str, str] | None = None,
    procfs: Path | None = None,
    default_time: float = 0.0,
) -> list[Event]:
    """Parsed, attributed events (kernel.xid, kernel.oom_kill, ...) of a run of records.

    A record without a time gets ``default_time`` (replay: its first step). ``procfs`` is
    given only live: a bundle's pids belong to another host.
    """
    attributor = Attributor(gpu_index_by_bus or {}, uuid_by_bus or {}, procfs)
    events: list[Event] = []
    last = default_time
    for rec in records:
        events.extend(attributor.events(rec, default_time))
        last = rec.t if rec.t is not None else last
    events.extend(attributor.flush(last))  # a message cut off at the end of the log
    return events
