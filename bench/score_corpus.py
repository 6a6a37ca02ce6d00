"""Score moptd's diagnosis on every bundle with an expected.yaml, per diagnosis code.

Replays tests/fixtures/incidents/*, tests/fixtures/scenarios/* and tests/fixtures/bundles/*
with the shipped rules (as `moptd replay` does), holds the findings against each
expected.yaml with the matcher the tests use (tests/expected_outcomes.py), prints the table
and writes it to docs/accuracy.md.

    PYTHONPATH=. python bench/score_corpus.py [--out docs/accuracy.md] [--no-write]

Per code: bundles whose `must` names it, bundles where every such entry was found, bundles
where one was missed, false alarms (bundles where a `must_not` entry of the code matched a
finding), and "unlisted" (bundles that raised it although their expected.yaml neither wants,
allows nor forbids it: not scored, shown so an expectation gap is visible).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from moptd.bundle import read_bundle  # noqa: E402
from moptd.diagnose.loader import default_rules_dir, load_rules  # noqa: E402
from moptd.diagnose.replay import replay_timeline  # noqa: E402
from tests.expected_outcomes import judge, known_codes, load_expected, matches  # noqa: E402

SETS = ("tests/fixtures/incidents", "tests/fixtures/scenarios", "tests/fixtures/bundles")
COMMAND = "PYTHONPATH=. python bench/score_corpus.py"


@dataclass
class Scored:
    bundle: str
    ok: bool = False
    control: bool = False  # no `must`: a healthy or benign bundle, scored on its must_not only
    error: str = ""
    missed: list[str] = field(default_factory=list)
    false_alarms: list[str] = field(default_factory=list)
    must: dict[str, tuple[int, int]] = field(default_factory=dict)  # code -> (found, wanted)
    alarmed: set[str] = field(default_factory=set)
    unlisted: set[str] = field(default_factory=set)
    seconds: float = 0.0


def bundles(repo: Path) -> list[Path]:
    out: list[Path] = []
    for rel in SETS:
        root = repo / rel
        if root.is_dir():
            out += sorted(p for p in root.iterdir() if (p / "expected.yaml").is_file())
    return out


def _entry(e: dict[str, Any]) -> str:
    where = e.get("subject") or e.get("pci_bus_id")
    return f"{e['code']}@{where}" if where else str(e["code"])


def score(
    path: Path, repo: Path, ruleset: Any, codes: frozenset[str], verbose: bool = False
) -> Scored:
    s = Scored(str(path.relative_to(repo)))
    t0 = time.perf_counter()
    try:
        expected = load_expected(path / "expected.yaml", codes)
    except ValueError as e:
        s.error = str(e)
        return s
    wanted = sorted({str(w["code"]) for w in expected.get("must") or []})
    s.control = not wanted
    try:
        findings = replay_timeline(read_bundle(path), ruleset).findings
    except Exception as e:  # noqa: BLE001 - a crash is scored (every must missed), not raised
        first = str(e).splitlines()[0] if str(e) else ""
        # paths relative to the repository, so the written report is the same on every checkout
        s.error = f"{type(e).__name__}: {first}".replace(f"{repo}/", "")
        s.seconds = time.perf_counter() - t0
        s.must = {c: (0, 1) for c in wanted}
        s.missed = wanted
        if verbose:
            traceback.print_exc()
        return s
    s.seconds = time.perf_counter() - t0
    outcome = judge(expected, findings)
    s.ok = outcome.ok
    s.missed = [_entry(e) for e in outcome.missed]
    s.false_alarms = [_entry(e) for e, _ in outcome.false_alarms]
    s.alarmed = {str(e["code"]) for e, _ in outcome.false_alarms}
    for code in wanted:
        wants = [w for w in expected["must"] if w["code"] == code]
        s.must[code] = (sum(any(matches(f, w) for f in findings) for w in wants), len(wants))
    listed = {str(e["code"]) for k in ("must", "must_not", "may") for e in expected.get(k) or []}
    s.unlisted = {str(f["code"]) for f in findings} - listed
    return s


def table(results: list[Scored]) -> list[str]:
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for r in results:
        for code, (found, wanted) in r.must.items():
            per[code][0] += 1
            per[code][1 if found == wanted else 2] += 1
        for code in r.alarmed:
            per[code][3] += 1
        for code in r.unlisted:
            per[code][4] += 1
    lines = [
        "| code | bundles expecting | found | missed | false alarms | unlisted |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for code in sorted(per):
        lines.append(f"| {code} | " + " | ".join(str(n) for n in per[code]) + " |")
    total = [sum(v[i] for v in per.values()) for i in range(5)]
    lines.append("| **total** | " + " | ".join(f"**{n}**" for n in total) + " |")
    return lines


COVERAGE_HEAD = "## Coverage by emitter"


def kept_sections(old: str) -> list[str]:
    """The hand-written coverage section of the current file (its table is regenerated by
    tests/test_emitter_catalogs.py between its markers): kept, not dropped, by a rewrite."""
    start = old.find(COVERAGE_HEAD)
    if start < 0:
        return []
    end = old.find("\n## ", start + len(COVERAGE_HEAD))
    return [*old[start : end if end >= 0 else len(old)].rstrip("\n").split("\n"), ""]


def report(results: list[Scored], keep: list[str] | None = None) -> str:
    passed = sum(r.ok for r in results)
    errors = sum(bool(r.error) for r in results)
    controls = [r for r in results if r.control]
    per_set = []
    for rel in SETS:
        mine = [r for r in results if r.bundle.startswith(rel + "/")]
        per_set.append(f"`{rel}/` {sum(r.ok for r in mine)} of {len(mine)}")
    out = [
        "# Diagnosis accuracy on the real-incident corpus",
        "",
        "Generated by `bench/score_corpus.py`; do not edit by hand. Regenerate with:",
        "",
        "```",
        COMMAND,
        "```",
        "",
        "Every bundle with an `expected.yaml` under " + ", ".join(f"`{s}/`" for s in SETS),
        "is replayed with the shipped rules; `tests/test_incident_corpus.py` and",
        "`tests/test_replay_scenarios.py` assert the same expectations. The expectations come",
        "from the evidence and NVIDIA's documentation (each bundle's SOURCE.md), not from",
        "moptd's output. A bundle counts once per code: *found* when every `must` entry of",
        "that code matched a finding, *missed* otherwise; a *false alarm* is a bundle where",
        "a `must_not` entry of the code matched; *unlisted* counts bundles that raised the",
        "code although their expected.yaml does not mention it (not scored).",
        "",
        "A corpus bundle is `tests/fixtures/incidents/<kebab-name>/`: `bundle.yaml`, the artifacts",
        "someone else captured or pasted in public, copied verbatim to the paths of",
        "docs/bundle.md,",
        "`SOURCE.md` (the address, what was copied, every adaptation, the reasoning behind the",
        "expectation) and `expected.yaml`. A bundle with no `must` is a healthy or benign control,",
        "scored on its `must_not` alone. A bundle that fails names a class of miss in moptd, not a",
        "wrong expectation: the expectation changes only when the evidence was misread.",
        "",
        "Read the figures below as in-sample: the corpus was gathered while the parsers and",
        "rules it exposed were fixed (issue 17), so each class of miss it held is closed.",
        "A held-out estimate needs bundles collected after the fact; add new ones as they",
        "are found and this table says how moptd does on what it has not seen.",
        "",
        f"**{passed} of {len(results)} bundles pass** (every must found, no must_not raised); "
        f"{errors} could not be replayed. By set: {'; '.join(per_set)}. Healthy or benign controls "
        f"(no `must`): {sum(r.ok for r in controls)} of {len(controls)} pass.",
        "",
        *table(results),
        "",
        *(keep or []),
        "## Per bundle",
        "",
        "| bundle | result | missed | false alarms |",
        "|---|---|---|---|",
    ]
    for r in results:
        verdict = "pass" if r.ok else ("error: " + r.error.replace("|", "/") if r.error else "FAIL")
        out.append(
            f"| {r.bundle} | {verdict} | {', '.join(r.missed)} | {', '.join(r.false_alarms)} |"
        )
    return "\n".join(out) + "\n"


COVERAGE = "## Coverage by emitter"
PER_BUNDLE = "## Per bundle"


def keep_coverage(text: str, out: Path) -> str:
    """The report with the coverage-by-emitter section of ``out`` kept before "Per bundle":
    tests/test_emitter_catalogs.py generates that section from the emitter catalogs, and a
    rescore must not drop it."""
    old = out.read_text(encoding="utf-8") if out.is_file() else ""
    start, end = old.find(COVERAGE), old.find(PER_BUNDLE)
    if start < 0 or end < start or PER_BUNDLE not in text:
        return text
    head, _, tail = text.partition(PER_BUNDLE)
    return head + old[start:end] + PER_BUNDLE + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "accuracy.md")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--verbose", action="store_true", help="print a crash's traceback")
    args = ap.parse_args(argv)
    loaded = load_rules([default_rules_dir()])
    if loaded.errors:
        print("\n".join(map(str, loaded.errors)), file=sys.stderr)
        return 2
    codes = known_codes()
    results = []
    for path in bundles(REPO):
        results.append(score(path, REPO, loaded.ruleset, codes, args.verbose))
    text = keep_coverage(report(results), args.out)
    print(text, end="")
    if not args.no_write:
        args.out.write_text(text, encoding="utf-8")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
