"""The production checklist in `moptd doctor` (docs/doctor.md): the practice's checks that
hold up and that doctor did not make already.

Doctor alone sees one collection pass: the latest sample of each signal, the engines'
cumulative histograms and the log files as they are now. A memory-leak slope needs history,
which only the daemon has: when its API answers, the leak check asks it; otherwise it says
what it cannot see. The port, the device nodes and disk space of the watched file systems
stay where they were (cmd_doctor.py); the model-file and build-space gates are
moptd.serving.gates_checklist's, shared with a managed start.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from moptd.cli.cmd_doctor import Check

LEAK_WINDOW = 24 * 3600.0  # the practice's soak: GPU memory over 24 h
P999 = 0.999
LOG_TAIL_BYTES = 8 * 2**20  # the part of an engine log read; more is said, not read
ERROR_LEVELS = ("ERROR", "CRITICAL")


def checklist_checks(config: Any, managed: Any, store: Any) -> list[Check]:
    """The checklist's checks after one collection pass (``store``); ``managed`` is the
    managed serving process's spec or None."""
    from moptd.serving.gates_checklist import checklist_gates

    doctor = (config.raw or {}).get("doctor") or {}
    out = [leak_check(config.api_socket, Path(config.state_dir))]
    out.extend(latency_checks(store, _objective(doctor)))
    for name, path in log_files(config, managed):
        out.extend(log_checks(name, path, cpu=managed is not None and managed.device == "cpu"))
    if managed is not None:
        build = doctor.get("engine_build_dir")
        out.extend(
            Check(
                f"checklist {g.check.replace('_', ' ')}",
                "ok" if g.ok else "critical",
                g.reason,
                g.code,
            )
            for g in checklist_gates(managed, Path(build) if build else None)
        )
    return out


def _objective(doctor: dict[str, Any]) -> float | None:
    from moptd.durations import parse_duration

    raw = doctor.get("latency_p999_objective")
    return None if raw is None else parse_duration(raw)  # checked when the config loaded


def leak_check(api_socket: Path, state_dir: Path) -> Check:
    """GPU_MEMORY_LEAK over the last 24 h, from the daemon: its rule (gpu-memory-leak in
    rules/serving/serving.rules.yaml) watches the slope of used memory over an hour, and
    every finding it raised is stored. A running daemon answers on its API; a stopped one
    left its findings database, read here read-only."""
    from moptd.cli.client import DaemonUnreachable, get_json

    name = "checklist GPU memory leak (24 h)"
    try:
        health = get_json(api_socket, "/v1/health", timeout=2.0)
        body = get_json(api_socket, f"/v1/findings?code=GPU_MEMORY_LEAK&since={LEAK_WINDOW:.0f}s")
    except DaemonUnreachable:
        return _stored_leaks(name, state_dir)
    history = body.get("history", [])
    stored = {f.get("id") for f in history}
    # an active finding carries the id of its stored row once it has one: count it once
    seen = [*(f for f in body.get("active", []) if f.get("id") not in stored), *history]
    if seen:
        return _leak_warning(name, seen, "")
    uptime = float(health.get("uptime_seconds") or 0.0)
    if uptime < LEAK_WINDOW:
        return Check(
            name,
            "skipped",
            f"no leak finding, but the daemon has run {uptime / 3600:.1f} h of the 24 h",
        )
    return Check(
        name, "ok", f"no GPU_MEMORY_LEAK finding in 24 h (daemon up {uptime / 3600:.0f} h)"
    )


def _leak_warning(name: str, seen: list[dict[str, Any]], where: str) -> Check:
    f = seen[0]
    return Check(
        name,
        "warning",
        f"{len(seen)} finding(s) in 24 h{where}; the latest: {f.get('summary', '')}",
        "GPU_MEMORY_LEAK",
    )


def _stored_leaks(name: str, state_dir: Path) -> Check:
    import contextlib
    import time

    from moptd.findings import db as fdb

    alone = "one pass takes one sample per GPU and cannot see a slope"
    path = state_dir / fdb.FILE_NAME
    conn = fdb.open_read_only(path)
    if conn is None:
        return Check(
            name,
            "skipped",
            f"no daemon answers at the API socket and no findings database at {path}: "
            f"{alone} (run moptd as a daemon for 24 h)",
        )
    with contextlib.closing(conn):
        seen = fdb.query_findings(conn, code="GPU_MEMORY_LEAK", since=time.time() - LEAK_WINDOW)
    if seen:
        return _leak_warning(name, seen, f" in {path} (the daemon is not running)")
    return Check(
        name,
        "skipped",
        f"no daemon answers; {path} holds no GPU_MEMORY_LEAK finding in 24 h, but not how "
        f"long the daemon ran in that time; {alone}",
    )


def latency_checks(store: Any, objective: float | None) -> list[Check]:
    """P99.9 of each endpoint's end-to-end latency histogram against the objective. The
    histogram is the engine's cumulative one: since the engine started, warm-up included."""
    from moptd.serving.histogram import histogram_quantile

    subjects = store.signal_subjects("serving.e2e_request_latency")
    if not subjects:
        return [
            Check(
                "checklist P99.9 latency",
                "skipped",
                "no serving endpoint answered with a latency histogram",
            )
        ]
    out = []
    for subject in subjects:
        name = f"checklist P99.9 latency {subject}"
        buckets = _buckets(store, subject)
        total = buckets.get(math.inf, 0.0)
        q = histogram_quantile(P999, buckets)
        if q is None or total <= 0:
            out.append(Check(name, "skipped", "no request finished since the engine started"))
            continue
        detail = f"{q:.3g} s over {total:.0f} requests since the engine started"
        if total < 1 / (1 - P999):
            detail += " (under 1000 requests: P99.9 is about the slowest one)"
        if objective is None:
            out.append(
                Check(name, "skipped", detail + "; no objective (doctor.latency_p999_objective)")
            )
        elif q > objective:
            share = _share_over(buckets, objective)
            out.append(Check(name, "warning", detail + f", objective {objective:g} s; " + share))
        else:
            out.append(Check(name, "ok", detail + f", objective {objective:g} s"))
    return out


def _share_over(buckets: dict[float, float], objective: float) -> str:
    """How many requests took longer than the objective, as far as the buckets tell: exact
    when the objective is a bucket bound, else between the bounds around it."""
    total = buckets[math.inf]
    below = max((v for le, v in buckets.items() if le <= objective), default=0.0)
    above = min((v for le, v in buckets.items() if le >= objective), default=total)
    most, least = (total - below) / total, (total - above) / total
    if most == least:
        return f"{most:.2%} of requests took longer than {objective:g} s"
    return f"{least:.2%} to {most:.2%} of requests took longer than {objective:g} s"


def _buckets(store: Any, subject: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for labels, series in store.series_for("serving.e2e_request_latency", subject):
        le = dict(labels).get("le")
        value = series.last()
        if le is None or not isinstance(value, float):
            continue
        try:
            out[float(le)] = value
        except ValueError:
            continue
    return out


def log_files(config: Any, managed: Any) -> Iterator[tuple[str, Path]]:
    """Each serving log a file holds: the managed process's (its log_file, else the one the
    supervisor writes under the state directory) and each endpoint's log_file."""
    from moptd.serving.spec import SpecError, parse_endpoints

    if managed is not None:
        yield (
            managed.name,
            managed.log_file or config.state_dir / "serving" / managed.name / "log.txt",
        )
    serving = config.collectors.get("serving")
    if serving is None or not serving.enabled:
        return
    try:
        endpoints = parse_endpoints(serving.options.get("endpoints") or [])
    except SpecError:
        return  # the configuration check reported it when the file loaded
    for e in endpoints:
        if e.log_file:
            yield e.name, Path(e.log_file)


def read_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> tuple[list[str], bool]:
    """The log's last ``limit`` bytes as lines (the first, partial one dropped when cut),
    and whether it was cut."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        cut = size > limit
        if cut:
            f.seek(size - limit)
        data = f.read(limit)
    # split on newlines only, so line numbers are the ones an editor shows
    lines = data.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln.removesuffix("\r") for ln in (lines[1:] if cut else lines)], cut


def is_error_line(line: str) -> bool:
    """A line the engine logged as an error: vLLM's ERROR / CRITICAL prefix, TensorRT-LLM's
    [TensorRT-LLM][ERROR], or a Python traceback's first line."""
    from moptd.serving.logparse import split_prefix

    if "[TensorRT-LLM][ERROR]" in line:
        return True
    head, msg = split_prefix(line[:4096])
    if head.get("level") in ERROR_LEVELS:
        return True
    return msg.lstrip().startswith("Traceback (most recent call last):")


def log_checks(name: str, path: Path, cpu: bool = False) -> list[Check]:
    """Error lines in the engine's log, and whether CUDA graphs are in use (the last thing
    the log said about them)."""
    from moptd.serving.logparse import parse_line

    try:
        lines, cut = read_tail(path)
    except FileNotFoundError:
        return [Check(f"checklist log {name}", "skipped", f"{path} does not exist")]
    except OSError as exc:
        return [Check(f"checklist log {name}", "warning", f"{path}: {exc.strerror}")]
    errors = [(i, ln) for i, ln in enumerate(lines, 1) if is_error_line(ln)]
    span = f"the last {len(lines)} lines" if cut else f"{len(lines)} lines"
    if errors:
        (first_no, first), (last_no, _) = errors[0], errors[-1]
        where = f"lines {first_no}-{last_no}" + (" of those" if cut else "")
        detail = (
            f"{len(errors)} error line(s) in {span} of {path} ({where}); "
            f"first: {first.strip()[:160]}"
        )
        out = [Check(f"checklist log errors {name}", "warning", detail)]
    else:
        out = [Check(f"checklist log errors {name}", "ok", f"none in {span} of {path}")]
    state, reason = "", ""
    for ln in lines:
        # vLLM's engine start line names its device; a CPU build has no CUDA graphs
        cpu = cpu or ("Initializing a V1 LLM engine" in ln and "device_config=cpu" in ln)
        rec = parse_line(ln)
        if rec is not None and rec.stream == "serving.cuda_graphs":
            state, reason = str(rec.fields.get("state", "")), str(rec.fields.get("reason", ""))
    graphs = f"checklist CUDA graphs {name}"
    if cpu:
        out.append(Check(graphs, "skipped", "a CPU build of the engine has no CUDA graphs"))
    elif state == "captured":
        out.append(Check(graphs, "ok", "captured (the log says graph capturing finished)"))
    elif state == "disabled":
        out.append(
            Check(
                graphs, "warning", f"off ({reason}): the engine runs eager", "CUDA_GRAPHS_DISABLED"
            )
        )
    else:
        out.append(Check(graphs, "skipped", "the log does not say (not vLLM, or not started)"))
    return out
