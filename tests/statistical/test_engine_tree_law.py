"""Sampled generation with a branching token tree keeps the target's law (a static tree with top-token
nodes or with sampled siblings, EAGLE-2's dynamic tree, and i.i.d. paths verified by GBV).

A tiny target (vocabulary 4, 6 layers) and a random DSpark head (or a separate draft LM) drafting the
6-node tree ``[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]`` — each node one of its parent's two
best tokens (a point mass), or, with ``rejection_sample_method='probabilistic'``, its parent's draws without
replacement (``proposers/sibling_draws.py``) — verified by recursive rejection sampling and compacted to
the accepted path each step; temperature 1, and temperature 0.8 with top-p 0.9. The first 4 generated
tokens of N seeded requests are compared with the target's exact law (enumerated in float64; top-p
applied per step) by Pearson χ², noise floor p >= 1e-5. Negative controls: the same counts against
another model's law must fail, and sampled siblings verified as if drawn i.i.d. must fail.
"""

from __future__ import annotations

import os
from collections import Counter
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import engine_laws

from spec_backend import LLM, SamplingParams
from spec_backend.proposers.sibling_draws import SampledSiblings
from spec_backend.sampling.gbv_ops import TorchGbvOps
from spec_backend.testing.exact import SeqDist
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle1
from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark
from spec_backend.testing.montecarlo import chi_square
from spec_backend.tools.tiny import make_tiny_model

pytestmark = pytest.mark.statistical

VOCAB, LENGTH, N = 4, 4, 6000
PROMPT = [1, 2, 3, 0, 1]
TREE = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"


def _law(model_dir: str, temperature: float, top_p: float) -> SeqDist:
    """The target's law of its first LENGTH tokens under ``temperature`` and ``top_p`` (float64)."""
    from transformers import AutoModelForCausalLM

    if (temperature, top_p) == (1.0, 1.0):
        return engine_laws.exact_law(model_dir, PROMPT, VOCAB, LENGTH)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    law: SeqDist = {}
    for seq in product(range(VOCAB), repeat=LENGTH):
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + list(seq[:-1])])).logits[0, len(PROMPT) - 1 :]  # [L, V]
        mass = 1.0
        for row, token in zip(torch.softmax(logits / temperature, -1), seq, strict=True):
            order = torch.argsort(row, descending=True)
            keep = torch.cumsum(row[order], 0) - row[order] < top_p  # the nucleus, its first token always
            nucleus = torch.zeros_like(row).index_fill(0, order[keep], 1.0) * row
            mass *= float(nucleus[token] / nucleus.sum())
        law[seq] = mass
    return law


def _models(root: Path) -> tuple[str, str]:
    """The target and another model of the same shape (the power check's law)."""
    settings = {"vocab_size": VOCAB, "initializer_range": 0.05, "num_hidden_layers": 6}
    return make_tiny_model(root / "t", seed=0, **settings), make_tiny_model(root / "o", seed=7, **settings)


def _spec(root: Path, target: str, tree: str) -> dict[str, Any]:
    """``static``: DSpark drafting TREE (top-token nodes); ``sampled``: the same with sampled siblings
    (``rejection_sample_method='probabilistic'``); ``dynamic``: EAGLE-1 growing EAGLE-2's tree (2
    expansions per level, 3 levels, 6 nodes kept), a shape that changes with every step's draft
    probabilities; ``draft_model``: a separate draft LM drafting TREE level by level with sampled
    siblings; ``paths``: the DSpark head drawing 3 i.i.d. paths of 3 tokens, verified by GBV."""
    if tree == "dynamic":
        head = write_eagle1(root / "h", target, bias=True, seed=2)
        return {
            "method": "eagle",
            "model": head,
            "num_speculative_tokens": 3,
            "tree_top_k": 2,
            "tree_nodes": 6,
        }
    if tree == "draft_model":  # another LM of the target's vocabulary, its siblings sampled
        draft = make_tiny_model(root / "d", seed=3, vocab_size=VOCAB, initializer_range=0.05)
        return {
            "method": "draft_model",
            "model": draft,
            "num_speculative_tokens": 3,
            "speculative_token_tree": TREE,
            "rejection_sample_method": "probabilistic",
        }
    head = write_dspark(root / "h", target, markov="vanilla", rank=4, seed=2, block_size=3)
    if tree == "paths":
        return {
            "model": head,
            "num_speculative_tokens": 3,
            "tree_paths": 3,
            "rejection_sample_method": "standard",
        }
    spec = {"model": head, "num_speculative_tokens": 3, "speculative_token_tree": TREE}
    return {**spec, "rejection_sample_method": "probabilistic"} if tree == "sampled" else spec


def _counts(target: str, spec: dict[str, Any], temperature: float, top_p: float) -> Counter[tuple[int, ...]]:
    """The first LENGTH tokens of N seeded requests; the tree's nodes must be accepted often."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=256, log_stats_interval=None)
        params = [
            SamplingParams(
                temperature=temperature, top_p=top_p, seed=s, max_tokens=LENGTH + 1, ignore_eos=True
            )
            for s in range(N)
        ]
        outs = llm.generate([PROMPT] * N, params)
    finally:
        torch.set_num_threads(threads)
    total = llm.metrics.total
    assert total.num_accepted_tokens > 0.3 * total.num_drafts  # the tree's nodes are accepted
    return Counter(tuple(o.outputs[0].token_ids[:LENGTH]) for o in outs)


@pytest.mark.parametrize(
    ("tree", "temperature", "top_p"),
    [
        ("static", 1.0, 1.0),
        ("static", 0.8, 0.9),
        ("sampled", 1.0, 1.0),
        ("sampled", 0.8, 0.9),
        ("dynamic", 1.0, 1.0),
        ("draft_model", 1.0, 1.0),
        ("paths", 1.0, 1.0),
        ("paths", 0.8, 0.9),
    ],
)
def test_target_law_is_kept_with_tree_verification(
    tmp_path_factory: pytest.TempPathFactory, tree: str, temperature: float, top_p: float
) -> None:
    root = tmp_path_factory.mktemp("tree_law")
    target, other = _models(root)
    counts = _counts(target, _spec(root, target, tree), temperature, top_p)
    fit = chi_square(counts, _law(target, temperature, top_p))
    assert fit.passed, f"{tree} tree, T={temperature}, top_p={top_p}: {fit}"
    control = chi_square(counts, _law(other, temperature, top_p))
    assert not control.passed, f"the check has no power: another model's law also fits ({control})"


def test_paths_verified_without_the_skew_are_detected(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the selected path of three verified as if it had been drawn alone (GBV told
    one path: the draft's own law instead of the skewed one) changes the law."""
    root = tmp_path_factory.mktemp("paths_law_unskewed")
    target, _ = _models(root)
    verify = TorchGbvOps.gbv_verify

    def unskewed(self: TorchGbvOps, *args: Any, paths: int = 1) -> Any:
        return verify(self, *args, paths=1)

    monkeypatch.setattr(TorchGbvOps, "gbv_verify", unskewed)
    fit = chi_square(_counts(target, _spec(root, target, "paths"), 1.0, 1.0), _law(target, 1.0, 1.0))
    assert not fit.passed, f"the unskewed multi-path rule went unnoticed: {fit}"


def test_sampled_siblings_judged_as_independent_draws_are_detected(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: each sibling's distribution handed over as its parent's whole ``q`` (the naive
    rule, as if the siblings were drawn i.i.d.; they are drawn without replacement) changes the law."""
    root = tmp_path_factory.mktemp("tree_law_naive")
    target, _ = _models(root)
    recorded = SampledSiblings.probs

    def naive(self: SampledSiblings, parents: Any, ranks: Any) -> torch.Tensor:
        return recorded(self, parents, [0] * len(ranks))  # rank 0's row: the whole q

    monkeypatch.setattr(SampledSiblings, "probs", naive)
    fit = chi_square(_counts(target, _spec(root, target, "sampled"), 1.0, 1.0), _law(target, 1.0, 1.0))
    assert not fit.passed, f"the naive sibling rule went unnoticed: {fit}"
