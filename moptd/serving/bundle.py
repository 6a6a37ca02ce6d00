"""Replay of a bundle's ``serving/<name>/`` directory into the serving signals.

The files (metrics snapshots, log, command line, model file listing, probe results; see
the bundle spec) go through the live collector's parsers, so a replayed endpoint gives the
samples and events a live one would. A present but malformed file raises
``ServingBundleError`` naming the file and line.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from moptd.batchpack import PACK_FROM, pack
from moptd.located import LocatedError
from moptd.observations import Batch, Event, labels_of
from moptd.serving.engines import view_from_samples
from moptd.serving.gates import classify_names
from moptd.serving.logparse import LogState, split_prefix
from moptd.serving.promtext import PromParseError, parse
from moptd.serving.signals import (
    HistogramWindow,
    cuda_environ,
    fill_engine_gpus,
    fill_from_log,
    fill_view,
)
from moptd.serving.spec import flag_value

FILES = ("metrics/", "log.txt", "cmdline.txt", "model_files.txt", "health.jsonl")
# Optional, and not listed as missing when absent (older bundles have none): the serving
# process's CUDA variables, one VAR=value a line (moptd.serving.signals.CUDA_ENV).
ENVIRON = "environ.txt"
_PROBE_OF = {"/health": "health", "/v1/models": "models", "/v1/completions": "generate"}
_TS = re.compile(r"^(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)$")
# A stamp with its year, at the start of a line (after a docker compose or CI "name  | "
# prefix): ONNX Runtime's own logger, "2024-03-27 06:33:23.219728338 [E:onnxruntime:...",
# the time point through date.h's operator<<, so UTC, in nanoseconds (100 ns on Windows);
# Python logging's "[2024-03-27 06:33:22,299]" and SGLang's "[2025-08-05 11:14:39 TP2]";
# uvicorn behind a CI's "[2024-09-05T00:38:34Z]"; TensorRT's "[06/08/2022-15:28:47]"
# (month first, as its logger's strftime "%m/%d/%Y-%H:%M:%S"). Without a zone the time is
# read as UTC, as vLLM's are.
_FULL_TS = re.compile(
    r"^(?:[\w.-]{0,64} *\| )?\s{0,8}\[?"
    r"(?:(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[ T]|(?P<mo2>\d\d)/(?P<d2>\d\d)/(?P<y2>\d{4})-)"
    r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<frac>\d{1,9}))?"
    r"(?P<zone>Z|[+-]\d\d:?\d\d)?(?=[\] ]|$)"
)


class ServingBundleError(LocatedError):
    """A serving directory's file that is present but malformed."""


@dataclass
class ServingReplay:
    observations: list[tuple[float, Batch]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # files of FILES not in the bundle
    # the year given to the log's year-less stamps where nothing in the bundle said it
    # (no scrape, no capture time, no dated line): this year, which the reader must be told
    assumed_year: int | None = None


def read_serving_dir(
    path: Path,
    window: float = 300.0,
    year: int | None = None,
    captured_at: float | None = None,
) -> ServingReplay:
    """``path`` is ``serving/<name>``; its subject is ``serving:<name>``. vLLM log lines
    carry no year and local time: ``year`` completes them as UTC (default: the first
    scrape's, else the year of ``captured_at``, the bundle's capture time, a December line
    in a January capture taking the year before; else the year of the log's first line
    that carries one, else this year). A line whose stamp holds its year (ONNX Runtime,
    TensorRT, SGLang, Python logging: ``full_date``) keeps its own date."""
    subject = f"serving:{path.name}"
    out = ServingReplay()
    scrape_times = _read_metrics(path / "metrics", subject, window, out)
    first = min(scrape_times, default=None)
    state = _read_log(path / "log.txt", subject, first, year, out, captured_at)
    t_static = first if first is not None else min((e.t for e in out.events), default=0.0)
    static = Batch()
    _read_cmdline(path / "cmdline.txt", subject, state, static, out)
    _read_model_files(path / "model_files.txt", subject, static, out)
    _read_environ(path / ENVIRON, subject, static)
    if state.kv_tokens is not None:
        static.add("serving.kv_cache_capacity_tokens", subject, state.kv_tokens)
    if state.max_concurrency is not None:
        static.add("serving.kv_cache_max_concurrency", subject, state.max_concurrency)
    if state.cuda_graphs:
        static.add("serving.cuda_graphs_enabled", subject, float(state.cuda_graphs == "captured"))
    if static.samples:
        out.observations.append((t_static, static))
    _read_health(path / "health.jsonl", subject, out)
    out.observations.sort(key=lambda o: o[0])
    out.events.sort(key=lambda e: e.t)
    return out


def _read_metrics(d: Path, subject: str, window: float, out: ServingReplay) -> list[float]:
    if not d.is_dir():
        out.missing.append("metrics/")
        return []
    hw = HistogramWindow(window)
    pages: list[tuple[float, Path]] = []
    for f in d.iterdir():
        if f.suffix != ".prom":
            continue
        try:
            t = float(f.stem)
        except ValueError:
            raise ServingBundleError(str(f), 0, "the file name must be a Unix time") from None
        if not math.isfinite(t):
            raise ServingBundleError(str(f), 0, "the file name must be a Unix time")
        pages.append((t, f))
    for t, f in sorted(pages):
        try:
            view = view_from_samples(parse(_text(f)))
        except PromParseError as exc:
            raise ServingBundleError(str(f), exc.line, str(exc).split(": ", 1)[-1]) from None
        b = Batch()
        b.add("serving.up", subject, 1.0)
        fill_view(b, subject, view, hw, t)
        if view.model:
            b.describe(subject, model=view.model)
        # a long bundle's pages are held packed until the replay takes them (issue 32)
        out.observations.append((t, pack(b) if len(pages) >= PACK_FROM else b))
    return [t for t, _ in pages]


def _read_log(
    f: Path,
    subject: str,
    first: float | None,
    year: int | None,
    out: ServingReplay,
    captured_at: float | None = None,
) -> LogState:
    state = LogState()
    if not f.exists():
        out.missing.append("log.txt")
        return state
    lines = _text(f).splitlines()
    # a line later than the capture by more than a day is from the year before
    rollover = year is None and first is None and captured_at is not None
    guessed = False
    if year is None:
        if first is not None:
            year = datetime.fromtimestamp(first, UTC).year
        elif captured_at is not None:
            year = datetime.fromtimestamp(captured_at, UTC).year
        else:  # the year the log's own dated lines give (TensorRT's beside vLLM's), else now
            dated = next((d for d in map(full_date, lines) if d is not None), None)
            guessed = dated is None
            year = datetime.fromtimestamp(dated if dated is not None else time.time(), UTC).year
    t = first if first is not None else 0.0
    for line in lines:
        dated = full_date(line)
        head, _ = split_prefix(line)
        stamp = None if dated is not None else _TS.match(head.get("ts", ""))
        if dated is not None:
            t = dated
        elif stamp is not None:
            mo, d, h, mi, s = (int(x) for x in stamp.groups())
            if guessed:
                out.assumed_year = year
            try:
                t = datetime(year, mo, d, h, mi, s, tzinfo=UTC).timestamp()
                if rollover and captured_at is not None and t > captured_at + 86400:
                    t = datetime(year - 1, mo, d, h, mi, s, tzinfo=UTC).timestamp()
            except ValueError:
                pass  # 02-29 in another year: keep the previous time
        state.observe(line)
        rec = state.record(line)
        if rec is None:
            continue
        state.update(rec, t)
        if first is None and rec.stream in _LOG_SIGNALS:
            # No metrics page in the bundle: the log's stats lines stand in for it
            b = Batch()
            fill_from_log(b, subject, state)
            out.observations.append((t, b))
        if rec.stream == "serving.engine_dead" and state.shutting_down:
            continue
        out.events.append(Event(rec.stream, subject, t, state.event_fields(rec), line[:1000]))
    rec = state.finish()
    if rec is not None:
        state.update(rec, t)
        out.events.append(
            Event(rec.stream, subject, t, state.event_fields(rec), str(rec.fields["message"]))
        )
    return state


def full_date(line: str) -> float | None:
    """The Unix time of a line that starts with a stamp holding its year (``_FULL_TS``);
    None for any other line, and for a date that does not exist (02-30, month 13)."""
    m = _FULL_TS.match(line[:200])
    if m is None:
        return None
    g = m.groupdict()
    year, month, day = (g["y"], g["mo"], g["d"]) if g["y"] else (g["y2"], g["mo2"], g["d2"])
    zone = g["zone"] or "Z"
    offset = 0 if zone == "Z" else int(zone[0] + "1") * (int(zone[1:3]) * 60 + int(zone[-2:]))
    try:
        when = datetime(
            int(year), int(month), int(day), int(g["h"]), int(g["mi"]), int(g["s"]), tzinfo=UTC
        )
    except ValueError:
        return None
    return when.timestamp() - offset * 60 + float("0." + (g["frac"] or "0"))


# The log records that carry what a metrics page would (fill_from_log).
_LOG_SIGNALS = frozenset({"serving.log_stats", "serving.preemption"})


def _read_cmdline(f: Path, subject: str, state: LogState, b: Batch, out: ServingReplay) -> None:
    if not f.exists():
        out.missing.append("cmdline.txt")
        return
    args = tuple(a.strip() for a in _text(f).splitlines() if a.strip())
    b.describe(subject, cmdline=" ".join(args)[:2000])
    seqs = flag_value(args, "--max-num-seqs")
    if seqs is not None:
        if not seqs.isdigit():
            raise ServingBundleError(
                str(f),
                _line_of(args, "--max-num-seqs") + 1,
                f"--max-num-seqs {seqs!r} is not a number",
            )
        b.add("serving.max_num_seqs", subject, float(seqs))
    if "--enforce-eager" in args and not state.cuda_graphs:
        state.cuda_graphs = "disabled"


def _read_environ(f: Path, subject: str, b: Batch) -> None:
    """The GPUs the process's CUDA_VISIBLE_DEVICES names, as serving.gpu (the process
    list of a recorded host is not its PIDs: no serving.process here)."""
    if f.exists():
        fill_engine_gpus(b, subject, [], cuda_environ(_text(f).encode()))


def _line_of(args: tuple[str, ...], flag: str) -> int:
    return next((i for i, a in enumerate(args) if a.startswith(flag)), 0) + 1


def _read_model_files(f: Path, subject: str, b: Batch, out: ServingReplay) -> None:
    if not f.exists():
        out.missing.append("model_files.txt")
        return
    names = []
    for line in _text(f).splitlines():
        parts = line.split()
        # `ls -l`: mode links owner group size month day time NAME; skip "total N"
        if len(parts) >= 9 and parts[0][:1] in "-l":
            names.append(parts[8])
    files = classify_names(names)
    b.add("serving.model_tokenizer_present", subject, float(files.has_tokenizer))
    b.add("serving.model_unsafe_weights", subject, float(files.unsafe_only))


def _read_health(f: Path, subject: str, out: ServingReplay) -> None:
    if not f.exists():
        out.missing.append("health.jsonl")
        return
    for n, line in enumerate(_text(f).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            t = float(rec["t"])
            endpoint = str(rec["endpoint"])
            status = int(rec.get("status") or 0)
            latency = float(rec.get("latency_s", 0.0))
        except (ValueError, KeyError, TypeError) as exc:
            raise ServingBundleError(
                str(f), n, f"expected {{t, endpoint, status, latency_s}}: {exc}"
            ) from None
        probe = _PROBE_OF.get(endpoint, endpoint.strip("/").replace("/", "_") or "root")
        b = Batch()
        ok = 200 <= status < 300
        b.add("serving.probe_success", subject, float(ok), labels_of(probe=probe))
        b.add("serving.probe_latency", subject, latency, labels_of(probe=probe))
        if probe == "health":
            b.add("serving.healthy", subject, float(ok))
        out.observations.append((t, b))


def _text(f: Path) -> str:
    try:
        return f.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ServingBundleError(str(f), 0, f"cannot read: {exc.strerror}") from None
