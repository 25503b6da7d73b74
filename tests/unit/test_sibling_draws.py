"""Sampled siblings for static token trees (``proposers/sibling_draws.py``, #42): a sampled request's
children are an ordered draw without replacement from the drafter's distribution under its temperature
(Plackett–Luce law, Pearson χ² over 4000 seeds, noise floor p >= 1e-5, with the i.i.d. law as negative
control), each node's recorded distribution is exactly ``q`` without its earlier siblings, renormalised,
greedy requests keep the top tokens as one-hot rows, and the noise depends on the seed, the step's first
position and the parent only."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import permutations

import torch

from spec_backend.proposers.sibling_draws import SampledSiblings, sampled_siblings, static_tree_output
from spec_backend.testing.montecarlo import chi_square

V = 4
LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0])  # q at temperature 1: [0.61, 0.22, 0.14, 0.03]


@dataclass
class _Request:
    seed: int
    temperature: float = 1.0
    tokens: int = 10
    request_id: str = "r"
    prompt_token_ids: tuple[int, ...] = ()
    output_token_ids: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return self.tokens


def _q(temperature: float = 1.0) -> torch.Tensor:
    return torch.softmax(LOGITS / temperature, -1)


def test_children_are_ordered_draws_without_replacement() -> None:
    n = 4000
    requests = [_Request(seed=s) for s in range(n)]
    drawn = SampledSiblings(requests).children(-1, LOGITS.expand(n, V), 2)  # [n, 2]
    counts = Counter(tuple(row) for row in drawn.tolist())
    q = _q().double().tolist()
    plackett_luce = {(a, b): q[a] * q[b] / (1 - q[a]) for a, b in permutations(range(V), 2)}
    assert chi_square(counts, plackett_luce).passed
    iid = {(a, b): q[a] * q[b] for a in range(V) for b in range(V)}
    assert not chi_square(counts, iid).passed  # negative control: two independent draws


def test_the_temperature_shapes_the_draws() -> None:
    n = 4000
    requests = [_Request(seed=s, temperature=0.5) for s in range(n)]
    first = SampledSiblings(requests).children(-1, LOGITS.expand(n, V), 1)[:, 0]
    counts = Counter((t,) for t in first.tolist())
    assert chi_square(counts, {(v,): p for v, p in enumerate(_q(0.5).double().tolist())}).passed
    assert not chi_square(counts, {(v,): p for v, p in enumerate(_q().double().tolist())}).passed


def test_each_node_records_q_without_its_earlier_siblings() -> None:
    """Ranks 0..3 of one parent, and a greedy request beside: one-hot rows at its top tokens. Once a q
    of two tokens' support has both drawn, nothing is left for a third rank: its row is zeros (never
    accepted)."""
    requests = [_Request(seed=3), _Request(seed=4, temperature=0.0)]
    siblings = SampledSiblings(requests)
    tokens = siblings.children(-1, LOGITS.expand(2, V), V)  # [2, 4]
    assert tokens[1].tolist() == [0, 1, 2, 3]  # greedy: the top tokens in order
    assert sorted(tokens[0].tolist()) == [0, 1, 2, 3]  # sampled: every token once
    probs = siblings.probs([-1] * V, list(range(V)))  # [2, 4, V]
    q = _q()
    for rank in range(V):
        rest = q.clone()
        rest[tokens[0, :rank]] = 0.0
        torch.testing.assert_close(probs[0, rank], rest / rest.sum(), rtol=1e-6, atol=1e-7)
        assert probs[1, rank].tolist() == torch.nn.functional.one_hot(tokens[1, rank], V).float().tolist()
    sparse = SampledSiblings(requests[:1])
    sparse.children(-1, torch.tensor([[2.0, 1.0, float("-inf"), float("-inf")]]), 3)
    assert float(sparse.probs([-1], [2])[0, 0].sum()) == 0.0


def test_the_noise_is_keyed_by_seed_position_and_parent() -> None:
    def draws(parent: int, **kw: int) -> list[list[int]]:
        requests = [_Request(seed=s, **kw) for s in range(64)]
        return SampledSiblings(requests).children(parent, LOGITS.expand(64, V), 2).tolist()

    assert draws(-1) == draws(-1)
    assert draws(-1) != draws(0)  # another parent
    assert draws(-1) != draws(-1, tokens=11)  # the next step


def test_no_sampler_without_probabilistic_drafting_or_a_sampled_request() -> None:
    assert sampled_siblings([_Request(seed=1)], probabilistic=False) is None
    assert sampled_siblings([_Request(seed=1, temperature=0.0)], probabilistic=True) is None
    siblings = sampled_siblings([_Request(seed=1), _Request(seed=2, temperature=0.0)], probabilistic=True)
    assert siblings is not None
    tokens = siblings.children(-1, LOGITS.expand(2, V), 2)
    out = static_tree_output(tokens, [-1, -1], [0, 1], siblings)
    assert out.draft_probs is not None and out.draft_probs.shape == (2, 2, V)
    assert out.num_draft_tokens == (2, 2)
    assert static_tree_output(tokens, [-1, -1], [0, 1], None).draft_probs is None
