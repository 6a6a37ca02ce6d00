"""Human-readable output (rich on a terminal, plain text when piped)."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from moptd.proc.pci import normalize_pci

_HEALTH_STYLE = {"ok": "green", "unavailable": "yellow", "failed": "bold red", "pending": "dim"}


def _console() -> Console:
    # piped into a file or a ticket, 80 columns would truncate the GPU table
    width = None if sys.stdout.isatty() else 160
    # and a line longer than that is whole when piped: a command split in two is no command
    return Console(highlight=False, width=width, soft_wrap=not sys.stdout.isatty())


def _gib(v: Any) -> str:
    return "-" if v is None else f"{v / 2**30:.1f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _mhz(v: Any) -> str:
    return "-" if v is None else f"{v / 1e6:.0f}"


def _num(v: Any, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _when(t: Any) -> str:
    if not t:
        return "-"
    return dt.datetime.fromtimestamp(float(t), tz=dt.UTC).astimezone().strftime("%H:%M:%S")


def print_status(view: dict[str, Any]) -> None:
    console = _console()
    if view.get("note"):
        console.print(f"[yellow]{view['note']}[/yellow]")
    # A subject named by a PCI address, not an NVML index, comes only from kernel lines:
    # NVML does not describe that GPU, which may be the one that fell off the bus.
    all_gpus = view.get("gpus", [])
    gpus = [g for g in all_gpus if str(g.get("index", "")).isdigit()]
    kernel_only = [g for g in all_gpus if not str(g.get("index", "")).isdigit()]
    if gpus:
        t = Table(title="GPUs", title_justify="left")
        for col in (
            "GPU",
            "name",
            "util",
            "mem used/total GiB",
            "temp °C",
            "power W",
            "SM MHz",
            "mem MHz",
            "clock events",
        ):
            t.add_column(col)
        for g in gpus:
            if g.get("lost"):
                t.add_row(
                    str(g["index"]),
                    g.get("name") or "-",
                    "[bold red]LOST[/]",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                )
                continue
            power = _num(g.get("power"))
            if g.get("power_limit") is not None:
                power += f" / {g['power_limit']:.0f}"
            sm = _mhz(g.get("sm_clock"))
            if g.get("sm_clock_max") is not None:
                sm += f" / {g['sm_clock_max'] / 1e6:.0f}"
            events = ", ".join(g.get("clock_events") or []) or "-"
            t.add_row(
                str(g["index"]),
                g.get("name") or "-",
                _pct(g.get("util")),
                f"{_gib(g.get('memory_used'))} / {_gib(g.get('memory_total'))}",
                _num(g.get("temperature")),
                power,
                sm,
                _mhz(g.get("mem_clock")),
                events,
            )
        console.print(t)
    else:
        console.print("GPUs: none seen (see the nvml collector below)")
    _print_kernel_only(console, kernel_only, gpus)
    node = view.get("node", {})
    if node:
        console.print(
            f"Host: memory {_gib(node.get('memory_available'))} of "
            f"{_gib(node.get('memory_total'))} GiB available, swap used "
            f"{_gib(node.get('swap_used'))} GiB, CPU {_pct(node.get('cpu_util'))} of "
            f"{_num(node.get('cpu_count'))}, load {_num(node.get('load1'), '{:.2f}')}, "
            f"swappiness {_num(node.get('swappiness'))}"
        )
    _print_driver(console, view.get("driver") or {})
    _print_containers(console, view.get("containers") or {})
    t = Table(title="Collectors", title_justify="left")
    for col in ("collector", "state", "since", "last run ms", "failures", "reason"):
        t.add_column(col)
    for c in view.get("collectors", []):
        style = _HEALTH_STYLE.get(c["state"], "")
        t.add_row(
            c["name"],
            f"[{style}]{c['state']}[/]" if style else c["state"],
            _when(c.get("since")),
            f"{c.get('duration_seconds', 0) * 1000:.1f}",
            str(c.get("failures", 0)),
            c.get("reason") or "",
        )
    console.print(t)


def _print_kernel_only(
    console: Console, kernel_only: list[dict[str, Any]], gpus: list[dict[str, Any]]
) -> None:
    """GPUs that kernel lines name but NVML does not list, as a note under the table: a
    row of "-" would hide the GPU most likely to be in trouble."""
    if not kernel_only:
        return
    index_by_pci = {
        normalize_pci(str(g.get("pci_bus_id") or "")): g["index"]
        for g in gpus
        if g.get("pci_bus_id")
    }
    console.print(
        "[bold yellow]Seen only in the kernel log[/] (NVML does not list them: a GPU that "
        "fell off the bus, or NVML is not answering; `moptd explain` says what the lines "
        "mean):"
    )
    for g in kernel_only:
        bus = str(g.get("pci_bus_id") or g.get("index") or "?")
        parts = [f"PCI {bus}"]
        if g.get("uuid"):
            parts.append(str(g["uuid"]))
        known = index_by_pci.get(normalize_pci(bus))
        if known is not None:
            parts.append(f"(GPU {known} in NVML has this address)")
        console.print("  " + escape("  ".join(parts)))


def _yes(flag: Any) -> str:
    return "[green]yes[/]" if flag else "[bold red]no[/]"


def _print_containers(console: Console, engines: dict[str, dict[str, Any]]) -> None:
    """Each engine found: a daemon that answers, with its nvidia runtime and CDI, or why
    it is no engine (a CLI with no daemon)."""
    for name, e in engines.items():
        line = f"Container engine {name}: {escape(str(e.get('status', '')))}"
        if e.get("answers"):
            if "nvidia_runtime" in e:
                line += f"; nvidia runtime {_yes(e['nvidia_runtime'])}"
            if "cdi" in e:
                line += f", CDI {'on' if e['cdi'] else 'off'}"
        else:
            line = f"[dim]{line}[/]"
        console.print(line)


def _print_driver(console: Console, d: dict[str, Any]) -> None:
    """The driver stack: versions, modules, device nodes, persistence."""
    if not d or not (d.get("modules") or d.get("kernel_module_version")):
        return
    kernel = ", ".join(d.get("kernel_module_version") or []) or "-"
    user = ", ".join(d.get("user_space_version") or []) or "-"
    match = d.get("versions_match")
    verdict = "" if match is None else ("  (match)" if match else "  [bold red](MISMATCH)[/]")
    console.print(f"Driver: kernel module {kernel}, user space {user}{verdict}")
    mods = d.get("modules") or {}
    if mods:
        console.print(
            "  modules: "
            + ", ".join(
                f"{m} {'loaded' if ok else '[bold red]missing[/]'}"
                for m, ok in sorted(mods.items())
            )
        )
    nodes = d.get("device_nodes") or {}
    if nodes:
        console.print(
            "  device nodes: "
            + ", ".join(
                f"{n}" if ok else f"[bold red]{n} missing[/]" for n, ok in sorted(nodes.items())
            )
        )
    denied = [n for n, ok in (d.get("device_nodes_accessible") or {}).items() if not ok]
    if denied:
        console.print("  [bold red]not accessible:[/] " + ", ".join(sorted(denied)))
    pm = d.get("persistence_mode") or {}
    persist = []
    if d.get("persistenced_running") is not None:
        persist.append(f"nvidia-persistenced running: {_yes(d['persistenced_running'])}")
    if pm:
        persist.append(
            "persistence mode on GPU "
            + ", ".join(f"{g}: {'on' if v else 'off'}" for g, v in sorted(pm.items()))
        )
    if persist:
        console.print("  " + "; ".join(persist))
    gsp = d.get("gsp_firmware") or {}
    if gsp:
        versions = sorted({v for vs in gsp.values() for v in vs})
        console.print(f"  GSP firmware: {', '.join(versions) or '-'}")
