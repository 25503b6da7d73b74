"""Speculative token trees: a string such as ``"[(0,), (0, 0), (1,)]"``.

Each node is a tuple of child indices from the root: ``(0,)`` is the root's first child, ``(0, 1)`` the
second child of ``(0,)``. A chain of K tokens is ``[(0,), (0, 0), ..., (0,) * K]``. Trees are stored
sorted breadth-first (by depth, then lexicographically), as vLLM does.

``tree_top_k`` and ``tree_nodes`` (this engine's own; SGLang calls them ``speculative_eagle_topk`` and
``speculative_num_draft_tokens`` minus one, as its count includes the root) ask instead for EAGLE-2's
dynamic tree, grown afresh each step from the draft's probabilities: ``num_speculative_tokens`` levels,
the ``tree_top_k`` most probable frontier nodes each expanded into their ``tree_top_k`` most likely
children, and the ``tree_nodes`` nodes of highest cumulative draft probability kept
(``proposers.tree_build.dynamic_tree``). ``tree_paths`` (2..8, this engine's own) asks for that many
draft paths of ``num_speculative_tokens`` tokens, each sampled from the draft independently, merged into
a trie and verified by greedy multi-path block verification (``proposers.draft_paths``).
"""

from __future__ import annotations

import ast
from typing import Any

TokenTree = list[tuple[int, ...]]

#: Refuse tree strings longer than this before parsing them (a tree of a few thousand nodes).
MAX_TREE_STRING_LENGTH = 200_000


def chain_tree(num_speculative_tokens: int) -> str:
    """The default tree: a single chain of ``num_speculative_tokens`` nodes."""
    return str([(0,) * (i + 1) for i in range(num_speculative_tokens)])


def branching_tree(tree: TokenTree | None) -> TokenTree | None:
    """``tree`` when some node is not its parent's first child (a tree that branches), else ``None``."""
    return tree if tree is not None and any(node[-1] > 0 for node in tree) else None


def tree_to_string(value: Any) -> Any:
    """Accept a tree given as a JSON list of lists (``[[0], [0, 0]]``) and turn it into the string form.

    Anything else is returned unchanged for the type check.
    """
    if isinstance(value, list | tuple) and all(isinstance(node, list | tuple) for node in value):
        return str([tuple(node) for node in value])
    return value


def parse_token_tree(text: str) -> TokenTree:
    """Parse and validate a tree string; raise ``ValueError`` saying what is wrong.

    Rules: a non-empty list of non-empty tuples of non-negative ints, no duplicate nodes, and every
    node's parent (the tuple without its last index) is present too.
    """
    if len(text) > MAX_TREE_STRING_LENGTH:
        raise ValueError(
            f"speculative_token_tree is too long ({len(text)} characters, at most {MAX_TREE_STRING_LENGTH})"
        )
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(
            f"speculative_token_tree must be a Python literal list of tuples such as "
            f"'[(0,), (0, 0), (1,)]', got {text!r} ({type(exc).__name__})"
        ) from None
    if not isinstance(parsed, list | tuple) or not parsed:
        raise ValueError(f"speculative_token_tree must be a non-empty list of tuples, got {text!r}")
    nodes: TokenTree = []
    for node in parsed:
        if (
            not isinstance(node, tuple | list)
            or not node
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in node)
        ):
            raise ValueError(
                "every speculative_token_tree node must be a non-empty tuple of non-negative ints "
                f"(child indices from the root), got node {node!r} in {text!r}"
            )
        nodes.append(tuple(node))
    seen = set(nodes)
    if len(seen) != len(nodes):
        raise ValueError(f"speculative_token_tree has duplicate nodes: {text!r}")
    for node in nodes:
        if len(node) > 1 and node[:-1] not in seen:
            raise ValueError(
                f"speculative_token_tree node {node} has no parent {node[:-1]} in the tree {text!r}"
            )
    return nodes


def dynamic_tree_limit(k: int, top_k: int) -> int:
    """The nodes an EAGLE-2 tree of ``k`` levels grows: ``top_k`` children of the root, then ``top_k``
    children of each of ``top_k`` frontier nodes per level."""
    return top_k + (k - 1) * top_k * top_k


def resolve_dynamic_tree_fields(config: Any) -> None:
    """Check ``tree_top_k`` / ``tree_nodes`` and ``tree_paths`` (module docstring) against each other, K
    and a static tree."""
    top_k, nodes, k = config.tree_top_k, config.tree_nodes, config.num_speculative_tokens
    paths = config.tree_paths
    if paths is not None and (top_k is not None or nodes is not None):
        raise ValueError(
            f"tree_paths={paths} drafts i.i.d. paths; tree_top_k/tree_nodes grow a dynamic tree: give one "
            "or the other"
        )
    if paths is not None and branching_tree(parse_token_tree(config.speculative_token_tree or "[(0,)]")):
        raise ValueError(
            f"tree_paths={paths} drafts i.i.d. paths; speculative_token_tree="
            f"{config.speculative_token_tree!r} is a static tree: give one or the other"
        )
    if (top_k is None) != (nodes is None):
        raise ValueError(
            f"a dynamic token tree needs both tree_top_k and tree_nodes, got tree_top_k={top_k!r} and "
            f"tree_nodes={nodes!r}"
        )
    if top_k is None:
        return
    if branching_tree(parse_token_tree(config.speculative_token_tree or "[(0,)]")) is not None:
        raise ValueError(
            f"tree_top_k/tree_nodes grow a dynamic tree; speculative_token_tree="
            f"{config.speculative_token_tree!r} is a static one: give one or the other"
        )
    limit = dynamic_tree_limit(k, top_k)
    if not k <= nodes <= limit:
        raise ValueError(
            f"tree_nodes must be in [num_speculative_tokens, {limit}] (at least the tree's depth, at most "
            f"what {k} levels of tree_top_k={top_k} grow), got {nodes}"
        )


def sort_token_tree(text: str) -> str:
    """Validate ``text`` and return it sorted breadth-first."""
    return str(sorted(parse_token_tree(text), key=lambda t: (len(t), t)))


__all__ = [
    "TokenTree",
    "branching_tree",
    "chain_tree",
    "dynamic_tree_limit",
    "parse_token_tree",
    "resolve_dynamic_tree_fields",
    "sort_token_tree",
    "tree_to_string",
]
