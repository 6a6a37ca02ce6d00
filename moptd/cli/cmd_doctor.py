"""`moptd doctor`: a one-shot readiness check of this host, to gate a deployment.

Runs every enabled collector once and the rules over what they saw, then the checks that
only make sense once: the serving process's model directory, its port, the GPU device
nodes for its user, free GPU and host memory for it, disk space and vm.swappiness.
Exit status: 0 healthy, 1 warnings, 2 critical.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import pwd
import stat
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT = {"ok": 0, "skipped": 0, "warning": 1, "critical": 2}
SWAPPINESS_MAX = 10  # more makes the kernel swap out model weights and KV-cache pages
DISK_WARN, DISK_CRIT = 0.10, 0.05  # free share of a watched file system
HOST_MEMORY_WARN = 0.10  # available share of host memory
CORE_COLLECTORS = frozenset({"nvml", "driver", "kernel", "host"})


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # ok | warning | critical | skipped
    detail: str = ""
    code: str = ""  # a diagnosis code where one fits

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor", help="one-shot readiness check; exit 0 healthy, 1 warnings, 2 critical"
    )
    p.add_argument("--config", metavar="PATH", help="configuration file")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from moptd.cli.commands import load

    config = load(args)
    if config is None:
        return 2
    logging.getLogger("moptd").setLevel(logging.CRITICAL)
    checks = asyncio.run(run_checks(config))
    status = worst(checks)
    if args.json:
        json.dump(
            {"status": status, "exit": EXIT[status], "checks": [c.as_dict() for c in checks]},
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
    else:
        from moptd.cli.sanitize import for_terminal

        # a check's detail quotes an engine's log or a path: escaped; --json keeps it exact
        print_checklist(for_terminal(checks), status)
    return EXIT[status]


def worst(checks: Iterable[Check]) -> str:
    order = ["ok", "skipped", "warning", "critical"]
    return max((c.status for c in checks), key=order.index, default="ok").replace("skipped", "ok")


async def run_checks(config: Any) -> list[Check]:
    from moptd.serving.spec import SpecError, parse_managed

    managed = None
    serving = config.collectors.get("serving")
    problems: list[Check] = []
    if serving is not None and serving.enabled:
        try:
            managed = parse_managed(serving.options.get("managed") or None)
        except SpecError as exc:
            problems.append(Check("serving configuration", "critical", str(exc)))
    store, health = await _collect_once(config)
    from moptd.cli import doctor_versions  # before the rules: they read its observations

    versions = await doctor_versions.observe(store, config, managed)
    checks = [*problems, *collector_checks(health), *finding_checks(store, config.rule_paths)]
    checks.extend(versions)
    checks.extend(await asyncio.to_thread(host_checks, store, config))
    checks.extend(await asyncio.to_thread(serving_checks, managed, store, config.state_dir))
    from moptd.cli.doctor_trt import trt_engine_checks

    checks.extend(
        await asyncio.to_thread(
            trt_engine_checks, managed, doctor_versions.installed(config, managed)
        )
    )
    from moptd.cli.doctor_checklist import checklist_checks  # the production checklist

    checks.extend(await asyncio.to_thread(checklist_checks, config, managed, store))
    return checks


async def _collect_once(config: Any) -> tuple[Any, list[Any]]:
    from moptd.daemon.assemble import make_runtime
    from moptd.store import SignalStore

    # Collectors only read: nothing here can start the managed serving process (the
    # daemon runs it), so its endpoint is scraped like any other.
    store = SignalStore()
    runtime = make_runtime(config, store)
    await runtime.collect_once()
    return store, list(runtime.health.values())


def collector_checks(health: Iterable[Any]) -> list[Check]:
    out = []
    for h in sorted(health, key=lambda h: h.name):
        if h.state == "ok":
            out.append(Check(f"collector {h.name}", "ok"))
        elif h.state == "unavailable":
            # a GPU host without its GPU sources is not ready; other sources are optional
            status = "warning" if h.name in CORE_COLLECTORS else "skipped"
            out.append(Check(f"collector {h.name}", status, f"no data source: {h.reason}"))
        else:
            out.append(Check(f"collector {h.name}", "critical", f"{h.state}: {h.reason}"))
    return out


def finding_checks(store: Any, rule_paths: Sequence[Path]) -> list[Check]:
    from moptd.clock import SystemClock
    from moptd.diagnose.service import RuleService

    rules = RuleService(store, SystemClock(), list(rule_paths))
    if rules.errors:
        return [Check("rules", "critical", "; ".join(map(str, rules.errors)))]
    rules.tick()
    out = [Check("rules", "ok", f"{len(rules.ruleset.rules)} rules evaluated")]
    for f in sorted(rules.active(), key=lambda f: (f.subject, f.code)):
        status = {"critical": "critical", "warning": "warning"}.get(f.severity, "ok")
        out.append(Check(f"finding {f.code} on {f.subject}", status, f.summary, f.code))
    return out


def host_checks(store: Any, config: Any) -> list[Check]:
    out: list[Check] = []
    swappiness = store.latest("node.swappiness", "node")
    swap_total = store.latest("node.swap_total", "node")
    if swappiness is None:
        out.append(Check("vm.swappiness", "skipped", "not readable"))
    elif swap_total == 0:
        # With no swap device the kernel cannot swap anonymous memory out, whatever the
        # setting: it only weighs anonymous against file pages when there is swap to use.
        out.append(
            Check(
                "vm.swappiness",
                "ok",
                f"{swappiness:.0f}, no swap configured (SwapTotal 0): it has no effect; "
                f"set it to {SWAPPINESS_MAX} or less before adding swap",
            )
        )
    elif float(swappiness) > SWAPPINESS_MAX:
        out.append(
            Check(
                "vm.swappiness",
                "warning",
                f"{swappiness:.0f} (more than {SWAPPINESS_MAX}: the kernel may swap out model "
                "memory); sysctl -w vm.swappiness=1",
                "SWAP_ACTIVE",
            )
        )
    else:
        out.append(Check("vm.swappiness", "ok", f"{swappiness:.0f}"))
    total = store.latest("node.memory_total", "node")
    avail = store.latest("node.memory_available", "node")
    if isinstance(total, float) and isinstance(avail, float) and total > 0:
        share = avail / total
        status = "warning" if share < HOST_MEMORY_WARN else "ok"
        out.append(
            Check(
                "host memory",
                status,
                f"{avail / 2**30:.1f} of {total / 2**30:.1f} GiB available",
                "HOST_MEMORY_LOW" if status != "ok" else "",
            )
        )
    for labels, series in store.series_for("node.disk_available", "node"):
        path = dict(labels).get("path", "?")
        size_s = store.series("node.disk_total", "node", labels)
        free = series.last()
        size = size_s.last() if size_s is not None else None
        if free is None or not size:
            continue
        share = free / size
        status = "critical" if share < DISK_CRIT else "warning" if share < DISK_WARN else "ok"
        out.append(
            Check(
                f"disk space {path}",
                status,
                f"{free / 2**30:.1f} GiB free ({share:.0%})",
                "DISK_SPACE_LOW" if status != "ok" else "",
            )
        )
    return out


def serving_checks(managed: Any, store: Any, state_dir: Path | None = None) -> list[Check]:
    if managed is None:
        return [Check("serving process", "skipped", "none configured (collectors.serving.managed)")]
    from moptd.serving import gates

    out: list[Check] = []
    if managed.model_dir is not None:
        readable = os.access(managed.model_dir, os.R_OK | os.X_OK)
        out.append(
            Check(
                f"model directory {managed.model_dir}",
                "ok" if readable else "critical",
                "" if readable else "not readable by moptd",
            )
        )
        if readable:
            out.extend(_gate(r) for r in gates.check_model_dir(managed.model_dir))
            out.append(_host_memory_for(managed.model_dir, store))
    port = gates.check_port(managed.host, managed.port)
    own = _own_server(managed, state_dir) if port.code == "PORT_CONFLICT" else ""
    if own:
        out.append(Check("serving port", "ok", f"port {managed.port} is held by {own}"))
    else:
        out.append(_gate(port))
    if managed.device == "gpu":
        out.extend(_gate(r) for r in gates.check_gpus(managed.min_free_gpu_memory))
        out.append(device_nodes_check(managed.user))
    return out


def _own_server(managed: Any, state_dir: Path | None) -> str:
    """What holds the managed server's port when it is moptd's own running server (then
    the port is in use as it should be, not a conflict): its systemd unit, or the process
    group a running moptd recorded when it started it. "" when anything else holds it."""
    from moptd.proc.listeners import port_held_by_unit, port_holders
    from moptd.serving import managed_record
    from moptd.serving.spec import unit_name

    if managed.backend == "systemd":
        unit = unit_name(managed.name)
        return f"the running {unit}" if port_held_by_unit(managed.port, unit) else ""
    if state_dir is None:
        return ""
    rec = managed_record.read_record(Path(state_dir) / "serving" / managed.name)
    if rec is None:
        return ""
    members = set(managed_record.group_members(rec))
    holders = port_holders(managed.port)
    if not members or not holders or any(h.pid not in members for h in holders):
        return ""
    return f"the managed server moptd started (pid {rec.pid}, process group {rec.pgid})"


def _gate(r: Any) -> Check:
    return Check(f"serving {r.check}", "ok" if r.ok else "critical", r.reason, r.code)


def _host_memory_for(model_dir: Path, store: Any) -> Check:
    weights = sum(
        p.stat().st_size
        for p in model_dir.rglob("*")
        if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt", ".gguf")
    )
    avail = store.latest("node.memory_available", "node")
    if not isinstance(avail, float):
        return Check("host memory for the model", "skipped", "available memory unknown")
    ok = avail >= weights
    return Check(
        "host memory for the model",
        "ok" if ok else "critical",
        f"weights {weights / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available",
        "" if ok else "HOST_MEMORY_LOW",
    )


def device_nodes_check(user: str | None, dev: Path = Path("/dev")) -> Check:
    """/dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia<N> exist and the serving user may
    open them read-write (by the mode bits, as the kernel would decide)."""
    nodes = sorted(dev.glob("nvidia*"))
    names = {p.name for p in nodes}
    missing = [n for n in ("nvidiactl", "nvidia-uvm") if n not in names]
    if not any(n.removeprefix("nvidia").isdigit() for n in names):
        missing.append("nvidia<N>")
    if missing:
        return Check(
            "GPU device nodes", "critical", f"missing: {', '.join(missing)}", "DEVICE_NODE_PROBLEM"
        )
    try:
        pw = pwd.getpwnam(user) if user else pwd.getpwuid(os.geteuid())
    except KeyError:
        return Check("GPU device nodes", "critical", f"unknown user {user!r}")
    gids = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
    denied = [p.name for p in nodes if p.is_char_device() and not can_rw(p.stat(), pw.pw_uid, gids)]
    if denied:
        return Check(
            "GPU device nodes",
            "critical",
            f"{pw.pw_name} cannot open {', '.join(denied)}",
            "DEVICE_NODE_PROBLEM",
        )
    return Check("GPU device nodes", "ok", f"{len(nodes)} nodes usable by {pw.pw_name}")


def can_rw(st: os.stat_result, uid: int, gids: set[int]) -> bool:
    if uid == 0:
        return True
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == uid:
        return mode & 0o600 == 0o600
    if st.st_gid in gids:
        return mode & 0o060 == 0o060
    return mode & 0o006 == 0o006


_MARK = {
    "ok": ("✓", "green"),
    "skipped": ("-", "dim"),
    "warning": ("!", "yellow"),
    "critical": ("✗", "bold red"),
}


def print_checklist(checks: list[Check], status: str) -> None:
    from rich.console import Console
    from rich.text import Text

    # piped, a check's line is whole (its command or path is not split at 80 columns)
    console = Console(highlight=False, soft_wrap=not sys.stdout.isatty())
    for c in checks:
        mark, style = _MARK.get(c.status, ("?", ""))
        line = Text(f"{mark} ", style=style)
        line.append(c.name, style="bold" if c.status in ("warning", "critical") else "")
        if c.detail:
            line.append(f"  {c.detail}", style="dim" if c.status in ("ok", "skipped") else "")
        console.print(line)
    verdict = {"ok": "healthy", "warning": "warnings", "critical": "CRITICAL"}[status]
    console.print(
        Text(f"moptd doctor: {verdict} (exit {EXIT[status]})", style=_MARK[status][1] + " bold")
    )
