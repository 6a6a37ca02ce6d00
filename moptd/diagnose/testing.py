"""Rule tests, shaped like ``promtool test rules``.

A test file (``*.test.yaml``) names the rule files it loads and a list of tests. Each test
gives input series in promtool's expanding notation (``a+bxn``: a, then n more samples
growing by b; ``axn``: a repeated; ``_``: no sample), and/or a bundle, kernel-log lines that
go through the real kernel-log parser, and the findings that must be firing at ``eval_at``.
``expect: []`` means the rules must stay silent. The expected set is compared exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moptd.catalog import CATALOG
from moptd.clock import VirtualClock
from moptd.diagnose.engine import Reuse, evaluate
from moptd.diagnose.lifecycle import Lifecycle
from moptd.diagnose.links import link_findings
from moptd.diagnose.loader import RuleError, line_of, load_rules, parse_yaml
from moptd.diagnose.model import RuleSet
from moptd.diagnose.timeline import Timeline, TimelineError
from moptd.durations import parse_duration
from moptd.kernel.attribution import records_to_events
from moptd.kernel.logparse import parse_kernel_log
from moptd.observations import Batch, Event, labels_of
from moptd.store import SignalStore

_SERIES = re.compile(r"^\s*([a-z_]+\.[a-z_0-9]+)\s*(?:\{(.*)\})?\s*$")
_LABEL = re.compile(r'\s*([a-z_]+)\s*=\s*"([^"]*)"\s*(?:,|$)')
_TOKEN = re.compile(
    r"^(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)(?:([-+])(\d+(?:\.\d+)?(?:e[-+]?\d+)?))?x(\d+)$"
)
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:e[-+]?\d+)?$")

TEST_KEYS = {"name", "bundle", "series", "events", "attrs", "eval_at", "expect", "interval"}
FILE_KEYS = {"rule_files", "interval", "tests"}
EXPECT_KEYS = {"rule", "code", "subject", "path", "severity", "caused_by"}


def expand_values(text: str) -> list[float | None]:
    """promtool's expanding notation: ``1+2x3`` -> 1 3 5 7, ``5x2`` -> 5 5 5, ``_`` -> None."""
    out: list[float | None] = []
    for tok in str(text).split():
        if tok == "_":
            out.append(None)
            continue
        if tok.startswith("_x") and tok[2:].isdigit():
            out.extend([None] * (int(tok[2:]) + 1))
            continue
        if _NUMBER.match(tok):
            out.append(float(tok))
            continue
        m = _TOKEN.match(tok)
        if not m:
            raise ValueError(f"bad series value {tok!r} (use a, a+bxn, a-bxn, axn or _)")
        start, sign, step, n = m.groups()
        a, b = float(start), float(step or 0)
        if sign == "-":
            b = -b
        if int(n) > 100000:
            raise ValueError(f"{tok!r}: at most 100000 repetitions")
        out.extend(a + b * i for i in range(int(n) + 1))
    return out


def parse_series_name(text: str) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """``gpu.util{subject="gpu:1"}`` -> (signal, subject, labels); the subject defaults to
    ``node`` or ``gpu:0`` after the signal's kind."""
    m = _SERIES.match(text)
    if not m:
        raise ValueError(f'bad series name {text!r} (use signal{{label="value", ...}})')
    signal, body = m.group(1), m.group(2) or ""
    spec = CATALOG.get(signal)
    if spec is None:
        raise ValueError(f"unknown signal {signal!r}")
    labels: dict[str, str] = {}
    pos = 0
    body = body.strip()
    while pos < len(body):
        lm = _LABEL.match(body, pos)
        if not lm:
            raise ValueError(f"bad label list {{{body}}}")
        labels[lm.group(1)] = lm.group(2)
        pos = lm.end()
    default = {"node": "node", "gpu": "gpu:0", "serving": "serving:main"}.get(spec.subject, "")
    subject = labels.pop("subject", default)
    if spec.subject == "collector" and not subject.startswith("collector:"):
        subject = f"collector:{labels.pop('collector', '')}"
    for k in labels:
        if k not in spec.labels:
            raise ValueError(f"{signal} has no label {k!r}")
    return signal, subject, labels_of(labels)


@dataclass
class TestFailure:
    file: str
    line: int
    name: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: test {self.name!r}: {self.message}"


@dataclass
class TestReport:
    files: int = 0
    tests: int = 0
    failures: list[TestFailure] = field(default_factory=list)
    errors: list[RuleError] = field(default_factory=list)
    firing_tests: dict[str, int] = field(default_factory=dict)  # rule id -> count
    silent_tests: dict[str, int] = field(default_factory=dict)
    raised: set[str] = field(default_factory=set)  # rules under test that raised (reported once)
    linked_tests: dict[str, int] = field(default_factory=dict)  # link id -> tests it links in
    unlinked_tests: dict[str, int] = field(default_factory=dict)  # ... expected not to link
    ruleset: RuleSet | None = None

    @property
    def ok(self) -> bool:
        return not self.failures and not self.errors


def test_files(paths: Sequence[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.rglob("*.test.yaml")))
        elif p.is_file() and p.name.endswith(".test.yaml"):
            out.append(p)
    return out


BundleReader = Callable[[Path], Timeline]


def run_tests(
    paths: Sequence[str | Path],
    require_coverage: bool = True,
    read_bundle: BundleReader | None = None,
) -> TestReport:
    """Run every test file under ``paths``; with ``require_coverage`` each stable rule found
    under ``paths`` needs a firing and a silent test. A test with a ``bundle:`` key reads it
    with ``read_bundle`` (moptd.bundle's; diagnosis imports no reader)."""
    report = TestReport()
    for f in test_files(paths):
        report.files += 1
        _run_file(f, report, read_bundle)
    if require_coverage:
        loaded = load_rules([p for p in map(Path, paths) if p.is_dir() or p.suffix == ".yaml"])
        report.errors.extend(loaded.errors)
        report.ruleset = loaded.ruleset
        for r in loaded.ruleset.rules:
            if r.status != "stable":
                continue
            if not report.firing_tests.get(r.id):
                report.errors.append(
                    RuleError(r.file, r.line, f"stable rule {r.id} has no firing test")
                )
            if not report.silent_tests.get(r.id):
                report.errors.append(
                    RuleError(r.file, r.line, f"stable rule {r.id} has no silent test")
                )
        for lk in loaded.ruleset.links:
            if not lk.enabled:
                continue
            if not report.linked_tests.get(lk.id):
                report.errors.append(
                    RuleError(lk.file, lk.line, f"link {lk.id} has no test that links")
                )
            if not report.unlinked_tests.get(lk.id):
                report.errors.append(
                    RuleError(lk.file, lk.line, f"link {lk.id} has no test that does not link")
                )
    return report


def _run_file(path: Path, report: TestReport, read_bundle: BundleReader | None) -> None:
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        report.errors.append(RuleError(file, 0, f"cannot read: {e}"))
        return
    doc, errs = parse_yaml(text, file)
    if errs:
        report.errors.extend(errs)
        return
    if not isinstance(doc, dict) or not isinstance(doc.get("tests"), list):
        report.errors.append(
            RuleError(file, 1, "a test file is a mapping with rule_files and tests")
        )
        return
    for key in doc:
        if key not in FILE_KEYS:
            report.errors.append(RuleError(file, line_of(doc, [key]), f"unknown key {key!r}"))
    rule_files = [path.parent / str(r) for r in doc.get("rule_files") or []]
    # The shared lists and macros travel with every test.
    base = _rules_root(path)
    shared = sorted(base.glob("*.rules.yaml")) if base is not None else []
    loaded = load_rules([*shared, *[r for r in rule_files if r not in shared]])
    if loaded.errors:
        report.errors.extend(loaded.errors)
        return
    under_test = {
        r.id for r in loaded.ruleset.rules if Path(r.file) in rule_files or not rule_files
    }
    try:
        interval = parse_duration(doc.get("interval", "15s"))
    except ValueError as e:
        report.errors.append(RuleError(file, line_of(doc, ["interval"]), f"interval: {e}"))
        return
    for i, test in enumerate(doc["tests"]):
        report.tests += 1
        line = line_of(doc, ["tests", i])
        name = str(test.get("name", f"#{i}")) if isinstance(test, dict) else f"#{i}"
        try:
            failure = _run_test(
                path, test, loaded.ruleset, interval, under_test, report, read_bundle
            )
        except _Bad as e:
            where = line_of(doc, ["tests", i, *e.path])
            report.failures.append(TestFailure(file, where, name, e.message))
            continue
        if failure:
            report.failures.append(TestFailure(file, line, name, failure))


def _rules_root(path: Path) -> Path | None:
    for parent in path.parents:
        if (parent / "schema" / "moptd-rules.schema.json").exists():
            return parent
    return None


class _Bad(Exception):
    def __init__(self, message: str, *path: Any) -> None:
        super().__init__(message)
        self.message = message
        self.path = list(path)


def _run_test(
    path: Path,
    test: object,
    ruleset: RuleSet,
    default_interval: float,
    under_test: set[str],
    report: TestReport,
    read_bundle: BundleReader | None,
) -> str | None:
    if not isinstance(test, dict):
        raise _Bad("a test is a mapping")
    for key in test:
        if key not in TEST_KEYS:
            raise _Bad(f"unknown key {key!r}", key)
    try:
        interval = parse_duration(test.get("interval", default_interval))
        eval_at = parse_duration(test.get("eval_at", 0))
    except ValueError as e:
        raise _Bad(str(e), "eval_at") from None
    tl = Timeline(path)
    t0 = 0.0
    if "bundle" in test:
        if read_bundle is None:
            raise _Bad("bundle: no bundle reader was given to run_tests", "bundle")
        try:
            tl = read_bundle(path.parent / str(test["bundle"]))
        except TimelineError as e:
            raise _Bad(f"bundle: {e}", "bundle") from None
        steps = tl.steps()
        t0 = steps[0] if steps else 0.0
    times = {t0 + eval_at}
    batches: dict[float, Batch] = {}
    for key, values in (test.get("series") or {}).items():
        try:
            signal, subject, labels = parse_series_name(str(key))
            expanded = expand_values(str(values))
        except ValueError as e:
            raise _Bad(str(e), "series", key) from None
        for i, v in enumerate(expanded):
            t = t0 + i * interval
            times.add(t)
            if v is not None:
                batches.setdefault(t, Batch()).add(signal, subject, v, labels)
    for subject, attrs in (test.get("attrs") or {}).items():
        batches.setdefault(t0, Batch()).describe(
            str(subject), **{k: str(v) for k, v in attrs.items()}
        )
    events: list[Event] = list(tl.events)
    for j, ev in enumerate(test.get("events") or []):
        events.extend(_events(ev, t0, j))
    events.sort(key=lambda e: e.t)
    times.update(e.t for e in events)
    times.update(t for t, _, _ in tl.observations)
    end = t0 + eval_at
    # Evaluate at every interval as a live daemon would, plus at each time stamp seen.
    n = int(eval_at // interval) if interval > 0 else 0
    times.update(t0 + k * interval for k in range(n + 1))
    clock = VirtualClock(min(times))
    store = SignalStore(clock=clock)
    life = Lifecycle()
    obs = sorted(
        [*tl.observations, *((t, "test", b) for t, b in batches.items())], key=lambda o: o[0]
    )
    oi = ei = 0
    missing = frozenset(tl.missing_namespaces) if "bundle" in test else frozenset()
    reuse = Reuse()  # as the daemon evaluates
    for t in sorted(x for x in times if x <= end):
        clock.set(t)
        while oi < len(obs) and obs[oi][0] <= t:
            store.ingest(obs[oi][1], obs[oi][2], obs[oi][0])
            oi += 1
        start = ei
        while ei < len(events) and events[ei].t <= t:
            ei += 1
        store.add_events(events[start:ei])
        results = evaluate(ruleset, store, t, missing, reuse=reuse)
        for r in results:
            # A rule that raises is an error of that rule; the others' tests go on.
            if r.status == "error" and r.rule.id in under_test and r.rule.id not in report.raised:
                report.raised.add(r.rule.id)
                report.errors.append(
                    RuleError(
                        r.rule.file,
                        r.rule.line,
                        f"rule {r.rule.id} raised on {r.subject} (in {path}): {r.error}",
                    )
                )
        life.update(results, t)
        link_findings(ruleset.links, life.findings, life.history, store, t, missing)
    got = {
        (f.rule, f.code, f.subject): f
        for f in life.findings.values()
        if f.state == "firing" and f.rule in under_test
    }
    expect = test.get("expect")
    if not isinstance(expect, list):
        raise _Bad("expect: a list of findings ([] for none)", "expect")
    want: set[tuple[str, str, str]] = set()
    for k, exp in enumerate(expect):
        if (
            not isinstance(exp, dict)
            or not {"rule", "code", "subject"} <= set(exp)
            or set(exp) - EXPECT_KEYS
        ):
            raise _Bad(
                "an expected finding is {rule, code, subject[, severity, path, caused_by]}",
                "expect",
                k,
            )
        key = (str(exp["rule"]), str(exp["code"]), str(exp["subject"]))
        want.add(key)
        report.firing_tests[key[0]] = report.firing_tests.get(key[0], 0) + 1
        f = got.get(key)
        if (
            f is not None
            and "path" in exp
            and [p.split("/", 1)[1] for p in f.path] != list(exp["path"])
        ):
            return f"{key}: path {f.path} is not {exp['path']}"
        if f is not None and "severity" in exp and f.severity != exp["severity"]:
            return f"{key}: severity {f.severity} is not {exp['severity']}"
        if f is not None and "caused_by" in exp:
            problem = _check_cause(key, f.caused_by, exp["caused_by"], k, report)
            if problem:
                return problem
            if exp["caused_by"] is None:
                for lk in ruleset.links:
                    if f.code in lk.consequence:
                        report.unlinked_tests[lk.id] = report.unlinked_tests.get(lk.id, 0) + 1
    for rid in under_test - {w[0] for w in want}:
        report.silent_tests[rid] = report.silent_tests.get(rid, 0) + 1
    missing_f = sorted(want - set(got))
    extra = sorted(set(got) - want)
    if missing_f or extra:
        parts = []
        if missing_f:
            parts.append("expected but not firing: " + ", ".join("/".join(k) for k in missing_f))
        if extra:
            parts.append("firing but not expected: " + ", ".join("/".join(k) for k in extra))
        return "; ".join(parts)
    return None


CAUSE_KEYS = {"code", "subject", "link"}


def _check_cause(
    key: tuple[str, str, str],
    got: Mapping[str, object] | None,
    want: object,
    k: int,
    report: TestReport,
) -> str | None:
    """`caused_by: {code, subject[, link]}` wants that cause; `caused_by: null` none (a
    test that does not link, for every link of the finding's code)."""
    if want is None:
        if got is not None:
            return f"{key}: caused by {got['code']} on {got['subject']}, expected no cause"
        return None
    if not isinstance(want, dict) or not {"code", "subject"} <= set(want) or set(want) - CAUSE_KEYS:
        raise _Bad("caused_by is {code, subject[, link]} or null", "expect", k, "caused_by")
    if got is None:
        return f"{key}: no cause linked, expected {want['code']} on {want['subject']}"
    for name in sorted(set(want)):
        if str(got.get(name)) != str(want[name]):
            return f"{key}: caused_by {name} {got.get(name)} is not {want[name]}"
    link = str(got["link"])
    report.linked_tests[link] = report.linked_tests.get(link, 0) + 1
    return None


def _events(ev: object, t0: float, j: int) -> list[Event]:
    if not isinstance(ev, dict):
        raise _Bad("an event is {at, kmsg} or {at, stream, subject, fields}", "events", j)
    try:
        at = t0 + parse_duration(ev.get("at", 0))
    except ValueError as e:
        raise _Bad(f"at: {e}", "events", j) from None
    if "kmsg" in ev:
        records = parse_kernel_log(str(ev["kmsg"]))
        index = {str(k): int(v) for k, v in (ev.get("gpus") or {}).items()}
        out = records_to_events(records, index, default_time=at)
        # A test's line has no time of its own: it happens at `at`.
        return [Event(e.stream, e.subject, at, e.fields, e.text) for e in out]
    stream = ev.get("stream")
    spec = CATALOG.get(str(stream))
    if spec is None or spec.kind != "event":
        raise _Bad(f"unknown event stream {stream!r}", "events", j)
    fields = dict(ev.get("fields") or {})
    unknown = set(fields) - set(spec.fields)
    if unknown:
        raise _Bad(f"{stream} has no field {sorted(unknown)[0]!r}", "events", j)
    return [Event(str(stream), str(ev.get("subject", "node")), at, fields, str(ev.get("text", "")))]
