"""YAML loading with a bound on what aliases expand to.

yaml.safe_load builds no Python objects from tags, but it accepts aliases, and a few
hundred bytes of nested aliases ("billion laughs") describe a document of 10^9 nodes. The
loader itself shares the aliased objects, so loading is quick; whatever walks the result
afterwards (schema validation, line maps, merging with defaults) visits every expanded
node and does not come back. Recursive aliases (``&a [*a]``) never end at all. Every
moptd YAML reader goes through here so that such a file is refused with its line instead.

Parsing is libyaml's (yaml.CSafeLoader) where PyYAML was built with it: the shipped rules
took about 1 s to parse with the pure-Python loader on every `moptd explain`, and 0.1 s
with libyaml. Both loaders give the same nodes, with the same marks (line numbers), to the
same constructors, so a duplicate key or an alias bomb is refused the same way. A document
libyaml cannot parse is parsed again by PyYAML for its message, so errors read as before;
libyaml refuses nesting deeper than 1,000 levels itself, reported as "nested too deeply",
as the pure-Python composer's RecursionError is.
"""

from __future__ import annotations

from typing import Any

import yaml

# Expanded nodes a document may have. The shipped rule set is about 6,000 nodes and a
# full configuration a few hundred; anchors in rule files (shared verdicts) add little.
MAX_NODES = 200_000

LIBYAML = bool(getattr(yaml, "__with_libyaml__", False))
# The loader a reader gets when it names none: libyaml's parser, SafeConstructor's types.
Loader = yaml.SafeLoader | yaml.CSafeLoader
SAFE_LOADER: type[Loader] = yaml.CSafeLoader if LIBYAML else yaml.SafeLoader


class YamlTooLarge(yaml.MarkedYAMLError):
    """A document whose aliases expand past MAX_NODES, or refer to themselves."""


def check_expansion(root: yaml.Node | None, max_nodes: int = MAX_NODES) -> None:
    """Raise YamlTooLarge, marked at the node that crosses the bound, when the node graph
    expands (aliases followed) to more than max_nodes nodes or contains a cycle."""
    if root is None or _small_tree(root, max_nodes):
        return
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # iterative post-order: a deeply nested document must not exhaust Python's stack
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            size = 1 + sum(sizes[id(c)] for c in _children(node))
            if size > max_nodes:
                # Post-order: every node under this one is in `sizes`, so a size beyond
                # their count can only come from aliases.
                aliased = size > len(sizes) + 1
                raise YamlTooLarge(
                    problem=f"expands to more than {max_nodes} nodes through aliases"
                    if aliased
                    else f"has more than {max_nodes} nodes",
                    problem_mark=node.start_mark,
                )
            sizes[key] = size
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YamlTooLarge(problem="an alias refers to itself", problem_mark=node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise YamlTooLarge(
                    problem="an alias refers to its own node", problem_mark=child.start_mark
                )
            if id(child) not in sizes:
                stack.append((child, False))


def _small_tree(root: yaml.Node, max_nodes: int) -> bool:
    """True when no node is reached twice (no alias, so no cycle: the expanded document is
    the nodes themselves) and there are at most max_nodes of them: the common case, one
    quick pass. Otherwise (aliases, or too many nodes) the walk above decides and says where."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        key = id(node)
        if key in seen:
            return False
        seen.add(key)
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for pair in node.value:
                stack.extend(pair)
    return len(seen) <= max_nodes


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def compose(text: str, loader: type[Loader] = SAFE_LOADER) -> yaml.Node | None:
    """yaml.compose with the expansion bound. Raises yaml.YAMLError (YamlTooLarge)."""
    ld = loader(text)
    try:
        node = _single_node(ld, text)
        check_expansion(node)
        return node
    finally:
        ld.dispose()


def load(text: str, loader: type[Loader] = SAFE_LOADER) -> Any:
    """yaml.load with a safe loader and the expansion bound. Raises yaml.YAMLError."""
    ld = loader(text)
    try:
        node = _single_node(ld, text)
        check_expansion(node)
        return None if node is None else ld.construct_document(node)
    finally:
        ld.dispose()


def compose_and_load(text: str, loader: type[Loader] = SAFE_LOADER) -> tuple[yaml.Node | None, Any]:
    """(compose(text), load(text)) from one parse, for a reader that wants the nodes' lines
    as well as the values (the Xid catalog: its two parses were a fifth of `moptd explain`
    with the daemon up). Constructing flattens merge keys (<<) in the nodes it reads, so a
    document with one is parsed twice, as before, and its nodes are compose's own."""
    if "<<" in text:
        return compose(text, loader), load(text, loader)
    ld = loader(text)
    try:
        node = _single_node(ld, text)
        check_expansion(node)
        return node, None if node is None else ld.construct_document(node)
    finally:
        ld.dispose()


def _single_node(ld: Loader, text: str) -> yaml.Node | None:
    try:
        node: yaml.Node | None = ld.get_single_node()
    except RecursionError:
        # the composer recurses per nesting level; thousands of "[" end here
        raise yaml.YAMLError("nested too deeply") from None
    except yaml.YAMLError as exc:
        if isinstance(ld, yaml.SafeLoader):
            raise
        # libyaml words its errors otherwise than PyYAML, whose messages moptd's errors,
        # docs and tests quote: on this error path only, parse again for PyYAML's words
        slow = yaml.SafeLoader(text)
        try:
            _single_node(slow, text)
        finally:
            slow.dispose()
        # PyYAML read it: what libyaml refused is its own bound on nesting (1,000 levels)
        mark = exc.problem_mark if isinstance(exc, yaml.MarkedYAMLError) else None
        raise yaml.MarkedYAMLError(problem="nested too deeply", problem_mark=mark) from None
    return node
