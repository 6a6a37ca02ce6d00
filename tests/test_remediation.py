"""The remediation policy and its actuator: the policy refused at load with file, line and
key; the guards (dry run, engine uptime, rate limit, circuit breaker, verify timeout) over a
real supervised child process; the audit trail in the findings database, /metrics and the
API; a SIGHUP reload that keeps the policy in force when the new one is bad."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from moptd.collectors import registry
from moptd.config import ConfigError, load_config, parse_config
from moptd.daemon.api import make_api_app
from moptd.daemon.auth import ApiAuth
from moptd.daemon.managed import ManagedProcess
from moptd.daemon.remediation import BREAKER_RULE, SUSPENDED, Remediator
from moptd.daemon.runtime import CollectorRuntime
from moptd.diagnose.model import Finding, Transition
from moptd.findings.db import transition_record
from moptd.findings.service import Diagnosis, build_diagnosis
from moptd.remediation.policy import CAUSES, REMEDIES, Policy, PolicyError, parse_policy
from moptd.serving.spec import parse_managed
from moptd.store import SignalStore

RULE = "serving-scheduler-stall"
SUBJECT = "serving:t"
CODE = "SCHEDULER_STALL"
TOKEN = "t0ken-for-the-tcp-api"


def config_error(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "moptd.yaml", registry())
    return str(exc.value)


# --- the policy at load ---


def test_off_by_default_with_documented_guards() -> None:
    cfg = parse_config("", "<defaults>", registry())
    assert cfg.remediation == Policy()
    assert cfg.remediation.enabled is False
    g = cfg.remediation.guards
    assert (g.dry_run, g.min_interval, g.breaker_count, g.breaker_window) == (True, 600, 3, 3600)
    assert (g.min_uptime, g.verify_timeout) == (300, 600)


def test_a_policy_loads() -> None:
    text = """\
remediation:
  enabled: true
  dry_run: false
  min_interval: 30s
  policy:
    - code: SCHEDULER_STALL
      remedy: restart_engine
    - code: KV_CACHE_PRESSURE
      remedy: restart_with
      args: ["--max-num-seqs=4"]
      env: {VLLM_CPU_KVCACHE_SPACE: "2"}
    - code: SERVING_DOWN
      remedy: readiness_off
"""
    p = parse_config(text, "moptd.yaml", registry()).remediation
    assert p.enabled
    assert p.guards.min_interval == 30.0
    assert [e.remedy for e in p.entries] == ["restart_engine", "restart_with", "readiness_off"]
    assert p.entries[1].args == ("--max-num-seqs=4",)
    assert p.entry_for("SERVING_DOWN") is p.entries[2]
    assert p.entry_for("CUDA_OOM") is None


@pytest.mark.parametrize(
    ("entry", "line", "key", "why"),
    [
        ("{code: NOT_A_CODE, remedy: restart_engine}", 3, "policy[0].code", "unknown diagnosis"),
        ("{code: SCHEDULER_STALL, remedy: reboot}", 3, "policy[0].remedy", "unknown remedy"),
        ("{code: GPU_LOST, remedy: reset_gpu}", 3, "policy[0].remedy", "never resets a GPU"),
        ("{code: SERVING_DOWN, remedy: restart_engine}", 3, "policy[0].remedy", "loop-prone"),
        (
            "{code: CUDA_OOM, remedy: restart_with, args: [--enforce-eager]}",
            3,
            "policy[0].remedy",
            "loop-prone",
        ),
        (
            "{code: REMEDIATION_SUSPENDED, remedy: restart_engine}",
            3,
            "policy[0].code",
            "about moptd itself",
        ),
        (
            "{code: SCHEDULER_STALL, remedy: restart_engine, args: [-x]}",
            3,
            "policy[0].args",
            "only restart_with",
        ),
        ("{code: SCHEDULER_STALL, remedy: restart_with}", 3, "policy[0]", "needs the changed"),
        (
            "{code: SCHEDULER_STALL, remedy: restart_with, args: [--port=1]}",
            3,
            "policy[0].args",
            "another model or address",
        ),
        ("{code: SCHEDULER_STALL, remedy: none, when: always}", 3, "policy[0].when", "unknown key"),
    ],
)
def test_a_bad_entry_is_refused_with_file_line_and_key(
    entry: str, line: int, key: str, why: str
) -> None:
    text = f"remediation:\n  policy:\n    - {entry}\n"
    msg = config_error(text)
    assert msg.startswith(f"moptd.yaml:{line}: key 'remediation.{key}'"), msg
    assert why in msg


def test_a_second_remedy_for_one_code_is_refused() -> None:
    text = """\
remediation:
  policy:
    - {code: SCHEDULER_STALL, remedy: restart_engine}
    - {code: SCHEDULER_STALL, remedy: readiness_off}
"""
    msg = config_error(text)
    assert msg.startswith("moptd.yaml:4: key 'remediation.policy[1].code'"), msg


@pytest.mark.parametrize(
    ("guard", "value"),
    [
        ("min_interval", "null"),
        ("min_interval", "0s"),
        ("breaker_count", "0"),
        ("breaker_count", "null"),
        ("verify_timeout", "0"),
        ("min_uptime", "null"),
        ("breaker_window", "30d"),
        ("dry_run", "null"),
    ],
)
def test_a_guard_cannot_be_switched_off(guard: str, value: str) -> None:
    text = f"remediation:\n  enabled: true\n  {guard}: {value}\n"
    msg = config_error(text)
    assert msg.startswith(f"moptd.yaml:3: key 'remediation.{guard}'"), msg


def test_no_remedy_causes_a_code_it_may_answer() -> None:
    """The loop check covers the whole closed set: whatever a remedy can cause, the
    policy refuses that remedy for it."""
    assert set(CAUSES) == set(REMEDIES)
    for remedy, caused in CAUSES.items():
        for code in caused:
            with pytest.raises(PolicyError, match="loop-prone"):
                parse_policy({"policy": [{"code": code, "remedy": remedy}]})


# --- the actuator over a real child process ---


def sleeper(**extra: Any):  # type: ignore[no-untyped-def]
    raw: dict[str, Any] = {
        "name": "t",
        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
        "device": "cpu",
        "port": 1,
        "backoff_initial": 0.05,
        "stop_grace": 2,
    }
    raw.update(extra)
    spec = parse_managed(raw)
    assert spec is not None
    return spec


def policy(remedy: str = "restart_engine", **guards: Any) -> Policy:
    section: dict[str, Any] = {
        "enabled": True,
        "dry_run": False,
        "min_uptime": 0.001,
        "min_interval": 0.001,
        "verify_timeout": 5,
    }
    section.update(guards)
    entry: dict[str, Any] = {"code": CODE, "remedy": remedy}
    if remedy == "restart_with":
        entry["args"] = ["--extra"]
        entry["env"] = {"STALL_FIX": "1"}
    section["policy"] = [entry]
    return parse_policy(section)


class Rig:
    def __init__(self, tmp: Path, pol: Policy, **spec: Any) -> None:
        self.store = SignalStore(retention=3600)
        rules_dir = tmp / "rules"
        rules_dir.mkdir()
        self.diagnosis: Diagnosis = build_diagnosis(self.store, tmp, [rules_dir])
        self.managed = ManagedProcess(sleeper(**spec), self.store.add_events, tmp)
        self.remediator = Remediator(pol, self.managed, self.diagnosis, self.store)

    async def __aenter__(self) -> Rig:
        await self.diagnosis.start()
        await self.remediator.start()
        await self.managed.start()
        await until(lambda: self.managed.supervisor.pid is not None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.remediator.stop()
        await self.managed.stop()
        await self.diagnosis.stop()

    def fire(self, rule: str = RULE, code: str = CODE) -> None:
        """A finding on the engine starts firing, as the diagnosis loop hands it on."""
        now = time.time()
        f = Finding(rule, SUBJECT, code, "critical", "firing", "frozen", now, now, now)
        self.diagnosis.rules.restore([f])
        tr = transition_record(
            now, rule, SUBJECT, code, "critical", "pending", "firing", "frozen", f.to_json()
        )
        self.diagnosis.db.record_transition(tr)
        self.remediator.on_transitions(
            [Transition(now, rule, SUBJECT, code, "critical", "pending", "firing", "frozen")]
        )

    def resolve(self, rule: str = RULE, code: str = CODE) -> None:
        now = time.time()
        self.diagnosis.rules.lifecycle.findings.pop((rule, SUBJECT), None)
        self.diagnosis.db.record_transition(
            transition_record(now, rule, SUBJECT, code, "critical", "firing", "resolved")
        )
        self.remediator.on_transitions(
            [Transition(now, rule, SUBJECT, code, "critical", "firing", "resolved")]
        )

    def audit(self) -> list[dict[str, Any]]:
        return list(reversed(self.diagnosis.db.remediations()))

    def outcomes(self) -> list[str]:
        return [r["outcome"] for r in self.audit()]

    def counter(self, outcome: str, remedy: str = "restart_engine") -> float | None:
        labels = (("code", CODE), ("outcome", outcome), ("remedy", remedy))
        v = self.store.latest("remediation.total", "node", labels)
        return v if isinstance(v, float) else None


async def until(cond, limit: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    # a liveness bound, not a timing: CI's 2 cores under a full suite once took over 20 s
    # from the restart to the audit's outcome (3 s alone)
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            pytest.fail("condition not met in time")
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_restart_engine_restarts_and_the_resolved_finding_makes_it_done(
    tmp_path: Path,
) -> None:
    async with Rig(tmp_path, policy()) as rig:
        before = rig.managed.supervisor.pid
        rig.fire()
        await until(lambda: rig.managed.supervisor.pid not in (None, before))
        await until(lambda: rig.outcomes() == ["verifying"])
        rig.resolve()
        await until(lambda: rig.outcomes() == ["done"])
        row = rig.audit()[0]
        assert row["actor"] == "moptd"
        assert row["entry"] == "remediation.policy[0]"
        assert row["remedy"] == "restart_engine"
        assert row["pid_before"] == before
        assert "SCHEDULER_STALL fired on serving:t" in row["why"]
        assert row["finding_id"] is not None
        assert row["finished_at"] >= row["t"]
        assert rig.counter("done") == 1.0
        detail = rig.diagnosis.db.get(int(row["finding_id"]))
        assert detail is not None
        assert [r["outcome"] for r in detail["remediations"]] == ["done"]


@pytest.mark.slow
async def test_restart_with_adds_the_setting(tmp_path: Path) -> None:
    async with Rig(tmp_path, policy("restart_with")) as rig:
        before = rig.managed.supervisor.pid
        rig.fire()
        await until(lambda: rig.managed.supervisor.pid not in (None, before))
        spec = rig.managed.supervisor.spec
        assert spec.command[-1] == "--extra"
        assert spec.env["STALL_FIX"] == "1"
        rig.resolve()
        await until(lambda: rig.outcomes() == ["done"])
        assert rig.audit()[0]["changed"] == ["--extra", "STALL_FIX=1"]


@pytest.mark.slow
async def test_dry_run_records_what_it_would_do_and_does_nothing(tmp_path: Path) -> None:
    async with Rig(tmp_path, policy(dry_run=True)) as rig:
        before = rig.managed.supervisor.pid
        rig.fire()
        await until(lambda: rig.outcomes() == ["dry-run"])
        assert rig.audit()[0]["reason"] == "dry run: would restart the engine"
        await asyncio.sleep(0.3)
        assert rig.managed.supervisor.pid == before
        assert rig.managed.supervisor.restarts == 0
        assert rig.counter("dry-run") == 1.0


@pytest.mark.slow
async def test_a_remedy_that_does_not_clear_its_finding_failed(tmp_path: Path) -> None:
    async with Rig(tmp_path, policy(verify_timeout=0.5)) as rig:
        rig.fire()
        await until(lambda: rig.outcomes() == ["failed"])
        assert "did not resolve within verify_timeout" in rig.audit()[0]["reason"]
        assert rig.counter("failed") == 1.0


@pytest.mark.slow
async def test_min_uptime_holds_the_remedy_until_then(tmp_path: Path) -> None:
    async with Rig(tmp_path, policy(min_uptime=1.5)) as rig:
        before = rig.managed.supervisor.pid
        rig.fire()
        await until(lambda: rig.outcomes() == ["suppressed-by-guard"])
        assert "under min_uptime" in rig.audit()[0]["reason"]
        assert rig.managed.supervisor.pid == before
        # still firing once the engine is old enough: the remedy runs then
        await until(lambda: rig.outcomes() == ["suppressed-by-guard", "verifying"], 10)
        await until(lambda: rig.managed.supervisor.pid not in (None, before))


@pytest.mark.slow
async def test_the_circuit_breaker_stops_acting_and_says_so(tmp_path: Path) -> None:
    async with Rig(tmp_path, policy(breaker_count=1)) as rig:
        rig.fire()
        await until(lambda: rig.outcomes() == ["verifying"])
        rig.resolve()
        await until(lambda: rig.outcomes() == ["done"])
        pid = rig.managed.supervisor.pid
        await until(lambda: rig.managed.supervisor.pid is not None)
        pid = rig.managed.supervisor.pid
        rig.fire()
        await until(lambda: rig.outcomes() == ["done", "suppressed-by-guard"])
        assert "circuit breaker" in rig.audit()[1]["reason"]
        assert rig.managed.supervisor.pid == pid  # not restarted
        f = rig.diagnosis.rules.open_finding(BREAKER_RULE, SUBJECT)
        assert f is not None
        assert f.code == SUSPENDED
        assert f.state == "firing"
        assert SUSPENDED in {a.code for a in rig.diagnosis.rules.active()}
        # further findings: nothing done, each recorded
        rig.resolve()
        rig.fire()
        await until(
            lambda: rig.outcomes()[-1:] == ["suppressed-by-guard"] and len(rig.outcomes()) == 3
        )
        # an operator restart closes the breaker and resolves its finding
        rig.remediator.reset("operator restart")
        assert rig.diagnosis.rules.open_finding(BREAKER_RULE, SUBJECT) is None
        rig.diagnosis.db.flush()
        states = [h["state"] for h in rig.diagnosis.db.history(code=SUSPENDED)]
        assert states == ["resolved"]


@pytest.mark.slow
async def test_readiness_off_until_the_finding_resolves(tmp_path: Path) -> None:
    # readiness_off touches no process: no uptime guard (min_uptime 1h here)
    async with Rig(tmp_path, policy("readiness_off", min_uptime="1h")) as rig:
        runtime = CollectorRuntime(rig.store, {})
        app = make_api_app(
            rig.store,
            runtime,
            time.time(),
            rig.diagnosis,
            ApiAuth(None, TOKEN),
            managed=rig.managed,
            remediator=rig.remediator,
        )
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with TestClient(TestServer(app), headers=headers) as client:
            r = await client.get("/v1/serving/t/ready")
            assert r.status == 200
            before = rig.managed.supervisor.pid
            rig.fire()
            await until(lambda: rig.outcomes() == ["verifying"])
            r = await client.get("/v1/serving/t/ready")
            assert r.status == 503
            assert (await r.json())["reason"].startswith("SCHEDULER_STALL")
            assert rig.managed.supervisor.pid == before  # the engine keeps running
            rig.resolve()
            await until(lambda: rig.outcomes() == ["done"])
            r = await client.get("/v1/serving/t/ready")
            assert r.status == 200
            r = await client.get("/v1/remediations")
            body = await r.json()
            assert body["policy"]["entries"][0]["remedy"] == "readiness_off"
            assert [x["outcome"] for x in body["remediations"]] == ["done"]
            r = await client.get("/v1/serving/other/ready")
            assert r.status == 404


async def test_sighup_keeps_the_policy_in_force_when_the_new_one_is_bad(
    tmp_path: Path,
) -> None:
    from moptd.daemon.app import Daemon

    path = tmp_path / "moptd.yaml"
    off = "\n".join(f"    {n}: {{enabled: false}}" for n in sorted(registry()))
    base = f"state_dir: {tmp_path}/state\nexporter: {{listen: null}}\ncollectors:\n{off}\n"
    path.write_text(base + "remediation:\n  policy:\n    - {code: SCHEDULER_STALL, remedy: none}\n")
    daemon = Daemon(load_config(path, registry()))
    first = daemon.remediator.policy
    assert first.entries[0].remedy == "none"
    path.write_text(
        base + "remediation:\n  policy:\n    - {code: SERVING_DOWN, remedy: restart_engine}\n"
    )
    await daemon._reload_policy()
    assert daemon.remediator.policy is first
    path.write_text(
        base + "remediation:\n  policy:\n    - {code: SCHEDULER_STALL, remedy: readiness_off}\n"
    )
    await daemon._reload_policy()
    assert daemon.remediator.policy.entries[0].remedy == "readiness_off"


# --- bad input of any shape is refused, never a crash ---

_yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "enabled",
        "dry_run",
        "min_interval",
        "breaker_count",
        "breaker_window",
        "min_uptime",
        "verify_timeout",
        "policy",
    ]
)
_entries = st.lists(
    st.dictionaries(
        st.sampled_from(["code", "remedy", "args", "env", "x"]),
        _yaml_values | st.sampled_from(["SCHEDULER_STALL", "restart_with", "SERVING_DOWN"]),
        max_size=4,
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _yaml_values, max_size=6), _entries)
def test_any_section_loads_or_is_refused_with_a_key(section: dict[str, Any], entries) -> None:
    if entries:
        section["policy"] = entries
    try:
        p = parse_policy(section)
    except PolicyError as exc:
        refused = exc
    else:
        refused = None
    if refused is not None:
        assert refused.path[0] == "remediation"
        assert refused.message
    else:
        assert all(
            e.remedy not in ("restart_engine", "restart_with") or e.code not in CAUSES[e.remedy]
            for e in p.entries
        )


def test_explain_shows_what_moptd_did() -> None:
    import io

    from rich.console import Console

    from moptd.cli.explain_remedies import print_remedies

    row = {
        "t": 1_700_000_000.0,
        "remedy": "restart_engine",
        "code": CODE,
        "subject": SUBJECT,
        "outcome": "done",
        "reason": "SCHEDULER_STALL resolved after restart the engine",
        "actor": "moptd",
        "entry": "remediation.policy[0]",
    }
    out = io.StringIO()
    print_remedies({"findings": [{"code": CODE, "remediations": [row]}]}, Console(file=out))
    text = out.getvalue()
    assert "What moptd did" in text
    assert "restart_engine for SCHEDULER_STALL on serving:t: done." in text
    assert "(moptd, remediation.policy[0])" in text
    out = io.StringIO()
    print_remedies({"findings": [{"code": CODE}]}, Console(file=out))
    assert out.getvalue() == ""
