"""Static token trees with sampled siblings in the engine (#42): with a ``rejection_sample_method`` that
reads draft probabilities, sampled requests draw each node's children from the drafter's distribution
(``proposers/sibling_draws.py``) and verify them by recursive rejection sampling with those
distributions (``rrs``). A head that drafts the target's own law then accepts every level at temperature
1, where top-token nodes accept little; greedy output is plain decoding's; a seeded request's tokens do
not depend on its batch; every static-tree drafter hands its distributions to the op. The law itself:
``tests/statistical/test_engine_tree_law.py``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, one_thread  # noqa: F401 - one_thread is autouse
from test_engine_trees import TREE, _head

from spec_backend.engine import LLM, SamplingParams
from spec_backend.testing.fixtures.dspark_checkpoints import make_bigram_target, write_exact_dspark
from spec_backend.tools.tiny import make_tiny_model


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("deep"), "llama", num_hidden_layers=6, seed=5)


def _tree(head: str, method: str, rejection: str) -> dict[str, Any]:
    return {
        "method": method,
        "model": head,
        "num_speculative_tokens": 3,
        "speculative_token_tree": TREE,
        "rejection_sample_method": rejection,
    }


def _sampled(n: int, seed: int = 0, max_tokens: int = 40) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=1.0, seed=seed + s, max_tokens=max_tokens, ignore_eos=True)
        for s in range(n)
    ]


def test_a_head_with_the_targets_law_accepts_every_level(tmp_path: Path) -> None:
    """The exact DSpark head on a bigram target at temperature 1: each node's first draw is accepted
    with probability min(1, p/q) = 1, so a step emits the tree's depth + 1 (3.9 tokens measured, the rest
    is the ends of requests); its top-token nodes accept only when the sample happens to be one of them
    (negative control: 1.1 measured)."""
    bigram = make_bigram_target(tmp_path / "bigram")
    head = write_exact_dspark(tmp_path / "exact", bigram, block_size=6)
    lengths = {}
    for rejection in ("strict", "probabilistic"):
        llm = LLM(bigram, dtype="float64", speculative_config=_tree(head, "dspark", rejection))
        llm.generate([[1, 2, 3, 4], [5, 6, 7], [9, 9, 9, 9, 9]], _sampled(3))
        lengths[rejection] = llm.metrics.total.mean_acceptance_length
    assert lengths["probabilistic"] > 3.5 and lengths["strict"] < 2.0, lengths


def test_greedy_output_is_plain_decodings(target: str, tmp_path: Path) -> None:
    plain = [o.outputs[0].token_ids for o in LLM(target, dtype="float64").generate(PROMPTS, GREEDY)]
    llm = LLM(
        target,
        dtype="float64",
        speculative_config=_tree(_head("dspark", target, tmp_path), "dspark", "probabilistic"),
    )
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain


def test_a_seeded_requests_tokens_do_not_depend_on_its_batch(target: str, tmp_path: Path) -> None:
    """Draws are keyed by the request's seed, the step's position and the parent node, verification by
    the seed and position: alone or beside three others, the same tokens."""
    spec = _tree(_head("dspark", target, tmp_path), "dspark", "probabilistic")
    llm = LLM(target, dtype="float64", speculative_config=spec)
    params = _sampled(len(PROMPTS), seed=7, max_tokens=24)
    together = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    alone = [llm.generate([p], [sp])[0].outputs[0].token_ids for p, sp in zip(PROMPTS, params, strict=True)]
    assert together == alone
    assert llm.metrics.total.num_accepted_tokens > 0


@pytest.mark.parametrize("method", ["dspark", "dflash", "eagle", "eagle3", "medusa"])
def test_every_static_tree_drafter_hands_its_distributions_to_the_op(
    target: str, tmp_path: Path, method: str
) -> None:
    """Sampled requests reach ``SamplerOps.tree_verify`` with each node's distribution (rows that sum to
    1, or 0 once a parent's support is drawn out); greedy-only steps without them. Negative control: with
    ``strict``, never."""
    for rejection, sampled in (("probabilistic", True), ("strict", False)):
        llm = LLM(
            target,
            dtype="float64",
            speculative_config=_tree(_head(method, target, tmp_path), method, rejection),
        )
        ops: Any = llm.engine.verifier.sampler.ops
        seen: list[Any] = []
        verify = ops.tree_verify

        def spy(*args: Any, verify: Any = verify, seen: list[Any] = seen) -> Any:
            seen.append(args[7] if len(args) > 7 else None)
            return verify(*args)

        ops.tree_verify = spy
        llm.generate(PROMPTS[:2], _sampled(2, max_tokens=12))
        with_probs = [q for q in seen if q is not None]
        assert bool(with_probs) == sampled, (method, rejection)
        for q in with_probs:
            sums = q.sum(dim=-1)  # [B, M]
            assert bool(((sums - 1.0).abs() < 1e-4).logical_or(sums == 0).all())
