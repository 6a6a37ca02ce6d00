"""The condition language: a restricted Python-expression subset, checked and compiled once.

A condition is parsed with :mod:`ast` and every node is checked against a whitelist before it
is turned into a tree of closures: no attribute access except ``namespace.signal`` names from
the catalog, no subscripts, no builtins, no lambdas or comprehensions, no I/O. Durations with
units (``5m``, ``500ms``) are literals. Values are three-valued: ``None`` means *unknown*
(no evidence), and it propagates: ``unknown and False`` is False, ``unknown or True`` is True,
any other use of unknown is unknown.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from moptd.catalog import SignalSpec
from moptd.catalog.gpu import CLOCK_EVENT_REASONS
from moptd.durations import parse_duration
from moptd.observations import Event, subject_kind
from moptd.proc.pci import normalize_pci
from moptd.store import EVICTED, EventLog, Series, SignalStore

Value = float | str | bool | None
Compiled = Callable[["Env"], object]

# The clock-event reason bits, named so rules read as words (HW_SLOWDOWN).
CONSTANTS: dict[str, float] = {name.upper(): float(bit) for bit, name in CLOCK_EVENT_REASONS}

WINDOW_FUNCS = ("avg", "min", "max", "increase", "rate", "slope", "changes")
WINDOWED = frozenset({*WINDOW_FUNCS, "quantile", "count", "seen_for"})  # read a window
SUMMED = frozenset({"increase", "rate", "changes"})  # summed over label sets, else max
FUNCTIONS = (
    "last",
    "lowest",
    "highest",
    *WINDOW_FUNCS,
    "quantile",
    "count",
    "latest",
    "present",
    "absent",
    "seen_for",
    "abs",
)

# A string runs to its closing quote or, unterminated, to the end: either way one match,
# so a text of many stray quotes is one pass, not one pass per quote.
_DURATION = re.compile(
    r"""("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?)"""  # strings pass through untouched
    r"|(?<![\w.])((?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+)(?![\w.])"
)
_DUR_NAME = re.compile(r"__d_(\d+)")

# What one expression may cost, checked at load so that no rule file can make the loader or
# a tick expensive (docs/rules.md "Limits"). The largest shipped expression has 99 tokens,
# 64 nodes and depth 7 after macro expansion, and its longest number has 10 characters
# (tests/test_rule_limits.py measures them).
MAX_TOKENS = 500  # in one condition's text: bounds the depth ast.parse recurses to
MAX_DEPTH = 32  # nesting after macro expansion: bounds the compiler's recursion
MAX_NODES = 1000  # after macro expansion: bounds the work of one evaluation
MAX_NUMBER_CHARS = 32  # one numeric literal: 0x and 400 hex digits is not a threshold

# Python's tokens, roughly: a string, a name, a number, a two-character operator, any
# other visible character. Counting them is one pass with no recursion.
_TOKEN = re.compile(
    r"""("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?)"""
    r"|([^\W\d]\w*)"
    r"|((?:0[xXoObB]\w*|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?[\d_]+)?)\w*)"
    r"|(?:[=!<>]=|\*\*|//|<<|>>)"
    r"|\S"
)
_READ_IDS: dict[tuple[object, ...], int] = {}  # distinct signal reads, for the per-pass memo


class ExprError(ValueError):
    """A condition that cannot be compiled; ``col`` is the 0-based column in its text."""

    def __init__(self, message: str, col: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.col = col


@dataclass(slots=True)
class Env:
    """What one evaluation sees: the store, the subject, the time and the trace to fill."""

    store: SignalStore
    subject: str
    now: float
    pci_bus_id: str | None = None
    missing: frozenset[str] = frozenset()  # namespaces with no evidence source at all
    stale_after: float = 300.0  # longer than moptd.store.series.REVIVED_AFTER (see Stamp)
    trace: list[tuple[str, object]] | None = None
    fields: Mapping[str, object] | None = None  # inside count(..., where)
    # Per-tick results of signal reads, shared by every rule: conditions and evidence
    # often read the same window (the cache dies with the tick, so it is never stale).
    memo: dict[tuple[object, ...], object] | None = None
    # Every read an evaluation makes, with what it returned (the engine's Reuse).
    reads: list[tuple[Compiled, object]] | None = None
    # Replay only: namespace -> time of its newest evidence. A series of that namespace is
    # read as of then, so a snapshot holds until newer evidence of its kind (a dump mixed
    # with a log from later). None (the daemon): every series is read as of ``now``.
    evidence_at: Mapping[str, float] | None = None
    # With the engine's Reuse: what the reads so far depend on, so the next pass can tell
    # without reading again that they would return the same (see Stamp).
    stamp: Stamp | None = None
    # While the engine traces a branch: the time of the oldest event each count() counted
    # (a finding on events read late, at start, fires "since" them, not since the clock).
    oldest: list[float] | None = None


_NO_NAMES: frozenset[str] = frozenset()


def held_name(namespace: str) -> str:
    """A namespace's evidence time, named apart from signals and streams (Stamp.seal)."""
    return "@" + namespace


class Stamp:
    """What a rule's reads on one subject depended on: the store generation of each signal
    and event stream they read, and the latest time until which the time alone cannot
    change what they returned. While every generation is the same and the clock has not
    passed ``until``, every read would return what it returned, so the engine takes the
    last result without reading again (a read it cannot bound sets ``until`` to -inf and
    the engine reads again).

    Bounds: a point read (last, lowest, highest, present, absent) changes only with a
    new value, a new or departed series, a series seen again after a silence (the
    generation: moptd.store.series.REVIVED_AFTER, shorter than ``stale_after``) or when a
    series turns stale (``until`` is the earliest time one does). A count changes with
    a new event in its stream (the stream's count of appended events) or when its oldest
    counted event leaves the window. ``seen_for`` changes with a new generation too (a
    first value, a series seen again after a silence) or when the series has been seen for
    its whole window (``until`` then). A window function holds while the window has nothing
    in it or only the value carried in from before it (Series.constant_until); points
    inside the window move it with the clock: unbounded.

    Replay reads a namespace's series as of its newest evidence (Env.evidence_at), not of
    the clock. Such reads are kept apart, per namespace (``held``): the time they were
    read as of, and the bound above in that time's terms. They hold while that time
    stands (the read is a function of the store and of it alone: a new sample of the
    namespace always moves it, also one that repeats a value and bumps no generation) or
    has not passed the bound; a window read as of a stood time can still change when the
    store's retention drops points (``evictions``)."""

    __slots__ = (
        "deps",
        "evictions",
        "held",
        "held_deps",
        "held_until",
        "series",
        "streams",
        "until",
    )

    def __init__(self) -> None:
        self.series: dict[str, int] = {}
        self.streams: dict[str, int] = {}
        self.held: dict[str, tuple[float, float]] = {}  # namespace -> (read as of, until)
        self.evictions = -1  # SignalStore.evictions when a held window was read, else -1
        self.until = math.inf
        # set by seal(), for the engine's check against what changed since the last pass
        self.deps: AbstractSet[str] = _NO_NAMES
        self.held_deps: AbstractSet[str] = _NO_NAMES
        self.held_until = math.inf

    def seal(self) -> Stamp:
        """Once the reads are made: the names of what they depend on, as the store's change
        log (SignalStore.changed_since) and held_name() name them, and the earliest bound
        of the held reads (the clock alone passing none of them, they hold)."""
        deps = self.series.keys() | self.streams.keys()
        if self.evictions >= 0:
            deps.add(EVICTED)
        self.deps = deps
        if self.held:
            self.held_deps = {held_name(ns) for ns in self.held}
            self.held_until = min(until for _, until in self.held.values())
        return self

    def holds(
        self, store: SignalStore, now: float, evidence_at: Mapping[str, float] | None = None
    ) -> bool:
        if now > self.until:
            return False
        gens = store.generations
        for name, g in self.series.items():
            if gens.get(name, 0) != g:
                return False
        appended = store.stream_appended
        for name, g in self.streams.items():
            if appended(name) != g:
                return False
        if self.held:
            if self.evictions >= 0 and store.evictions != self.evictions:
                return False
            for ns, (at, until) in self.held.items():
                h = None if evidence_at is None else evidence_at.get(ns)
                t = now if h is None or h > now else h  # what the read would be as of now
                if t != at and t > until:
                    return False
        return True

    def hold_at(self, namespace: str, at: float, until: float) -> None:
        """A read of the namespace as of `at`, unchanged while the time read as of is
        `at` or at most `until`."""
        known = self.held.get(namespace)
        if known is not None and known[1] < until:
            until = known[1]
        self.held[namespace] = (at, until)


@dataclass(frozen=True, slots=True)
class Expr:
    text: str
    fn: Compiled
    signals: frozenset[str] = frozenset()
    macros: frozenset[str] = frozenset()
    # the windowed reads it makes, macros expanded, as written ("max(gpu.power, 1h)"): what
    # a tick pays for per subject (the loader bounds their number in a rule set)
    reads: frozenset[str] = frozenset()

    def __call__(self, env: Env) -> object:
        return self.fn(env)


# --- three-valued helpers -------------------------------------------------------------


def _num(v: object) -> object:
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def _compare(op: ast.cmpop, a: object, b: object) -> object:
    if a is None or b is None:
        return None
    if isinstance(op, ast.In | ast.NotIn):
        if not isinstance(b, list | tuple):
            return None
        a2 = _num(a)
        hit = any(a2 == _num(x) or a == x for x in b)
        return hit if isinstance(op, ast.In) else not hit
    if isinstance(a, str) != isinstance(b, str):
        a, b = _num(a), _num(b)
    try:
        if isinstance(op, ast.Eq):
            return a == b
        if isinstance(op, ast.NotEq):
            return a != b
        if isinstance(op, ast.Lt):
            return a < b  # type: ignore[operator]
        if isinstance(op, ast.LtE):
            return a <= b  # type: ignore[operator]
        if isinstance(op, ast.Gt):
            return a > b  # type: ignore[operator]
        if isinstance(op, ast.GtE):
            return a >= b  # type: ignore[operator]
    except TypeError:
        return None
    raise AssertionError(op)  # pragma: no cover - the checker admits no other operator


_FAST_COMPARE: dict[type[ast.cmpop], Callable[[float, float], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _never(a: float, b: float) -> None:
    """``in`` between two numbers: the right side is not a list, so unknown."""
    return None


def _arith(op: ast.operator, a: object, b: object) -> object:
    if a is None or b is None:
        return None
    a, b = _num(a), _num(b)
    if not isinstance(a, int | float) or not isinstance(b, int | float):
        return None
    if isinstance(op, ast.Add):
        return a + b
    if isinstance(op, ast.Sub):
        return a - b
    if isinstance(op, ast.Mult):
        return a * b
    if isinstance(op, ast.Div):
        return None if b == 0 else a / b
    if isinstance(op, ast.BitAnd):
        return float(int(a) & int(b))
    if isinstance(op, ast.BitOr):
        return float(int(a) | int(b))
    raise AssertionError(op)  # pragma: no cover


def _truth(v: object) -> bool | None:
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    return bool(v)


# --- the compiler ---------------------------------------------------------------------


@dataclass
class Compiler:
    """Compiles conditions for one scope against the catalog, lists and macros."""

    catalog: Mapping[str, SignalSpec]
    lists: Mapping[str, list[object]] = field(default_factory=dict)
    macros: Mapping[str, str] = field(default_factory=dict)
    scope: str = "node"
    _macro_cache: dict[str, Expr] = field(default_factory=dict)
    _macro_cost: dict[str, Cost] = field(default_factory=dict)
    _stack: list[str] = field(default_factory=list)
    _depth: int = 0  # nesting of the macro name being compiled, in the expression using it

    def compile(self, text: str) -> Expr:
        return self._compile(text)[0]

    def cost(self, text: str) -> Cost:
        """What ``text`` costs after macro expansion (raises ExprError like compile)."""
        return self._compile(text)[1]

    def _compile(self, text: str) -> tuple[Expr, Cost]:
        if not text.strip():
            raise ExprError("a condition must be a non-empty string")
        durations: list[tuple[str, float]] = []

        def sub(m: re.Match[str]) -> str:
            if m.group(1):
                return m.group(1)
            try:
                seconds = parse_duration(m.group(2))
            except ValueError as e:  # pragma: no cover - the regex admits only valid ones
                raise ExprError(str(e), m.start()) from None
            durations.append((m.group(2), seconds))
            return f"__d_{len(durations) - 1}"

        src = _DURATION.sub(sub, text.strip())
        _check_tokens(src)
        try:
            tree = ast.parse(src, mode="eval")
        except SyntaxError as e:
            col = max(0, (e.offset or 1) - 1)
            raise ExprError(f"syntax error: {e.msg}", col) from None
        except (RecursionError, MemoryError):  # pragma: no cover - MAX_TOKENS keeps it away,
            # unless the caller is already deep in its own stack
            raise ExprError("nested too deeply to parse") from None
        state = _State(src, durations, depth_of=_depths(tree.body, self._depth, self._stack))
        state.nodes = len(state.depth_of)
        state.depth = max(state.depth_of.values())
        _check_nodes(state.nodes)
        fn = self._node(tree.body, state)
        state.reads.update(
            state.label(n)
            for n in state.depth_of
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in WINDOWED
        )
        reads = frozenset(state.reads)
        expr = Expr(text.strip(), fn, frozenset(state.signals), frozenset(state.macros), reads)
        return expr, Cost(state.nodes, state.depth, reads)

    # Each _node call returns a closure; the checks happen here, once.
    def _node(self, node: ast.expr, st: _State) -> Compiled:
        if isinstance(node, ast.BoolOp):
            parts = [self._node(v, st) for v in node.values]
            return _and(parts) if isinstance(node.op, ast.And) else _or(parts)
        if isinstance(node, ast.UnaryOp):
            inner = self._node(node.operand, st)
            if isinstance(node.op, ast.Not):
                return lambda env: _not(inner(env))
            if isinstance(node.op, ast.USub):
                return lambda env: _arith(ast.Sub(), 0.0, inner(env))
            raise self._err(f"operator {type(node.op).__name__} is not allowed", node)
        if isinstance(node, ast.Compare):
            return self._compare(node, st)
        if isinstance(node, ast.BinOp):
            if not isinstance(
                node.op, ast.Add | ast.Sub | ast.Mult | ast.Div | ast.BitAnd | ast.BitOr
            ):
                raise self._err(f"operator {type(node.op).__name__} is not allowed", node)
            left, right, op = self._node(node.left, st), self._node(node.right, st), node.op
            return lambda env: _arith(op, left(env), right(env))
        if isinstance(node, ast.Constant):
            v: object = node.value
            if isinstance(v, bool) or not isinstance(v, int | float | str):
                raise self._err(f"constant {v!r} is not allowed", node)
            c: object = float(v) if isinstance(v, int) else v
            if isinstance(c, float) and not math.isfinite(c):
                raise self._err(
                    f"number {ast.get_source_segment(st.src, node)} is out of range", node
                )
            return lambda env: c
        if isinstance(node, ast.List | ast.Tuple):
            items = [self._constant(e, st) for e in node.elts]
            return lambda env: items
        if isinstance(node, ast.Name):
            return self._name(node, st)
        if isinstance(node, ast.Attribute):
            sig = self._signal(node, st)
            return self._reader("last", sig, 0.0, {}, st, node)
        if isinstance(node, ast.Call):
            return self._call(node, st)
        raise self._err(f"{type(node).__name__} is not allowed in a condition", node)

    def _compare(self, node: ast.Compare, st: _State) -> Compiled:
        first = self._node(node.left, st)
        for op in node.ops:
            if not isinstance(
                op, ast.Eq | ast.NotEq | ast.Lt | ast.LtE | ast.Gt | ast.GtE | ast.In | ast.NotIn
            ):
                raise self._err(f"comparison {type(op).__name__} is not allowed", node)
        rest = [
            (op, _FAST_COMPARE.get(type(op), _never), self._node(c, st))
            for op, c in zip(node.ops, node.comparators, strict=True)
        ]

        def run(env: Env) -> object:
            a = first(env)
            out: object = True
            for op, fast, fn in rest:
                b = fn(env)
                if a.__class__ is float and b.__class__ is float:
                    r: object = fast(a, b)  # numbers: the common case, no dispatch
                else:
                    r = _compare(op, a, b)
                if r is False:
                    return False
                if r is None:
                    out = None
                a = b
            return out

        return run

    def _constant(self, node: ast.expr, st: _State) -> object:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str):
            if isinstance(node.value, bool):
                raise self._err("booleans are written true/false", node)
            if isinstance(node.value, float) and not math.isfinite(node.value):
                raise self._err(
                    f"number {ast.get_source_segment(st.src, node)} is out of range", node
                )
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = self._constant(node.operand, st)
            if isinstance(v, int | float):
                return -v
        if isinstance(node, ast.Name) and node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise self._err("a list holds only numbers and strings", node)

    def _name(self, node: ast.Name, st: _State) -> Compiled:
        name = node.id
        m = _DUR_NAME.fullmatch(name)
        if m:
            seconds = st.durations[int(m.group(1))][1]
            return lambda env: seconds
        if name in ("true", "True"):
            return lambda env: True
        if name in ("false", "False"):
            return lambda env: False
        if name in CONSTANTS:
            c = CONSTANTS[name]
            return lambda env: c
        if st.fields is not None and name in st.fields:
            # A field the line did not print reads as "" (an event is what it is).
            return lambda env: "" if env.fields is None else _field(env.fields.get(name))
        if name in self.lists:
            items = list(self.lists[name])
            return lambda env: items
        if name in self.macros and st.fields is None:
            expr = self._macro(name, node, st)
            st.signals.update(expr.signals)
            st.macros.add(name)
            st.macros.update(expr.macros)
            return expr.fn
        if st.fields is not None:
            known = ", ".join(sorted(st.fields)) or "none"
            raise self._err(f"unknown event field {name!r} (fields: {known})", node)
        raise self._err(f"unknown name {name!r} (not a macro, list or constant)", node)

    def _macro(self, name: str, node: ast.Name, st: _State) -> Expr:
        if name in self._stack:
            cycle = " -> ".join([*self._stack[self._stack.index(name) :], name])
            raise self._err(f"macro cycle: {cycle}", node)
        # The macro's body stands where its name is: one level below it, and its nodes
        # count as many times as the name appears. Each macro is compiled and costed once
        # per scope, so a chain that doubles at every step is refused in linear time.
        at = self._depth + st.depth_of[node]
        expr = self._macro_cache.get(name)
        cost = self._macro_cost.get(name)
        if expr is None or cost is None:
            self._stack.append(name)
            outer, self._depth = self._depth, at
            try:
                expr, cost = self._compile(self.macros[name])
            except _TooDeep:
                raise  # the expression using the macro is too deep, not the macro
            except ExprError as e:
                if e.message.startswith("in macro ") or e.message.startswith("macro cycle"):
                    raise
                raise ExprError(
                    f"in macro {name!r}: {e.message}", getattr(node, "col_offset", 0)
                ) from None
            finally:
                self._depth = outer
                self._stack.pop()
            self._macro_cache[name] = expr
            self._macro_cost[name] = cost
        if at + cost.depth > MAX_DEPTH:
            raise _TooDeep([*self._stack, name])
        st.depth = max(st.depth, at - self._depth + cost.depth)
        st.nodes += cost.nodes - 1  # the name itself was counted
        st.reads.update(cost.reads)
        _check_nodes(st.nodes)
        return expr

    def _signal(self, node: ast.expr, st: _State, event: bool = False) -> SignalSpec:
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            raise self._err("expected a signal name such as gpu.util", node)
        name = f"{node.value.id}.{node.attr}"
        spec = self.catalog.get(name)
        if spec is None:
            raise self._err(f"unknown signal {name!r}", node)
        if event and spec.kind != "event":
            raise self._err(f"{name} is a {spec.kind}, count() takes an event stream", node)
        if not event and spec.kind == "event":
            raise self._err(f"{name} is an event stream: use count({name}, WINDOW)", node)
        if spec.subject not in ("node", "collector", self.scope) and not (
            self.scope == "node" and spec.subject == "gpu"
        ):
            raise self._err(
                f"{name} is a per-{spec.subject} signal, not usable in a {self.scope} rule", node
            )
        st.signals.add(name)
        return spec

    def _window(self, node: ast.expr, st: _State) -> float:
        if isinstance(node, ast.Name) and _DUR_NAME.fullmatch(node.id):
            return st.durations[int(node.id[4:])][1]
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            if 0 < node.value < math.inf:
                return float(node.value)
        raise self._err("expected a window duration such as 5m", node)

    def _labels(self, call: ast.Call, spec: SignalSpec) -> dict[str, str]:
        labels: dict[str, str] = {}
        for kw in call.keywords:
            if kw.arg is None:
                raise self._err("**labels is not allowed", call)
            if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str | int)):
                raise self._err(f"label {kw.arg} must be a string", kw.value)
            allowed = (*spec.labels, "collector") if spec.subject == "collector" else spec.labels
            if kw.arg not in allowed:
                have = ", ".join(spec.labels) or "none"
                raise self._err(f"{spec.name} has no label {kw.arg!r} (labels: {have})", kw.value)
            labels[kw.arg] = str(kw.value.value)
        if spec.subject == "collector" and "collector" not in labels:
            raise self._err(f'{spec.name} needs collector="NAME"', call)
        return labels

    def _call(self, node: ast.Call, st: _State) -> Compiled:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise self._err(f"unknown function {name!r} (functions: {', '.join(FUNCTIONS)})", node)
        fname = node.func.id
        args = node.args
        if fname == "abs":
            if len(args) != 1 or node.keywords:
                raise self._err("abs() takes one argument", node)
            inner = self._node(args[0], st)
            return lambda env: _abs(inner(env))
        if fname == "count":
            return self._count(node, st)
        if fname == "latest":
            return self._latest(node, st)
        q = 0.0
        if fname == "quantile":
            if (
                not args
                or not isinstance(args[0], ast.Constant)
                or not isinstance(args[0].value, int | float)
            ):
                raise self._err("quantile(Q, SIGNAL, WINDOW) needs a number 0..1 first", node)
            q = float(args[0].value)
            if not 0 <= q <= 1:
                raise self._err("quantile must be between 0 and 1", args[0])
            args = args[1:]
        if not args:
            raise self._err(f"{fname}() needs a signal", node)
        spec = self._signal(args[0], st)
        windowed = fname in (*WINDOW_FUNCS, "quantile", "seen_for")
        want = 2 if windowed else 1
        if len(args) != want:
            sig = f"{fname}(SIGNAL, WINDOW)" if windowed else f"{fname}(SIGNAL)"
            raise self._err(f'{fname}() takes {sig}, labels as name="value"', node)
        window = self._window(args[1], st) if windowed else 0.0
        if fname in ("increase", "rate") and spec.kind != "counter":
            raise self._err(f"{fname}() needs a counter; {spec.name} is a {spec.kind}", node)
        labels = self._labels(node, spec)
        return self._reader(fname, spec, window, labels, st, node, q)

    def _count(self, node: ast.Call, st: _State) -> Compiled:
        args = node.args
        if len(args) not in (2, 3) or node.keywords:
            raise self._err("count(STREAM, WINDOW[, CONDITION]) takes two or three arguments", node)
        spec = self._signal(args[0], st, event=True)
        window = self._window(args[1], st)
        where: Compiled | None = None
        if len(args) == 3:
            inner = _State(st.src, st.durations, fields=set(spec.fields), depth_of=st.depth_of)
            where = self._node(args[2], inner)
        label = st.label(node)
        stream, namespace = spec.name, spec.name.split(".", 1)[0]
        per_subject = spec.subject == self.scope and self.scope != "node"
        sliding = _SlidingCount(window, where, per_subject)

        def plain(env: Env) -> float:
            n = 0
            for ev in env.store.events(stream).since(env.now - window):
                if ev.t > env.now:
                    break
                if per_subject and not _same_subject(ev, env):
                    continue
                if where is not None and not _where_holds(where, env, ev):
                    continue
                if n == 0 and env.oldest is not None:
                    env.oldest.append(ev.t)
                n += 1
            return float(n)

        def run(env: Env) -> object:
            until = math.inf
            if namespace in env.missing:
                result: object = None
            else:
                log = env.store.events(stream)
                got = sliding.count(env, log) if INCREMENTAL_COUNT else None
                if got is None:
                    result, until = plain(env), -math.inf
                else:
                    result = got
                    until = sliding.unchanged_until(env, env.store.retention)
                    first = sliding.oldest(env) if env.oldest is not None else None
                    if first is not None and env.oldest is not None:
                        env.oldest.append(first)
            if env.trace is not None:
                env.trace.append((label, result))
            if env.reads is not None:
                env.reads.append((run, result))
            stamp = env.stamp
            if stamp is not None:
                stamp.streams[stream] = env.store.stream_appended(stream)
                if until < stamp.until:
                    stamp.until = until
            return result

        return run

    def _latest(self, node: ast.Call, st: _State) -> Compiled:
        """latest(STREAM, WINDOW, "FIELD"[, CONDITION]): that field of the newest event in
        the window (for which CONDITION holds), or unknown. What a summary names (the
        NVLink a line reports) or what the last of several lines said (Xid 154's recovery
        action, which a later line can take back)."""
        args = node.args
        if len(args) not in (3, 4) or node.keywords:
            raise self._err(
                'latest(STREAM, WINDOW, "FIELD"[, CONDITION]) takes three or four arguments',
                node,
            )
        spec = self._signal(args[0], st, event=True)
        window = self._window(args[1], st)
        name_node = args[2]
        if not (isinstance(name_node, ast.Constant) and isinstance(name_node.value, str)):
            raise self._err('latest() names its field as a string, e.g. "link"', name_node)
        wanted = name_node.value
        if wanted not in spec.fields:
            known = ", ".join(spec.fields) or "none"
            raise self._err(f"{spec.name} has no field {wanted!r} (fields: {known})", name_node)
        where: Compiled | None = None
        if len(args) == 4:
            inner = _State(st.src, st.durations, fields=set(spec.fields), depth_of=st.depth_of)
            where = self._node(args[3], inner)
        label = st.label(node)
        stream, namespace = spec.name, spec.name.split(".", 1)[0]
        per_subject = spec.subject == self.scope and self.scope != "node"

        def run(env: Env) -> object:
            result: object = None
            if namespace not in env.missing:
                for ev in reversed(env.store.events(stream).since(env.now - window)):
                    if ev.t > env.now:
                        continue
                    if per_subject and not _same_subject(ev, env):
                        continue
                    if where is not None and not _where_holds(where, env, ev):
                        continue
                    value = _field(ev.fields.get(wanted))
                    result = None if value == "" else value
                    break
            if env.trace is not None:
                env.trace.append((label, result))
            if env.reads is not None:
                env.reads.append((run, result))
            if env.stamp is not None:
                env.stamp.until = -math.inf  # the newest event in a moving window
            return result

        return run

    def _reader(
        self,
        fname: str,
        spec: SignalSpec,
        window: float,
        labels: dict[str, str],
        st: _State,
        node: ast.expr,
        q: float = 0.0,
    ) -> Compiled:
        label = st.label(node)
        name = spec.name
        namespace = name.split(".", 1)[0]
        sub_kind = spec.subject
        across_gpus = self.scope == "node" and sub_kind == "gpu"
        want = tuple(sorted(labels.items()))
        collector = labels.pop("collector", None)
        if collector is not None:
            want = tuple(sorted(labels.items()))
        summed = fname in SUMMED

        def subjects(env: Env) -> Iterable[str]:
            if sub_kind == "node":
                return ("node",)
            if sub_kind == "collector":
                return (f"collector:{collector}",)
            if across_gpus:
                return env.store.signal_subjects(name)
            return (env.subject,)

        point_read = fname in ("last", "lowest", "highest", "present", "absent", "seen_for")
        # functions of the window's values alone, which the clock moves only when a value
        # leaves the window (Series.values_until); a window longer than the retention may
        # lose values to it, so those keep the general bound
        of_values = fname in ("min", "max", "increase", "changes")
        method: Callable[..., float | int | None] | None = (
            None if point_read or fname == "quantile" else getattr(Series, fname)
        )

        def one(series: Series, now: float) -> float | None:
            if method is None:
                return series.quantile(q, now, window)
            r = method(series, now, window)
            return None if r is None else float(r)

        # The memo lives for one evaluation pass (one time), so a read is keyed by what it
        # reads and the subject only; an interned int keeps the key cheap to hash.
        read_id = _READ_IDS.setdefault(
            (fname, name, window, q, want, collector, across_gpus), len(_READ_IDS)
        )
        wants_text = fname in ("last", "present", "absent") and not want
        # one label asked for (reason="hw_slowdown"), the usual case: a tuple lookup per
        # label set, not a generator over the pairs asked for
        want_one = want[0] if len(want) == 1 else None

        def run(env: Env) -> object:
            memo = env.memo
            if memo is None:
                result, until = compute(env)
            else:
                key = (read_id, env.subject)
                got = memo.get(key)
                if got is None:
                    got = memo[key] = compute(env)
                result, until = got  # type: ignore[misc]
            if env.trace is not None:
                env.trace.append((label, result))
            if env.reads is not None:
                env.reads.append((run, result))
            stamp = env.stamp
            if stamp is not None:
                store = env.store
                stamp.series[name] = store.generations.get(name, 0)
                held = env.evidence_at
                at = None if held is None else held.get(namespace)
                if at is not None and at <= env.now:
                    stamp.hold_at(namespace, at, until)  # read as of `at` (see Stamp)
                    if not point_read:
                        stamp.evictions = store.evictions
                elif until < stamp.until:
                    stamp.until = until
            return result

        def compute(env: Env) -> tuple[object, float]:
            """The value, and the time until which the clock alone cannot change it."""
            values: list[float] = []
            text: object = None
            store = env.store
            until = math.inf
            now = env.now
            held = env.evidence_at
            if held is not None:
                now = min(now, held.get(namespace, now))
            stale_after = env.stale_after
            fresh_from = now - stale_after
            for subj in subjects(env):
                for lbls, series in store.labelled(name, subj).items():
                    if want_one is not None:
                        if want_one not in lbls:
                            continue
                    elif want and not all(kv in lbls for kv in want):
                        continue
                    if point_read:
                        seen = series.last_seen
                        if seen < fresh_from:
                            continue  # stale until seen again, which bumps the generation
                        if seen + stale_after < until:
                            until = seen + stale_after
                        v = series.last()
                        if fname == "seen_for":
                            # seen for the whole window without a gap: false until then
                            # (observed_since moves only with an append, a new generation)
                            covered_at = series.observed_since + window
                            v = 1.0 if now >= covered_at else 0.0
                            if now < covered_at < until:
                                until = math.nextafter(covered_at, -math.inf)
                    else:
                        v = one(series, now)
                        if of_values and window <= store.retention:
                            bound = series.values_until(now, window)
                        else:
                            bound = series.constant_until(now, window)
                        if bound < until:
                            until = bound
                    if v is not None and v == v:  # v != v: NaN
                        values.append(v)
                if wants_text and not values:
                    text = store.text(name, subj)
            result: object
            if fname == "present":
                result = bool(values) or text is not None
            elif fname == "absent":
                result = not values and text is None
            elif namespace in env.missing:
                result = None
            elif not values:
                result = text
            elif summed:
                result = sum(values)
            elif fname == "seen_for":
                result = min(values) == 1.0  # every label set seen for the whole window
            elif fname == "lowest":
                result = min(values)
            else:
                result = max(values)
            return result, until

        return run

    def _err(self, message: str, node: ast.AST) -> ExprError:
        return ExprError(message, getattr(node, "col_offset", 0))


def _field(v: object) -> object:
    if v is None:
        return ""
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def _abs(v: object) -> object:
    v = _num(v)
    return abs(v) if isinstance(v, int | float) else None


def _same_subject(ev: Event, env: Env) -> bool:
    """An event is about env's subject when it names it, or names its PCI address."""
    keys = _event_keys(ev)
    return env.subject in keys or (env.pci_bus_id is not None and env.pci_bus_id in keys)


def _where_holds(where: Compiled, env: Env, ev: Event) -> bool:
    """count()'s WHERE over one event's fields (unknown counts as false)."""
    env.fields = ev.fields
    try:
        return _truth(where(env)) is True
    finally:
        env.fields = None


# Tests compare the incremental count with the plain walk by turning this off.
INCREMENTAL_COUNT = True


class _SlidingCount:
    """count(STREAM, WINDOW[, WHERE]) kept up to date event by event.

    A plain count walks every event of the window for every subject every tick, and
    evaluates WHERE on each: after a kernel-log flood (10,000 Xid lines) that is millions
    of evaluations a second. Here each event is tested once, when it arrives, and filed
    under the keys a subject can match it by (its subject, its PCI address); a tick then
    only drops what left the window. A query earlier than the last one (explain at a past
    time) returns None and the caller walks the log plainly."""

    def __init__(self, window: float, where: Compiled | None, per_subject: bool) -> None:
        self.window = window
        self.where = where
        self.per_subject = per_subject
        self.log: object = None
        self.seq = 0  # last event filed
        self.now = -math.inf
        self.seen = 0  # log.appended when last looked at
        self.next_t = math.inf  # time of the first event not yet filed (from the future)
        self.matches: dict[str, deque[tuple[float, int]]] = {}  # key -> (t, seq)

    def count(self, env: Env, log: EventLog) -> float | None:
        now = env.now
        if log is not self.log:
            self.log, self.seq, self.now, self.matches = log, 0, -math.inf, {}
            self.seen, self.next_t = 0, math.inf
        elif now < self.now:
            return None
        if now != self.now or log.appended != self.seen:
            self._advance(env, log, now)
        if not self.per_subject:
            return float(len(self.matches.get("*", ())))
        mine = self.matches.get(env.subject)
        by_pci = self.matches.get(env.pci_bus_id) if env.pci_bus_id else None
        if not by_pci:
            return float(len(mine or ()))
        if not mine:
            return float(len(by_pci))
        return float(len({seq for _, seq in mine} | {seq for _, seq in by_pci}))

    def oldest(self, env: Env) -> float | None:
        """After count(): the time of the oldest event counted, None when none is."""
        keys = [env.subject, env.pci_bus_id] if self.per_subject else ["*"]
        queues = [self.matches.get(k) for k in keys if k]
        return min((q[0][0] for q in queues if q), default=None)

    def unchanged_until(self, env: Env, retention: float) -> float:
        """After count(): the latest time until which, with no new event, the count stays
        what it is (its oldest counted event leaves the window, or the store's retention,
        after that; -inf while events from the future wait to be filed)."""
        if self.next_t != math.inf:
            return -math.inf
        if self.per_subject:
            queues = [self.matches.get(env.subject)]
            if env.pci_bus_id:
                queues.append(self.matches.get(env.pci_bus_id))
        else:
            queues = [self.matches.get("*")]
        oldest = min((q[0][0] for q in queues if q), default=None)
        if oldest is None:
            return math.inf
        return oldest + min(self.window, retention)

    def _advance(self, env: Env, log: EventLog, now: float) -> None:
        # Events from the future (a replayed bundle is loaded whole) wait, unread, until
        # the clock reaches the first of them.
        new = log.appended != self.seen and self.next_t == math.inf
        events, seq = log.after(self.seq) if new or self.next_t <= now else ([], 0)
        self.seen = log.appended
        self.next_t = math.inf
        for ev in events:
            if ev.t > now:
                self.next_t = ev.t
                break
            self.seq = seq
            seq += 1
            if self.where is not None and not _where_holds(self.where, env, ev):
                continue
            for key in _event_keys(ev) if self.per_subject else ("*",):
                self.matches.setdefault(key, deque()).append((ev.t, self.seq))
        self.now = now
        start = now - self.window
        oldest = log.appended - len(log) + 1  # what the bounded log still holds counts
        for key in list(self.matches):
            q = self.matches[key]
            while q and (q[0][0] < start or q[0][1] < oldest):
                q.popleft()
            if not q:
                del self.matches[key]


def _event_keys(ev: Event) -> set[str]:
    """What a subject may match an event by: its subject, and its normalised PCI address
    (from a pci_bus_id field or a gpu:<pci> subject)."""
    keys = {ev.subject}
    pci = ev.fields.get("pci_bus_id") if ev.fields else None
    if isinstance(pci, str) and (norm := normalize_pci(pci)):
        keys.add(norm)
    if subject_kind(ev.subject) == "gpu" and (norm := normalize_pci(ev.subject[4:])):
        keys.add(norm)
    return keys


def _and(parts: list[Compiled]) -> Compiled:
    def run(env: Env) -> object:
        out: object = True
        for p in parts:
            t = _truth(p(env))
            if t is False:
                return False
            if t is None:
                out = None
        return out

    return run


def _or(parts: list[Compiled]) -> Compiled:
    def run(env: Env) -> object:
        out: object = False
        for p in parts:
            t = _truth(p(env))
            if t is True:
                return True
            if t is None:
                out = None
        return out

    return run


def _not(v: object) -> object:
    t = _truth(v)
    return None if t is None else not t


def truth(v: object) -> bool | None:
    """The three-valued truth of a condition's result: True, False or None (unknown)."""
    return _truth(v)


@dataclass(frozen=True, slots=True)
class Cost:
    """An expression's size after macro expansion: its nodes, and its nesting depth."""

    nodes: int
    depth: int
    reads: frozenset[str] = frozenset()


class _TooDeep(ExprError):
    """Nested deeper than MAX_DEPTH; through macros, the fault of the expression using them."""

    def __init__(self, through: list[str]) -> None:
        via = f", through macro {' -> '.join(_ends(through))}" if through else ""
        super().__init__(f"nested more than {MAX_DEPTH} levels deep (the limit){via}")


def _ends(names: list[str]) -> list[str]:
    return names if len(names) <= 6 else [*names[:3], "...", *names[-2:]]


def _check_tokens(src: str) -> None:
    """The limits a text's tokens show, before ast.parse (which recurses) sees it."""
    n = 0
    for m in _TOKEN.finditer(src):
        n += 1
        if n > MAX_TOKENS:
            raise ExprError(f"more than {MAX_TOKENS} tokens (the limit)", m.start())
        number = m.group(3)
        if number is not None and len(number) > MAX_NUMBER_CHARS:
            shown = number if len(number) <= 20 else f"{number[:12]}...{number[-4:]}"
            raise ExprError(
                f"number {shown} has {len(number)} characters (the limit is {MAX_NUMBER_CHARS})",
                m.start(),
            )


def _depths(root: ast.expr, base: int, through: list[str]) -> dict[ast.expr, int]:
    """Every expression node of ``root`` with its depth below ``base``, walked without
    recursion; refuses a tree deeper than MAX_DEPTH before the compiler recurses into it."""
    out: dict[ast.expr, int] = {}
    todo: list[tuple[ast.AST, int]] = [(root, base + 1)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, ast.expr):
            if depth > MAX_DEPTH:
                raise _TooDeep(through)
            out[node] = depth - base
            depth += 1
        todo.extend((child, depth) for child in ast.iter_child_nodes(node))
    return out


def _check_nodes(nodes: int) -> None:
    if nodes > MAX_NODES:
        raise ExprError(f"more than {MAX_NODES} nodes after macro expansion (the limit)")


@dataclass
class _State:
    src: str
    durations: list[tuple[str, float]]
    signals: set[str] = field(default_factory=set)
    macros: set[str] = field(default_factory=set)
    fields: set[str] | None = None
    depth_of: dict[ast.expr, int] = field(default_factory=dict)  # below the text's root
    nodes: int = 0  # after macro expansion so far
    depth: int = 0  # likewise, the root being 1
    reads: set[str] = field(default_factory=set)  # windowed reads, macros expanded
    _encoded: bytes | None = None  # src as UTF-8, for segment()

    def label(self, node: ast.AST) -> str:
        seg = self.segment(node) or ast.unparse(node)
        return _DUR_NAME.sub(lambda m: self.durations[int(m.group(1))][0], seg)

    def segment(self, node: ast.AST) -> str | None:
        """ast.get_source_segment(self.src, node). That one splits the whole text into
        lines, a character at a time, on every call: a sixth of loading the shipped rules
        (the labels of 660 nodes). A text of one line is its own only line, so the node's
        columns (UTF-8 offsets) index its bytes directly; any other text goes the slow way."""
        if "\n" in self.src or "\r" in self.src:
            return ast.get_source_segment(self.src, node)
        start = getattr(node, "col_offset", None)
        end = getattr(node, "end_col_offset", None)
        if start is None or end is None or getattr(node, "end_lineno", None) is None:
            return None
        if self._encoded is None:
            self._encoded = self.src.encode()
        return self._encoded[start:end].decode()
