"""Every command's exit status, declared once: docs/cli.md and the man page's EXIT STATUS
section are generated from this table (tools/gen_docs.py), and tests hold the commands'
own constants to it. 2 is also argparse's status for a usage error, before any command runs.
"""

from __future__ import annotations

ANY_COMMAND: tuple[tuple[int, str], ...] = (
    (
        2,
        "usage error: an unknown option or argument (argparse), or a configuration that "
        "does not load",
    ),
    (130, "interrupted (Ctrl-C)"),
)

EXIT_STATUS: dict[str, tuple[tuple[int, str], ...]] = {
    "run": (
        (0, "stopped by SIGTERM or SIGINT"),
        (
            1,
            "cannot listen on exporter.listen or api.listen (the message names the key and "
            "the holder)",
        ),
        (2, "the configuration or exporter.web_config_file does not load (file, line and key)"),
    ),
    "status": (
        (0, "printed (from the daemon, or one collection pass here when it is down)"),
        (4, "printed, but the kernel log could not be read: Xids unknown"),
    ),
    "explain": (
        (0, "printed"),
        (
            2,
            "an unknown --code, a bad --since, --runbook for a code without a runbook, or a "
            "GPU the host does not have",
        ),
        (3, "a --bundle input could not be used at all"),
        (4, "printed, but the kernel log could not be read: Xids unknown, no all-clear"),
    ),
    "doctor": (
        (0, "ready: no warning or critical check"),
        (1, "the worst check is a warning"),
        (2, "the worst check is critical"),
    ),
    "record": ((0, "bundle written"), (1, "the bundle could not be written")),
    "replay": (
        (0, "no warning or critical finding"),
        (1, "the worst finding is a warning"),
        (2, "the worst finding is critical"),
        (3, "an input (file, line) or the rule set could not be used"),
    ),
    "replay --diff": (
        (0, "the two inputs show the same versions and findings"),
        (1, "versions (versions.json) or findings (opened, closed) changed"),
        (3, "an input (file, line) or the rule set could not be used"),
    ),
    "rules check": ((0, "every rule is valid"), (1, "problems, each with file and line")),
    "rules test": ((0, "every test passed"), (1, "a test failed or a file has errors")),
    "serving status": ((0, "every endpoint answers"), (1, "an endpoint is down")),
    "serving restart": ((0, "restarted"), (1, "the daemon refused or the restart failed")),
    "serving logs": (
        (0, "printed"),
        (1, "no log yet; otherwise tail's or journalctl's own status"),
    ),
    "install-service": (
        (0, "installed (or shown, with --dry-run)"),
        (
            1,
            "installing failed, or the unit could not execute the moptd it names (its User= "
            "may not, or ProtectHome=/PrivateTmp= hide it): the reason is said",
        ),
    ),
    "reload": (
        (0, "SIGHUP sent to the daemon"),
        (1, "the pid is not a running `moptd run`, or it cannot be signalled"),
        (2, "no pid: neither --pid nor $MAINPID"),
    ),
    "config": ((0, "the configuration is valid and printed (or the schema, with --schema)"),),
    "history": (
        (0, "printed (also when no fault is recorded)"),
        (1, "no readable findings database in the state directory"),
    ),
}
