"""`moptd record --duration D --out DIR|FILE.tar.gz`: a bundle from the live host."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from moptd.cli import EXIT_USAGE


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("record", help="record a bundle (docs/bundle.md) from this host")
    p.add_argument(
        "--duration", required=True, metavar="D", help="how long to sample (e.g. 30s, 5m)"
    )
    p.add_argument(
        "--interval",
        default="5s",
        metavar="I",
        help="time between GPU dumps and serving scrapes (default 5s)",
    )
    p.add_argument(
        "--out", required=True, metavar="DIR|FILE.tar.gz", help="a new directory, or a .tar.gz file"
    )
    p.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="TEXT",
        help="a note for bundle.yaml (repeatable)",
    )
    p.add_argument("--config", metavar="PATH", help="configuration file (serving endpoints)")
    p.add_argument(
        "--no-redact",
        action="store_true",
        help="keep secrets (API keys, tokens, passwords, credentials in URLs) that record "
        "otherwise replaces with [REDACTED] (docs/security.md)",
    )
    p.add_argument(
        "--mask-hosts",
        action="store_true",
        help="also replace this host's names, names in its domain and IPv4 addresses with "
        "consistent pseudonyms (host0, 10.255.0.1), as sosreport's --clean does",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_record)


def cmd_record(args: argparse.Namespace) -> int:
    from moptd.cli.commands import load
    from moptd.durations import parse_duration
    from moptd.record.writer import Recorder, RecordOptions

    try:
        duration = parse_duration(args.duration)
        interval = parse_duration(args.interval)
    except ValueError as exc:
        print(f"moptd record: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if interval <= 0:
        print("moptd record: --interval must be more than 0", file=sys.stderr)
        return EXIT_USAGE
    config = load(args)
    if config is None:
        return EXIT_USAGE
    try:
        serving = serving_sources(config)
    except ValueError as exc:
        print(f"moptd record: {config.source}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from moptd.cli.doctor_versions import configured_site_packages

    try:
        site_packages = configured_site_packages(config)
    except ValueError as exc:
        print(f"moptd record: {exc}", file=sys.stderr)
        return EXIT_USAGE
    host = config.collectors.get("host")
    host_options = dict(host.options) if host is not None else {}
    wsl_dirs: dict[str, Any] = {}
    if "wsl_lib_dir" in host_options:
        wsl_dirs["wsl_lib_dir"] = Path(host_options["wsl_lib_dir"])
    if "guest_lib_dirs" in host_options:
        wsl_dirs["guest_lib_dirs"] = tuple(Path(d) for d in host_options["guest_lib_dirs"])
    opts = RecordOptions(
        duration,
        interval,
        procfs=config.procfs,
        serving=serving,
        extra_notes=args.note,
        site_packages=site_packages,
        redact=not args.no_redact,
        mask_hosts=_own_names() if args.mask_hosts else None,
        **wsl_dirs,
    )
    out = Path(args.out)
    with _progress(args.quiet) as progress:
        try:
            result = Recorder(opts, progress).record(out)
        except (FileExistsError, OSError) as exc:
            print(f"moptd record: {exc}", file=sys.stderr)
            return 1
    print(f"bundle written to {result.path} ({len(result.files)} files)")
    print(redaction_summary(result.redactor, len(result.files)))
    for note in result.notes:
        print(f"  not captured: {note}")
    return 0


def redaction_summary(redactor: Any, files: int) -> str:
    """One line: what record took out of the bundle, and how to keep it."""
    if redactor.secrets:
        n, in_files = redactor.secret_count()
        if n:
            line = (
                f"redacted {n} secret{'s' if n != 1 else ''} in {in_files} "
                f"file{'s' if in_files != 1 else ''}; --no-redact keeps them"
            )
        else:
            line = f"redacted no secrets (none found in {files} files)"
    else:
        line = "secrets NOT redacted (--no-redact): share this bundle with care"
    if redactor.masker is not None:
        h, in_files = redactor.host_count()
        line += (
            f"; masked {h} host name{'s' if h != 1 else ''} and addresses in {in_files} "
            f"file{'s' if in_files != 1 else ''}"
        )
    return line


def _own_names() -> list[str]:
    """This host's names as --mask-hosts masks them: its host name first (host0), then its
    fully qualified name when that differs."""
    import socket

    names = [socket.gethostname()]
    fqdn = socket.getfqdn()
    if fqdn and fqdn not in names:
        names.append(fqdn)
    return names


def serving_sources(config: Any) -> list[Any]:
    from moptd.record.writer import ServingSource
    from moptd.serving.spec import parse_endpoints, parse_managed

    cc = config.collectors.get("serving")
    if cc is None:
        return []
    out: dict[str, ServingSource] = {}
    for ep in parse_endpoints(cc.options.get("endpoints") or []):
        out[ep.name] = ServingSource(ep.name, ep.url.rstrip("/") + ep.metrics_path)
    managed = parse_managed(cc.options.get("managed") or None)
    if managed is not None:
        ep = managed.endpoint()
        out[managed.name] = ServingSource(
            managed.name,
            ep.url + ep.metrics_path,
            managed.log_file,
            managed.command,
            managed.model_dir,
            pid=managed_pid(config.api_socket, managed.name),
            managed=True,
        )
    return list(out.values())


def managed_pid(socket_path: Path, name: str) -> int | None:
    """The managed serving process's PID, as the daemon that runs it says (GET /v1/serving);
    None when no daemon answers or the process is not running. Only reads."""
    from moptd.cli.client import DaemonUnreachable, get_json

    try:
        body = get_json(socket_path, "/v1/serving?lines=1", timeout=2.0)
    except DaemonUnreachable:
        return None
    status = body.get("managed") if isinstance(body, dict) else None
    if not isinstance(status, dict) or status.get("name") != name:
        return None
    pid = status.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


class _progress:
    """A progress bar on a terminal, a line per stage otherwise (stderr either way)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self._bar: Any = None
        self._task: Any = None
        self._last = ""

    def __enter__(self) -> Any:
        if self.quiet:
            return lambda _what, _done: None
        if sys.stderr.isatty():
            from rich.progress import Progress

            self._bar = Progress(transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("recording", total=1.0)
            return self._update_bar
        return self._update_lines

    def _update_bar(self, what: str, done: float) -> None:
        self._bar.update(self._task, completed=done, description=what)

    def _update_lines(self, what: str, done: float) -> None:
        stage = what.split(" (")[0]
        if stage != self._last:
            print(f"moptd record: {what}", file=sys.stderr)
            self._last = stage

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
