"""Versions collector: the version-lock set as ``versions.*`` samples, live and in replay.

Live, its sources are NVML (the driver's version, its CUDA version and each GPU's compute
capability, through ``version_lock.live_driver_facts``), /proc/driver/nvidia/version (the
kernel module) and the site-packages of each serving environment (the managed engine's,
found from its command, and ``versions.site_packages`` from the configuration), read as
text: nothing is imported from them. Over a bundle its source is the bundle's versions.json
(``record_file``), the record ``moptd record`` wrote from the same sources. Either way the
record becomes samples through ``version_lock.observations``, once, so the daemon, doctor
and replay decide rules/driver/cuda-compat.rules.yaml and rules/compiler/cuda-arch.rules.yaml
from the same numbers.

Versions change only with an upgrade: the default interval is five minutes, and every read
(NVML, a few hundred METADATA files) runs on the collector's own thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from moptd.collector import Collector, CollectorContext, Option, OptionError, Unavailable
from moptd.collectors.driver import parse_module_version
from moptd.observations import Batch
from moptd.serving import version_lock
from moptd.serving.environment import site_packages_of
from moptd.serving.spec import SpecError, parse_managed

# What the daemon passes in CollectorContext.global_options (``global_options_of``).
SITE_PACKAGES = "versions_site_packages"
MANAGED_COMMAND = "versions_managed"  # (name, command) of the managed engine, or None
MAX_MODULE_VERSION_BYTES = 4096


def _check_record_file(value: Any) -> None:
    if value is not None and not str(value).strip():
        raise OptionError("", "must be a path to a versions.json, or null")


class VersionsCollector(Collector):
    name = "versions"
    default_interval = 300.0
    default_timeout = 60.0
    options: ClassVar[Mapping[str, Option]] = {
        "record_file": Option(
            (str, type(None)),
            None,
            "A versions.json (format moptd-versions/v1) to read instead of this host; replay "
            "sets it to the bundle's. null: the live host (NVML, /proc/driver/nvidia/version, "
            "the managed engine's and versions.site_packages' site-packages).",
            _check_record_file,
        ),
    }

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.last_record: dict[str, Any] | None = None

    async def collect(self) -> Batch:
        return await self.blocking(self.read)

    def read(self) -> Batch:
        """One pass over the sources (blocking). A versions.json that does not read raises
        moptd.located.LocatedError naming the file and key."""
        record_file = self.option("record_file")
        if record_file is not None:
            doc = version_lock.read_record(Path(record_file))
        else:
            doc = self._live().to_json()
            if not (doc["driver"]["version"] or doc["gpus"] or doc["serving"]):
                raise Unavailable(
                    "no NVIDIA driver answered NVML and no serving environment is configured "
                    "(collectors.serving.managed, versions.site_packages)"
                )
        self.last_record = doc
        return version_lock.observations(doc)

    def _live(self) -> version_lock.VersionsRecord:
        facts = version_lock.live_driver_facts(self._kernel_module())
        stacks = [version_lock.stack_for(name, sps) for name, sps in self.environments() if sps]
        return version_lock.VersionsRecord(facts, stacks)

    def _kernel_module(self) -> str:
        try:
            with open(self.ctx.procfs / "driver/nvidia/version", encoding="utf-8") as fh:
                text = fh.read(MAX_MODULE_VERSION_BYTES)
        except (OSError, UnicodeDecodeError):
            return ""  # no module loaded: the driver collector reports that
        found = parse_module_version(text)
        return found[0] if found else ""

    def environments(self) -> list[tuple[str, list[Path]]]:
        """(name, site-packages) of each serving environment, as `moptd doctor` reads them."""
        g = self.ctx.global_options
        extra = [Path(p).expanduser() for p in g.get(SITE_PACKAGES, ())]
        managed = g.get(MANAGED_COMMAND)
        if managed is not None:
            name, command = managed
            return [(name, site_packages_of(command, extra))]
        return [("configured", extra)] if extra else []


def global_options_of(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What the collector needs from the rest of the configuration (its ``raw`` mapping):
    ``versions.site_packages`` and the managed engine's name and command. A managed section
    that does not parse gives no managed engine here; the serving collector reports it."""
    site_packages = (raw.get("versions") or {}).get("site_packages") or []
    if not isinstance(site_packages, list):
        site_packages = []
    out: dict[str, Any] = {
        SITE_PACKAGES: tuple(str(p) for p in site_packages if isinstance(p, str)),
        MANAGED_COMMAND: None,
    }
    serving = (raw.get("collectors") or {}).get("serving") or {}
    try:
        managed = parse_managed(serving.get("managed") or None)
    except SpecError:
        return out
    if managed is not None:
        out[MANAGED_COMMAND] = (managed.name, tuple(managed.command))
    return out


def replay_context(record_file: Path) -> CollectorContext:
    """The collector's context over a bundle's versions.json (moptd.bundle.reader)."""
    return CollectorContext(options={"record_file": str(record_file)}, recorded=True)
