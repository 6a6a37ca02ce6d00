"""The default `moptd explain`: a header, then one short block per problem, causes first.

Each block: severity, code, where and since when; the summary; the GPU's identity and who hit
it; the evidence that decided it; the first action (a command is printed whole, never
wrapped); the consequences it explains; the local runbook. `--verbose` has the rest.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, TypeGuard

from rich.console import Console
from rich.text import Text

from moptd.cli.explain_facts import deciding_events
from moptd.cli.explain_order import Incident, linked
from moptd.diagnose.wording import fmt
from moptd.proc.pci import pci_key

SEVERITY_STYLE = {
    "critical": "bold white on red",
    "warning": "bold black on yellow",
    "info": "bold white on blue",
}
MAX_WHO = 3
MAX_LINE_TEXT = 200  # a kernel or log line in the compact view; --verbose has it whole
QUOTED_ALREADY = 40  # an evidence text this long that the summary quotes is not repeated


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _gpu_identity(f: dict[str, Any], gpus: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Index, bus id and UUID of a finding's GPU, from the daemon's GPU list or its events."""
    subject = str(f.get("subject", ""))
    ident: dict[str, str] = {}
    if not subject.startswith("gpu:"):
        return ident
    bus = str(f.get("pci_bus_id") or "")
    for g in gpus:
        same_bus = bus and g.get("pci_bus_id") and pci_key(str(g["pci_bus_id"])) == pci_key(bus)
        if g.get("subject") == subject or same_bus:
            ident.update(
                {
                    k: str(g[k])
                    for k in ("index", "pci_bus_id", "uuid")
                    if g.get(k) not in (None, "")
                }
            )
            break
    rest = subject.removeprefix("gpu:")
    if rest.isdigit():
        ident.setdefault("index", rest)
    if bus:
        ident.setdefault("pci_bus_id", bus)
    for ev in f.get("events") or []:
        uuid = (ev.get("fields") or {}).get("uuid")
        if uuid:
            ident.setdefault("uuid", str(uuid))
            break
    return ident


def _who(who: dict[str, Any]) -> str:
    text = f"pid {who['pid']}"
    if who.get("process"):
        text += f" {who['process']}"
    extra = [f"user {who['user']}"] if who.get("user") else []
    if who.get("container"):
        extra.append(f"container {str(who['container'])[:12]}")
    if who.get("pod"):  # named from the kubelet's /var/log/pods (moptd/proc/pods.py)
        extra.append(f"pod {who.get('namespace', '')}/{who['pod']}")
    elif who.get("pod_uid"):
        extra.append(f"pod {who['pod_uid']}")
    if who.get("unit") and not who.get("container"):
        extra.append(f"unit {who['unit']}")
    return text + (f" ({', '.join(extra)})" if extra else "")


def where_line(inc: Incident, gpus: Sequence[dict[str, Any]]) -> str:
    parts: list[str] = []
    if len(inc.group) == 1:
        ident = _gpu_identity(inc.root, gpus)
        subject = str(inc.root.get("subject"))
        known = [ident[k] for k in ("pci_bus_id", "uuid") if k in ident]
        if any(k not in subject for k in known):  # more than the subject already says
            parts.append(
                " · ".join(([f"gpu {ident['index']}"] if "index" in ident else []) + known)
            )
    else:
        ids: list[str] = []
        more = False
        for f in inc.group:
            ident = _gpu_identity(f, gpus)
            label = str(f.get("subject"))
            for k in ("pci_bus_id", "uuid"):
                if ident.get(k) and ident[k] not in label:
                    label += f" {ident[k]}"
                    more = True
            ids.append(label)
        if more:
            parts.append(listed(ids))
    who: list[dict[str, Any]] = []
    for f in inc.group:
        who += [w for w in f.get("attribution") or [] if w not in who]
    if who:
        shown = ", ".join(_who(w) for w in who[:MAX_WHO])
        rest = f" and {len(who) - MAX_WHO} more" if len(who) > MAX_WHO else ""
        parts.append(f"hit by {shown}{rest}")
    return "; ".join(parts)


def when(t: Any) -> str:
    if t is None or t == "":
        return "-"
    stamp = dt.datetime.fromtimestamp(float(t), tz=dt.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(t: Any, now: float) -> str:
    if t is None:
        return ""
    secs = max(0, int(now - float(t)))
    if secs < 120:
        return f"{secs}s ago"
    if secs < 7200:
        return f"{secs // 60}m ago"
    if secs < 172800:
        return f"{secs // 3600}h {secs % 3600 // 60}m ago"
    return f"{secs // 86400}d ago"


def _known_time(t: Any) -> TypeGuard[int | float]:
    """A log line without a time of its own is stamped 0 in a bundle: not a time to print."""
    return isinstance(t, int | float) and t > 0


def _facility(e: dict[str, Any]) -> bool:
    fields = e.get("fields")
    return isinstance(fields, dict) and fields.get("facility") not in (None, "", "kern")


def _known_evidence(f: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (f.get("evidence") or {}).items() if v is not None}


def evidence_line(f: dict[str, Any], twins: Sequence[dict[str, Any]] = ()) -> str:
    """The deciding events (of the twins too: two lost GPUs, two Xid 79 lines) and the
    evidence values that are known (of `f`)."""
    parts: list[str] = []
    events = [e for g in (twins or [f]) for e in deciding_events(g)]
    events.sort(key=lambda e: float(e.get("t") or 0.0))
    if events:
        streams = sorted({str(e.get("stream", "")) for e in events})
        first, last = events[0], events[-1]
        head = f"{len(events)} {'/'.join(streams)} {'record' if len(events) == 1 else 'records'}"
        times = [float(t) for t in (first.get("t"), last.get("t")) if _known_time(t)]
        if times:
            head += f" {when(times[0])}"
            if len(times) == 2 and times[1] != times[0]:
                head += f" to {when(times[1])}"
        text = " ".join(s.strip() for s in str(last.get("text") or "").splitlines())
        if len(text) > MAX_LINE_TEXT:
            text = text[: MAX_LINE_TEXT - 1] + "…"
        parts.append(f"{head}; {'last' if len(events) > 1 else 'line'}: {text}" if text else head)
        forged = sorted({str(e["fields"]["facility"]) for e in events if _facility(e)})
        if forged:
            # /dev/kmsg takes writes from root in user space; the kernel's own are "kern"
            parts.append(f"written from user space (facility {', '.join(forged)}), not the kernel")
    known = _known_evidence(f)
    # A long text the summary line above already quotes (an unclassified error's messages)
    # is not said a third time; --verbose lists every value.
    summary = str(f.get("summary") or "")
    shown = {
        k: v
        for k, v in known.items()
        if not (isinstance(v, str) and len(v) >= QUOTED_ALREADY and v in summary)
    }
    if shown:
        values = ", ".join(f"{k} = {fmt(v)}" for k, v in shown.items())
        if any(_known_evidence(g) != known for g in twins):
            # the line quoted may be another subject's: say whose values these are
            values = f"of {f.get('subject')}: {values}"
        parts.append(values)
    return "; ".join(parts)


def _steps(f: dict[str, Any]) -> list[dict[str, Any]]:
    steps = f.get("action_steps")
    if isinstance(steps, list):
        return steps
    return [{"kind": "", "text": str(a), "command": None} for a in f.get("actions") or []]


def action_lines(f: dict[str, Any], group: Sequence[dict[str, Any]] = ()) -> list[tuple[str, str]]:
    """(label, text) pairs: the first action; after a drain (which only prepares) the step
    that deals with the fault too; and the first command where none of those is one.

    In a block of several subjects (`group`, the root first) every step names the subjects
    it applies to: one line for all where the text is the same, else one line a subject,
    each a command to paste with its subject as a shell comment (an instruction in words
    with the subject before it): the first GPU's reset command is not the others'."""
    steps = _steps(f)
    if not steps:
        return [("do:", "(the rule gives no action)")]
    shown = steps[:2] if steps[0].get("kind") == "drain_node" else steps[:1]
    if not any(s.get("command") for s in shown):
        shown += [s for s in steps[len(shown) :] if s.get("command")][:1]
    members = list(group) if len(group) > 1 else []
    out = []
    for s in shown:
        i = steps.index(s) + 1
        if i == 1:
            label = ("run" if s.get("command") else "do") + (
                f" (1 of {len(steps)})" if len(steps) > 1 else ""
            )
        else:
            label = f"then run ({i})" if s.get("command") else f"then ({i})"
        kind = "" if s.get("command") or not s.get("kind") else f" [{s['kind']}]"
        per = [(str(g.get("subject")), _step_text(g, i - 1, s)) for g in members]
        if not members:
            out.append((label + ":", f"{s['text']}{kind}"))
        elif len({text for _, text in per}) == 1:
            subjects = _subjects([subject for subject, _ in per])
            out.append((f"{label}, for {subjects}:", f"{s['text']}{kind}"))
        else:
            out.append((f"{label}, one a subject:", ""))
            for subject, text in per:
                line = f"{text}  # {subject}" if s.get("command") else f"{subject}: {text}{kind}"
                out.append(("  ", line))
    return out


def _step_text(f: dict[str, Any], index: int, like: dict[str, Any]) -> str:
    """The text of `f`'s step `index`, the same kind as `like` (twins have the same
    steps, their own subject's values in them)."""
    steps = _steps(f)
    if index < len(steps) and steps[index].get("kind") == like.get("kind"):
        return str(steps[index]["text"])
    return str(like["text"])


def incident_block(
    n: int,
    inc: Incident,
    now: float,
    gpus: Sequence[dict[str, Any]],
    console: Console,
    local_runbook_in_header: bool = False,
) -> None:
    soft = not console.is_terminal
    f = inc.root
    sev = str(f.get("severity", "info"))
    title = Text(f"{n}. ")
    title.append(f" {sev.upper()} ", style=SEVERITY_STYLE.get(sev, "bold"))
    title.append(f" {f.get('code')}", style="bold")
    subjects = [str(g.get("subject")) for g in inc.group]
    title.append(" on ")
    title.append(_subjects(subjects), style="bold cyan")
    since = f.get("first_seen") or f.get("pending_since")
    if f.get("resolved_at"):
        title.append(f" · resolved {when(f['resolved_at'])}, firing from {when(since)}")
    elif f.get("state") == "unconfirmed":
        from moptd.diagnose.replay import UNCONFIRMED  # a replay's only: it has the engine

        seen = f" at {when(since)}" if _known_time(since) else ""
        title.append(f" · unconfirmed{seen}: {f.get('note') or UNCONFIRMED}")
    elif _known_time(since):
        title.append(f" · {f.get('state', 'firing')} since {when(since)}")
        title.append(f" ({ago(since, now)})", style="dim")
    ids = [f"#{g['id']}" for g in inc.group if g.get("id") is not None]
    if ids:
        shown = " ".join(ids[:MAX_LISTED]) + (
            f" +{len(ids) - MAX_LISTED}" if len(ids) > MAX_LISTED else ""
        )
        title.append(f" · {shown}", style="dim")
    console.print(title, soft_wrap=soft)
    summary = str(f.get("summary") or "")
    if len(inc.group) > 1:
        more = len(inc.group) - 1
        if all(_unsubjected(g) == _unsubjected(f) for g in inc.group):
            summary += f" (and the same on {plural(more, 'more subject')})"
        else:  # "the same" would hide that another GPU's value or action differs
            verb = "reads" if more == 1 else "read"
            summary += f" ({plural(more, 'more subject')} {verb} otherwise: --verbose shows each)"
    _field(console, "", summary, soft, style="bold")
    where = where_line(inc, gpus)
    if where:
        # several GPUs on a terminal: one line cut at its width (each is whole in --verbose)
        _field(console, "where:", where, soft, cut=not soft and len(inc.group) > 1)
    evidence = evidence_line(f, inc.group)
    if evidence:
        # on a terminal one line, cut at its width (--verbose has every line whole); piped whole
        _field(console, "evidence:", evidence, soft, cut=not soft)
    for label, text in action_lines(f, inc.group):
        _field(console, label, text, True)  # a command is never wrapped
    for c in inc.consequences:
        # "led to:" where a link says it follows from a finding of this block, "also:" else
        then = isinstance(c.get("caused_by"), dict) and any(linked(g, c) for g in inc.findings)
        line = Text("   led to: " if then else "   also: ", style="bold")
        csev = str(c.get("severity", "info"))
        line.append(f"{csev.upper()} {c.get('code')} on {c.get('subject')}: ", style="bold")
        line.append(str(c.get("summary") or ""))
        console.print(line, soft_wrap=soft)
    if f.get("runbook_command"):
        if not local_runbook_in_header:  # else the header names the command once
            _field(console, "runbook:", str(f["runbook_command"]), True, style="dim")
    elif f.get("runbook"):
        _field(console, "runbook:", str(f["runbook"]), True, style="dim")


def _unsubjected(f: dict[str, Any]) -> str:
    """A finding's summary without its own subject (`gpu:0009:01:00.0` and `0009:01:00.0`,
    `gpu:3`), to tell whether the block's other findings say the same of theirs."""
    subject = str(f.get("subject") or "")
    summary = str(f.get("summary") or "")
    bare = subject.partition(":")[2]
    summary = summary.replace(subject, "\0") if subject else summary
    # a PCI address alone is unambiguous; an index ("0" of gpu:0) would hit any digit
    return summary.replace(bare, "\0") if ":" in bare else summary


def _field(
    console: Console, label: str, text: str, soft: bool, style: str = "", cut: bool = False
) -> None:
    line = Text("   ")
    if label.strip():
        line.append(label + (" " if text else ""), style="bold")
    else:
        line.append(label)
    line.append(text, style=style)
    if cut:
        line.truncate(console.width, overflow="ellipsis")
    console.print(line, soft_wrap=soft)


MAX_LISTED = 8  # subjects named in a line; a block of 281 GPUs stays one screen


def listed(items: Sequence[str], most: int = MAX_LISTED) -> str:
    """The items, at most `most` of them named: "a, b, c and 278 more"."""
    if len(items) <= most:
        return ", ".join(items)
    return f"{', '.join(items[:most])} and {len(items) - most} more"


def _subjects(subjects: list[str]) -> str:
    if len(subjects) == 1:
        return subjects[0]
    idx = [s.removeprefix("gpu:") for s in subjects]
    if all(s.startswith("gpu:") and i.isdigit() for s, i in zip(subjects, idx, strict=True)):
        nums = sorted(int(i) for i in idx)
        if nums == list(range(nums[0], nums[-1] + 1)):
            return f"gpu:{nums[0]}-{nums[-1]} ({len(nums)} GPUs)"
    return f"{listed(subjects)} ({len(subjects)})"


def header(
    incidents: Sequence[Incident],
    findings: Sequence[dict[str, Any]],
    console: Console,
    verbose: bool = False,
) -> None:
    soft = not console.is_terminal
    n = len(findings)
    by_sev = {s: sum(1 for f in findings if f.get("severity") == s) for s in SEVERITY_STYLE}
    firing = sum(1 for f in findings if f.get("state", "firing") == "firing")
    unconfirmed = sum(1 for f in findings if f.get("state") == "unconfirmed")
    line = Text(plural(n, "problem"), style="bold")
    line.append(": ")
    line.append(f"{by_sev['critical']} critical", style="bold red" if by_sev["critical"] else "")
    line.append(f", {by_sev['warning']} warning, {by_sev['info']} info")
    if firing != n:
        line.append(f"; {firing} firing, {n - firing - unconfirmed} resolved")
        if unconfirmed:
            line.append(f", {unconfirmed} unconfirmed")
    if len(incidents) != n:
        line.append(f"; in {plural(len(incidents), 'block')} below, causes first")
    if not verbose:
        line.append(" (--verbose: decision paths, all evidence and steps)", style="dim")
    console.print(line, soft_wrap=soft)
    gpus = sorted({str(f["subject"]) for f in findings if str(f.get("subject")).startswith("gpu:")})
    serving = sorted(
        {str(f["subject"]) for f in findings if str(f.get("subject")).startswith("serving:")}
    )
    node = any(f.get("subject") == "node" for f in findings)
    where = []
    if gpus:
        where.append(f"{plural(len(gpus), 'GPU')} ({_gpu_list(gpus)})")
    if serving:
        where.append(f"{plural(len(serving), 'endpoint')} ({', '.join(serving)})")
    if node:
        where.append("the node itself")
    console.print(Text("On: " + "; ".join(where)), soft_wrap=soft)
    first = incidents[0]
    if len(incidents) == 1:
        console.print()
        return
    start = Text("Start with 1: ", style="bold")
    start.append(
        f"{first.root.get('code')} on {_subjects([str(g['subject']) for g in first.group])}"
    )
    why = _why_first(first, incidents)
    if why:
        start.append(f" ({why})")
    console.print(start, soft_wrap=soft)
    if runbooks_in_header(incidents):
        console.print(  # a command: never wrapped, on a terminal either
            Text("Runbook of any block: moptd explain --code CODE --runbook", style="dim"),
            soft_wrap=True,
        )
    console.print()


def runbooks_in_header(incidents: Sequence[Incident]) -> bool:
    """With several blocks, the local runbook command is said once, in the header: one line
    instead of one a block, and the CODE is in each block's title."""
    return len(incidents) > 1 and any(i.root.get("runbook_command") for i in incidents)


def _why_first(first: Incident, incidents: Sequence[Incident]) -> str:
    from moptd.cli.explain_order import NODE_CAUSES

    if first.consequences:
        return f"it explains {plural(len(first.consequences), 'other finding')}"
    if str(first.root.get("code")) in NODE_CAUSES and len(incidents) > 1:
        return "a node-wide cause: read it before the per-GPU findings"
    if first.root.get("severity") == "critical":
        return "the most severe"
    return ""


def _gpu_list(subjects: list[str]) -> str:
    names = [s.removeprefix("gpu:") for s in subjects]
    nums = sorted(int(x) for x in names if x.isdigit())
    rest = [x for x in names if not x.isdigit()]
    text = []
    if nums:
        if len(nums) > 2 and nums == list(range(nums[0], nums[-1] + 1)):
            text.append(f"{nums[0]}-{nums[-1]}")
        else:
            text.extend(map(str, nums))
    return listed(text + rest)
