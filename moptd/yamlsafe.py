"""YAML loading with a bound on what aliases expand to.

yaml.safe_load builds no Python objects from tags, but it accepts aliases, and a few
hundred bytes of nested aliases ("billion laughs") describe a document of 10^9 nodes. The
loader itself shares the aliased objects, so loading is quick; whatever walks the result
afterwards (schema validation, line maps, merging with defaults) visits every expanded
node and does not come back. Recursive aliases (``&a [*a]``) never end at all. Every
moptd YAML reader goes through here so that such a file is refused with its line instead.
"""

from __future__ import annotations

from typing import Any

import yaml

# Expanded nodes a document may have. The shipped rule set is about 6,000 nodes and a
# full configuration a few hundred; anchors in rule files (shared verdicts) add little.
MAX_NODES = 200_000


class YamlTooLarge(yaml.MarkedYAMLError):
    """A document whose aliases expand past MAX_NODES, or refer to themselves."""


def check_expansion(root: yaml.Node | None, max_nodes: int = MAX_NODES) -> None:
    """Raise YamlTooLarge, marked at the node that crosses the bound, when the node graph
    expands (aliases followed) to more than max_nodes nodes or contains a cycle."""
    if root is None:
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


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def compose(text: str, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> yaml.Node | None:
    """yaml.compose with the expansion bound. Raises yaml.YAMLError (YamlTooLarge)."""
    ld = loader(text)
    try:
        node = _single_node(ld)
        check_expansion(node)
        return node
    finally:
        ld.dispose()


def load(text: str, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> Any:
    """yaml.load with a safe loader and the expansion bound. Raises yaml.YAMLError."""
    ld = loader(text)
    try:
        node = _single_node(ld)
        check_expansion(node)
        return None if node is None else ld.construct_document(node)
    finally:
        ld.dispose()


def _single_node(ld: yaml.SafeLoader) -> yaml.Node | None:
    try:
        node: yaml.Node | None = ld.get_single_node()
    except RecursionError:
        # the composer recurses per nesting level; thousands of "[" end here
        raise yaml.YAMLError("nested too deeply") from None
    return node
