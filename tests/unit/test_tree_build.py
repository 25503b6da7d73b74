"""Building draft trees (``proposers/tree_build.py``): static trees from ``speculative_token_tree`` and
EAGLE-2 dynamic trees — exact expectations, the ancestor-closure property, and (with the float64 tree law)
a dynamic tree that emits more than a chain of as many nodes."""

from __future__ import annotations

import pytest
import torch

from spec_backend.config.token_tree import parse_token_tree
from spec_backend.proposers.tree_build import DraftTree, dynamic_tree, fill_static, static_shape
from spec_backend.testing.exact import ToyModel
from spec_backend.testing.tree_spec import TreeShape, drafted_trees, emitted_law, expected_emitted


def _dist(model: ToyModel) -> object:
    return lambda parent, path: torch.tensor(model(path))


def test_a_static_tree_takes_the_ranked_tokens_after_each_parent() -> None:
    tree = parse_token_tree("[(0,), (1,), (0, 0), (0, 1), (1, 0)]")
    parents, ranks = static_shape(tree)
    assert parents == (-1, -1, 0, 0, 1) and ranks == (0, 1, 0, 1, 0)
    model = ToyModel(6, seed=2)
    drafted = fill_static(parents, ranks, _dist(model))  # type: ignore[arg-type]
    for node, (parent, rank) in enumerate(zip(parents, ranks, strict=True)):
        order = torch.argsort(torch.tensor(model(drafted.path(parent))), descending=True, stable=True)
        assert drafted.tokens[node] == int(order[rank])
    assert drafted.depths == [1, 1, 2, 2, 2]


def test_eagle2_keeps_the_budget_nodes_of_highest_cumulative_probability() -> None:
    fixed = ToyModel(4, probs=[0.5, 0.3, 0.15, 0.05])
    # level 1: 0 (.5), 1 (.3); level 2: 0,0 (.25), 0,1 (.15), 1,0 (.15), 1,1 (.09): ties go to the earlier
    tree = dynamic_tree(_dist(fixed), depth=2, top_k=2, budget=4)  # type: ignore[arg-type]
    assert tree == DraftTree((-1, -1, 0, 0), (0, 1, 0, 1))
    with pytest.raises(ValueError, match="depth, top_k and budget must be >= 1, got 2, 0, 4"):
        dynamic_tree(_dist(fixed), depth=2, top_k=0, budget=4)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(6))
def test_dynamic_trees_keep_every_ancestor(seed: int) -> None:
    tree = dynamic_tree(_dist(ToyModel(5, seed=seed)), depth=4, top_k=3, budget=9)  # type: ignore[arg-type]
    assert len(tree.tokens) == 9
    assert all(-1 <= p < i for i, p in enumerate(tree.parents))
    for parent in set(tree.parents):  # siblings are distinct tokens
        kids = [tree.tokens[i] for i, p in enumerate(tree.parents) if p == parent]
        assert len(kids) == len(set(kids))


def test_a_dynamic_tree_emits_more_than_a_chain_of_as_many_nodes() -> None:
    """Draft = target (a constructed head that predicts it exactly), temperature 1: both verified
    losslessly with point-mass siblings; the tree covers the alternatives a chain cannot."""
    target = ToyModel(4, seed=8, scale=0.8)
    tree = dynamic_tree(_dist(target), depth=3, top_k=2, budget=6)  # type: ignore[arg-type]
    shape = TreeShape(tree.parents)
    assert next(drafted_trees(shape, target, "point"))[0] == tree.tokens  # the law is of this very tree
    law = emitted_law(shape, target, target, "point", "rrs")
    chain = emitted_law(TreeShape(tuple(range(-1, 5))), target, target, "point", "rrs")
    assert expected_emitted(law) > expected_emitted(chain) + 0.1
