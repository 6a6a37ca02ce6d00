"""Subcommand handlers."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from moptd.cli import EXIT_USAGE, setup_logging
from moptd.collectors import registry
from moptd.config import Config, ConfigError, find_config_path, load_config

EXIT_BLIND = 4  # a source could not be read (the kernel log): no finding is no all-clear


def load(args: argparse.Namespace) -> Config | None:
    try:
        config = load_config(find_config_path(args.config), registry())
    except ConfigError as exc:
        print(f"moptd: configuration error: {exc}", file=sys.stderr)
        return None
    return config


def _with_collector_flags(config: Config, enable: list[str], disable: list[str]) -> Config:
    known = set(config.collectors)
    for name in [*enable, *disable]:
        if name not in known:
            raise ConfigError(f"unknown collector {name!r} (known: {', '.join(sorted(known))})")
    collectors = dict(config.collectors)
    for name in enable:
        collectors[name] = dataclasses.replace(collectors[name], enabled=True)
    for name in disable:
        collectors[name] = dataclasses.replace(collectors[name], enabled=False)
    return dataclasses.replace(config, collectors=collectors)


def cmd_run(args: argparse.Namespace) -> int:
    config = load(args)
    if config is None:
        return EXIT_USAGE
    try:
        config = _with_collector_flags(config, args.collector, args.no_collector)
    except ConfigError as exc:
        print(f"moptd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(args.log_level or config.log_level)
    from moptd.daemon.app import run_daemon

    return run_daemon(config)


def cmd_config(args: argparse.Namespace) -> int:
    if args.schema:
        # the file's shape, not a file: nothing is read, so a broken file cannot hide it
        from moptd.config_schema import json_schema

        json.dump(json_schema(registry()), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    config = load(args)
    if config is None:
        return EXIT_USAGE
    if config.exporter_web_config is not None:
        from moptd.daemon.webconfig import load_web_config

        try:
            load_web_config(config.exporter_web_config)
        except ConfigError as exc:
            print(f"moptd: exporter.web_config_file: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.json:
        json.dump({"source": config.source, "config": config.raw}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(effective_yaml(config))
    return 0


def effective_yaml(config: Config) -> str:
    """The effective configuration as a configuration file: `moptd config > moptd.yaml`
    loads back to the same configuration."""
    import yaml

    text = yaml.safe_dump(dict(config.raw), sort_keys=False, default_flow_style=False)
    # permission bits read best in octal; YAML 1.1 (PyYAML, moptd's loader) reads 0660 so
    mode = config.raw.get("api", {}).get("socket_mode")
    if isinstance(mode, int):
        text = text.replace(f"  socket_mode: {mode}\n", f"  socket_mode: 0{mode:o}\n", 1)
    return f"# effective configuration ({config.source})\n" + text


def cmd_status(args: argparse.Namespace) -> int:
    config = load(args)
    if config is None:
        return EXIT_USAGE
    from moptd.cli import client, render

    view: dict[str, Any] | None = None
    note = ""
    if not args.offline:
        try:
            view = client.get_json(config.api_socket, "/v1/status")
        except client.DaemonUnreachable as exc:
            note = f"daemon not reachable ({exc}); ran one collection pass here"
    else:
        note = "offline: ran one collection pass here"
    if view is None:
        import asyncio  # the offline pass only: asking the daemon needs no event loop

        view = asyncio.run(offline_status(config))
    view["note"] = note
    blind = view.get("blind") or []  # a source not read: no finding below is an all-clear
    if args.json:
        json.dump(view, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from moptd.cli.render_explain import print_status_findings
        from moptd.cli.sanitize import for_terminal

        view = for_terminal(view)  # evidence never reaches a terminal raw; --json keeps it exact
        for line in for_terminal(blind):
            print(line)
        render.print_status(view)
        print_status_findings(view)
    return EXIT_BLIND if blind else 0


async def offline_status(config: Config) -> dict[str, Any]:
    """Collect once without a daemon, the same collectors a daemon would run."""
    import logging
    import time

    from moptd.daemon.assemble import make_runtime
    from moptd.daemon.health import blind_sources
    from moptd.daemon.views import status_view
    from moptd.store import SignalStore

    logging.getLogger("moptd").setLevel(logging.ERROR)
    store = SignalStore()
    runtime = make_runtime(config, store)
    # the host's CPU share from two /proc/stat readings 0.1 s apart: 10 ticks a core at
    # USER_HZ 100, as fine as a glance needs, and half the wait of the default 0.2 s
    await runtime.collect_once(again=("host",), gap=0.1)
    view = status_view(store, runtime.health.values(), time.time())
    view["blind"] = blind_sources(h.as_dict() for h in runtime.health.values())
    return view
