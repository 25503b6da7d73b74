"""The float64 law of token-tree verification (``spec_backend.testing.tree_spec``), enumerated exactly on
small vocabularies: recursive rejection sampling keeps the target's law for every sibling scheme and tree
shape; the naive rules do not (negative controls); greedy follows the target's argmax path; a tree emits
more than the chain of the same number of nodes when its siblings cover the target's alternatives."""

from __future__ import annotations

import pytest

from spec_backend.testing.exact import ToyModel, continued, target_joint, total_variation
from spec_backend.testing.tree_spec import LOSSLESS_RULES, SCHEMES, TreeShape, emitted_law, expected_emitted
from spec_backend.verify_rules import TREE_REGISTRY, TreeRule

SHAPES = {
    "chain-3": TreeShape((-1, 0, 1)),
    "fan-3": TreeShape((-1, -1, -1)),
    "2x2": TreeShape((-1, -1, 0, 0, 1)),
    "eagle-6": TreeShape((-1, -1, 0, 0, 1, 2)),
}
V = 4


def _deviation(shape: TreeShape, scheme: str, rule: str, target: ToyModel, draft: ToyModel) -> float:
    law = emitted_law(shape, target, draft, scheme, rule)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    length = shape.depth + 1
    return total_variation(continued(law, target, length), target_joint(target, length))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("rule", LOSSLESS_RULES)
@pytest.mark.parametrize("seed", [0, 1])
def test_lossless_tree_rules_keep_the_target_law(shape: str, scheme: str, rule: str, seed: int) -> None:
    target = ToyModel(V, seed=seed, zero_frac=0.2)
    draft = ToyModel(V, seed=seed + 50, scale=2.0)
    assert _deviation(SHAPES[shape], scheme, rule, target, draft) < 1e-12


def test_recursive_rejection_sampling_accepts_more_than_point_masses_of_sampled_siblings() -> None:
    target, draft = ToyModel(V, seed=6), ToyModel(V, seed=56, scale=0.7)
    for scheme in ("iid", "without_replacement"):
        laws = [emitted_law(SHAPES["2x2"], target, draft, scheme, r) for r in ("rrs", "point_mass")]
        assert expected_emitted(laws[0]) > expected_emitted(laws[1]) + 1e-3


@pytest.mark.parametrize(
    ("scheme", "rule"),
    [
        ("without_replacement", "naive_iid"),  # siblings drawn without replacement judged as i.i.d.
        ("iid", "no_residual"),  # the target's distribution not reduced after a rejection
        ("point", "no_residual"),
    ],
)
def test_naive_tree_samplers_change_the_law(scheme: str, rule: str) -> None:
    target, draft = ToyModel(V, seed=3), ToyModel(V, seed=53, scale=2.0)
    assert _deviation(SHAPES["2x2"], scheme, rule, target, draft) > 1e-3


@pytest.mark.parametrize(
    "rule", [r for r in TREE_REGISTRY if not r.lossless and not r.paths], ids=lambda r: r.name
)
def test_every_rule_the_registry_calls_lossy_changes_the_law_for_some_scheme(rule: TreeRule) -> None:
    target, draft = ToyModel(V, seed=3), ToyModel(V, seed=53, scale=2.0)
    assert max(_deviation(SHAPES["2x2"], scheme, rule.name, target, draft) for scheme in SCHEMES) > 1e-3


def test_the_rules_with_a_kernel_are_the_lossless_ones() -> None:
    """The registry's rules with a kernel (``SamplerOps.tree_verify``) are the lossless ones: ``rrs``
    reads the siblings' draft distributions, ``point_mass`` judges every node as a point mass (the trees
    the engine drafts); the lossy negative controls have none. (The multi-path rules: ``test_gbv.py``.)"""
    runnable = {r.name: r.draft_probs for r in TREE_REGISTRY if r.kernel is not None and not r.paths}
    assert runnable == {"rrs": True, "point_mass": False}
    assert sorted(runnable) == sorted(LOSSLESS_RULES)


def test_greedy_verification_emits_the_target_argmax_path() -> None:
    target, draft = ToyModel(V, seed=4), ToyModel(V, seed=54)
    shape = SHAPES["eagle-6"]
    law = emitted_law(shape, target, draft, "point", "greedy")
    ((seq, mass),) = law.items()
    assert mass == pytest.approx(1.0)
    greedy = []
    for _ in range(len(seq)):
        greedy.append(int(target(tuple(greedy)).argmax()))
    assert list(seq) == greedy


def test_a_tree_emits_more_than_a_chain_of_as_many_nodes_where_the_target_hesitates() -> None:
    """A target torn between two tokens (0.45 each) and a top-k drafter that knows it: the binary tree of
    depth 2 (6 nodes) accepts each level with probability 0.9; the 6-node chain of argmaxes, each with
    0.45. Exactly: the tree emits 1 + 0.9 + 0.81 tokens, the chain 1 + 0.45 + ... + 0.45^6."""
    target = ToyModel(V, probs=[0.45, 0.45, 0.05, 0.05])
    tree = expected_emitted(emitted_law(TreeShape((-1, -1, 0, 0, 1, 1)), target, target, "point", "rrs"))
    chain = expected_emitted(emitted_law(TreeShape((-1, 0, 1, 2, 3, 4)), target, target, "point", "rrs"))
    assert tree == pytest.approx(1 + 0.9 + 0.81)
    assert chain == pytest.approx(sum(0.45**i for i in range(7)))
    assert tree > chain


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"node\(s\) \[1\] must have a parent in -1..i-1"):
        TreeShape((-1, 1))
