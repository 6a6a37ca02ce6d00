"""`moptd serving status|restart|logs`: the serving endpoints and the managed process.

``status`` scrapes and probes each configured endpoint once, in this process, with the
serving collector, which only reads: the managed process is scraped as an endpoint and
never started here. Its supervisor (restarts, back-off, crash loop) lives in the daemon
(GET /v1/serving); ``status`` shows the systemd backend's unit state (systemctl show) and
the process backend's log file. ``restart`` works for the systemd backend; for the process
backend it asks the daemon (POST /v1/serving/NAME/restart) and says so when it is not there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from moptd.cli import EXIT_USAGE


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serving", help="serving endpoints and the managed serving process")
    ssub = p.add_subparsers(dest="serving_command", metavar="ACTION")
    status = ssub.add_parser("status", help="scrape and probe each serving endpoint once")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--config", metavar="PATH", help="configuration file")
    status.set_defaults(func=cmd_status)
    restart = ssub.add_parser("restart", help="restart the managed serving process")
    restart.add_argument("--config", metavar="PATH", help="configuration file")
    restart.set_defaults(func=cmd_restart)
    drain = ssub.add_parser(
        "drain",
        help="hold the managed engine's readiness off (GET /v1/serving/NAME/ready answers 503, "
        "so a balancer stops sending; requests in flight finish); --undo lets it go",
    )
    drain.add_argument("name", help="the managed serving process (collectors.serving.managed.name)")
    drain.add_argument("--undo", action="store_true", help="end the drain: readiness as before")
    drain.add_argument("--config", metavar="PATH", help="configuration file")
    drain.set_defaults(func=cmd_drain)
    logs = ssub.add_parser("logs", help="the managed serving process's log")
    logs.add_argument("-n", "--lines", type=int, default=100, help="lines to show (default 100)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("--config", metavar="PATH", help="configuration file")
    logs.set_defaults(func=cmd_logs)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help(sys.stderr)
    return EXIT_USAGE


def _options(args: argparse.Namespace) -> tuple[dict[str, Any], Path] | None:
    from moptd.cli.commands import load

    config = load(args)
    if config is None:
        return None
    cc = config.collectors.get("serving")
    return (dict(cc.options) if cc else {}), config.state_dir


def _managed(options: dict[str, Any]) -> Any:
    from moptd.serving.spec import SpecError, parse_managed

    try:
        return parse_managed(options.get("managed"))
    except SpecError as exc:
        print(f"moptd: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def cmd_status(args: argparse.Namespace) -> int:
    got = _options(args)
    if got is None:
        return EXIT_USAGE
    options, state_dir = got
    from moptd.serving.spec import SpecError, parse_endpoints

    managed = _managed(options)
    try:
        endpoints = [
            {"name": e.name, "url": e.url, "engine": e.engine, "probes": list(e.probes)}
            for e in parse_endpoints(options.get("endpoints", []))
        ]
    except SpecError as exc:
        print(f"moptd: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if managed is not None:
        ep = managed.endpoint()
        endpoints.append(
            {"name": ep.name, "url": ep.url, "engine": ep.engine, "probes": ["health", "models"]}
        )
    if not endpoints:
        note = "no serving endpoint configured (collectors.serving.endpoints / .managed)"
        if args.json:  # one JSON object, whatever there is to say
            print(json.dumps({"endpoints": [], "note": note}, indent=2))
        else:
            print(note)
        return 0
    report = asyncio.run(_scrape_once(endpoints, options, state_dir))
    if managed is not None:
        report["managed"] = _managed_state(managed, state_dir)
    down = [e for e in report["endpoints"] if not e.get("up")]
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        from moptd.cli.sanitize import for_terminal

        # a scrape error or a label value is the endpoint's text: escaped; --json keeps it
        _print_status(for_terminal(report))
    return 1 if down else 0  # the same status with --json (docs/cli.md)


async def _scrape_once(
    endpoints: list[dict[str, Any]], options: dict[str, Any], state_dir: Path
) -> dict[str, Any]:
    from moptd.collector import CollectorContext
    from moptd.collectors.serving import ServingCollector

    # the managed endpoint is already in `endpoints`, with the probes a one-off check wants
    opts = {k: v for k, v in options.items() if k != "managed"}
    opts["endpoints"] = endpoints
    c = ServingCollector(CollectorContext(options=opts, state_dir=state_dir))
    await c.start()
    try:
        batch = await c.collect()
    finally:
        await c.stop()
    out: list[dict[str, Any]] = []
    for ep in endpoints:
        subject = f"serving:{ep['name']}"
        values: dict[str, Any] = {}
        for s in batch.samples:
            if s.subject != subject:
                continue
            key = s.signal.split(".", 1)[1]
            if s.labels:
                key += "{" + ",".join(f"{k}={v}" for k, v in s.labels) + "}"
            values[key] = s.value
        out.append(
            {
                "name": ep["name"],
                "url": ep["url"],
                "up": values.get("up") == 1.0,
                "attrs": batch.attrs.get(subject, {}),
                "signals": values,
            }
        )
    return {"endpoints": out}


def _managed_state(managed: Any, state_dir: Path) -> dict[str, Any]:
    from moptd.serving.systemd import parse_show, systemctl_argv

    state: dict[str, Any] = {"name": managed.name, "backend": managed.backend}
    if managed.backend == "systemd":
        try:
            r = subprocess.run(
                systemctl_argv("show", managed.name),
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            state["systemd"] = parse_show(r.stdout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            state["systemd_error"] = str(exc)
    else:
        state["log_file"] = str(_log_file(managed, state_dir))
        state["note"] = "restarts and back-off state are kept by the daemon (moptd run)"
    return state


def _print_status(report: dict[str, Any]) -> None:
    for ep in report["endpoints"]:
        sig = ep["signals"]
        print(f"{ep['name']}  {ep['url']}  {'up' if ep['up'] else 'DOWN'}")
        if not ep["up"]:
            print(f"  scrape: {ep['attrs'].get('scrape_error', '')}")
        for key in (
            "healthy",
            "requests_running",
            "requests_waiting",
            "kv_cache_usage",
            "engine_steps",
            "engine_metrics_present",
        ):
            if key in sig:
                print(f"  {key}: {sig[key]:g}")
        for key, value in sorted(sig.items()):
            if key.startswith("probe_success"):
                print(f"  {key}: {'ok' if value == 1.0 else 'FAILED'}")
    managed = report.get("managed")
    if managed:
        print(f"managed {managed['name']} ({managed['backend']})")
        for key, value in sorted(managed.items()):
            if key not in ("name", "backend"):
                print(f"  {key}: {value}")


def _log_file(managed: Any, state_dir: Path) -> Path:
    return Path(managed.log_file or state_dir / "serving" / managed.name / "log.txt")


def cmd_restart(args: argparse.Namespace) -> int:
    got = _options(args)
    if got is None:
        return EXIT_USAGE
    managed = _managed(got[0])
    if managed is None:
        print(
            "moptd: no managed serving process configured (collectors.serving.managed)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if managed.backend != "systemd":
        return _restart_through_daemon(args, managed.name)
    from moptd.serving.systemd import systemctl_argv

    for action in ("reset-failed", "restart"):
        argv = systemctl_argv(action, managed.name)
        print("+ " + " ".join(argv))
        rc = subprocess.run(argv, check=False).returncode
        if rc != 0 and action == "restart":
            return rc
    return 0


def _restart_through_daemon(args: argparse.Namespace, name: str) -> int:
    """The child-process backend lives in the daemon: ask it over the API."""
    from moptd.cli import client
    from moptd.cli.commands import load

    config = load(args)
    if config is None:
        return EXIT_USAGE
    try:
        status, body = client.request(
            config.api_socket, "POST", f"/v1/serving/{name}/restart", timeout=180
        )
    except client.DaemonUnreachable as exc:
        print(
            f"moptd: the managed process is a child of the daemon, which is not reachable ({exc})",
            file=sys.stderr,
        )
        return 1
    if status != 200:
        reason = body.get("error") if isinstance(body, dict) else body
        print(f"moptd: restart refused (HTTP {status}): {reason}", file=sys.stderr)
        return 1
    print(f"restarted {name}: {body['managed'].get('state')}")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    """Ask the daemon to hold (or, --undo, release) the managed engine's readiness."""
    from moptd.cli import client
    from moptd.cli.commands import load

    config = load(args)
    if config is None:
        return EXIT_USAGE
    method = "DELETE" if args.undo else "POST"
    try:
        status, body = client.request(config.api_socket, method, f"/v1/serving/{args.name}/drain")
    except client.DaemonUnreachable as exc:
        print(
            f"moptd: the daemon holds the engine's readiness and is not reachable ({exc})",
            file=sys.stderr,
        )
        return 1
    if status != 200 or not isinstance(body, dict):
        reason = body.get("error") if isinstance(body, dict) else body
        print(f"moptd: drain refused (HTTP {status}): {reason}", file=sys.stderr)
        return EXIT_USAGE if status == 404 else 1
    if body.get("drained"):
        print(
            f"drained {body['name']}: /v1/serving/{body['name']}/ready answers 503 until "
            f"`moptd serving drain {body['name']} --undo`"
        )
    else:
        print(
            f"undrained {body['name']}: ready = {str(body.get('ready')).lower()} "
            f"({body.get('reason')})"
        )
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    got = _options(args)
    if got is None:
        return EXIT_USAGE
    options, state_dir = got
    managed = _managed(options)
    if managed is None:
        print(
            "moptd: no managed serving process configured (collectors.serving.managed)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if managed.backend == "systemd":
        from moptd.serving.systemd import journal_argv

        argv = journal_argv(managed.name, follow=args.follow, lines=args.lines)
        os.execvp(argv[0], argv)  # noqa: S606 - hand the terminal to journalctl
    path = _log_file(managed, state_dir)
    if not path.exists():
        print(
            f"moptd: no log yet at {path} (the daemon writes it while it runs the process)",
            file=sys.stderr,
        )
        return 1
    argv = ["tail", "-n", str(args.lines), *(["-F"] if args.follow else []), str(path)]
    if not sys.stdout.isatty():
        return subprocess.run(argv, check=False).returncode  # into a pipe or a file: exact
    return _tail_escaped(argv)


def _tail_escaped(argv: list[str]) -> int:
    """tail's lines with every control and bidi character escaped (moptd.termsafe): an
    engine's log holds what its clients sent, and a terminal would obey an ESC in it."""
    from moptd.termsafe import escape_text

    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                sys.stdout.write(escape_text(raw.decode("utf-8", "replace")))
                sys.stdout.flush()
        except KeyboardInterrupt:
            proc.terminate()
            return 130
    return proc.returncode
