"""The torch tree verifier (``sampling/tree_verify.py``) samples the float64 law of
``testing/tree_spec.py``: N trees drafted by each sibling scheme (vocabulary 4, the 2x2 tree of 5 nodes,
toy target and draft), verified with random uniforms; the emitted sequences are compared with the exact
law by Pearson χ², noise floor p >= 1e-5. Negative controls: the same counts against the law of another
target must fail (power), and the op handed the parent's ``q`` instead of the without-replacement
conditional (the naive sampler) must fail too."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from spec_backend.sampling.tree_verify import verify_tree, verify_tree_greedy
from spec_backend.testing.exact import ToyModel
from spec_backend.testing.montecarlo import chi_square
from spec_backend.testing.tree_spec import TreeShape, drafted_trees, emitted_law, sibling_q

pytestmark = pytest.mark.statistical

V, N = 4, 12000
SHAPE = TreeShape((-1, -1, 0, 0, 1))
TARGET, DRAFT, OTHER = (
    ToyModel(V, seed=11, zero_frac=0.2),
    ToyModel(V, seed=61, scale=2.0),
    ToyModel(V, seed=12),
)


def _draft(
    rng: np.random.Generator, scheme: str, draft: ToyModel
) -> tuple[tuple[int, ...], list[np.ndarray] | None]:
    """One tree's tokens and the distribution each was drawn from given its earlier siblings."""
    if scheme == "point":
        return next(drafted_trees(SHAPE, draft, "point"))[0], None
    tokens: list[int] = []
    qs: list[np.ndarray] = []
    for node, parent in enumerate(SHAPE.parents):
        earlier = [tokens[s] for s in SHAPE.children(parent) if s < node]
        q = sibling_q(draft(SHAPE.path(tuple(tokens), parent)), earlier, scheme)
        tokens.append(int(rng.choice(V, p=q)))
        qs.append(q)
    return tuple(tokens), qs


def _counts(scheme: str, draft: ToyModel = DRAFT, naive: bool = False) -> Counter[tuple[int, ...]]:
    rng, counts = np.random.default_rng(5), Counter[tuple[int, ...]]()
    for _ in range(N):
        tokens, qs = _draft(rng, scheme, draft)
        rows = [TARGET(())] + [TARGET(SHAPE.path(tokens, i)) for i in range(len(tokens))]
        if naive and qs is not None:  # every sibling judged against its parent's q
            qs = [draft(SHAPE.path(tokens, p)) for p in SHAPE.parents]
        q = torch.tensor(np.stack(qs)) if qs is not None else None
        out = verify_tree(
            SHAPE.parents,
            tokens,
            torch.tensor(np.stack(rows)),
            q,
            rng.random(len(tokens)).tolist(),
            float(rng.random()),
        )
        counts[out.emitted(tokens)] += 1
    return counts


@pytest.mark.parametrize("scheme", ["iid", "without_replacement", "point"])
def test_the_torch_verifier_samples_the_exact_tree_law(scheme: str) -> None:
    counts = _counts(scheme)
    fit = chi_square(counts, emitted_law(SHAPE, TARGET, DRAFT, scheme, "rrs"))
    assert fit.passed and fit.impossible == 0, f"{scheme}: {fit}"
    control = chi_square(counts, emitted_law(SHAPE, OTHER, DRAFT, scheme, "rrs"))
    assert not control.passed, f"no power: another target's law also fits ({control})"


def test_the_naive_sibling_rule_is_detected() -> None:
    """A peaked draft (exact TV of the naive rule's law from the target's: 0.31) drawn without
    replacement, judged as if i.i.d."""
    peaked = ToyModel(V, seed=63, scale=3.0)
    law = emitted_law(SHAPE, TARGET, peaked, "without_replacement", "rrs")
    assert chi_square(_counts("without_replacement", peaked), law).passed
    fit = chi_square(_counts("without_replacement", peaked, naive=True), law)
    assert not fit.passed, f"the naive rule went unnoticed: {fit}"


def test_greedy_tree_verification_follows_the_argmax_path() -> None:
    tokens, _ = next(drafted_trees(SHAPE, TARGET, "point"))  # the target's own top-k: the argmax path matches
    argmax = [int(TARGET(()).argmax())] + [
        int(TARGET(SHAPE.path(tokens, i)).argmax()) for i in range(len(tokens))
    ]
    out = verify_tree_greedy(SHAPE.parents, tokens, argmax)
    (law,) = emitted_law(SHAPE, TARGET, TARGET, "point", "greedy")
    assert out.emitted(tokens) == law and len(out.path) == SHAPE.depth
