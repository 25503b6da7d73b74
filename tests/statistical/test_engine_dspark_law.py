"""Sampled DSpark drafts, verified as far as the confidences decide, keep the target's law.

Each DSpark draft is drawn from the Markov-corrected distribution given the drafts before it, and that
distribution goes to the sampler; how many drafts a request verifies is chosen from confidences that
depend only on the drafts before each one. A tiny target (vocabulary 4, 6 layers) and a random DSpark
head (vanilla and rnn Markov heads, anchor-predicts layout, K=3), temperature 1:

* ``threshold``: seeded requests, each verifying up to its first draft with confidence below 0.75;
* ``throughput``: unseeded requests and a step cost that makes the first 600 tokens of a step free and
  every further one expensive, so the ranking across requests gives ragged lengths (0 included).

The first 4 generated tokens of N requests are compared with the target's exact law (enumerated in
float64) by Pearson χ², noise floor p >= 1e-5 (``testing.montecarlo``). Negative control: the same
counts against another model's law must fail, so the check has power at this N.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import engine_laws
from safetensors.torch import load_file, save_file

from spec_backend import LLM, SamplingParams
from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark
from spec_backend.testing.montecarlo import chi_square
from spec_backend.tools.tiny import make_tiny_model

pytestmark = pytest.mark.statistical

VOCAB, LENGTH, N = 4, 4, 6000
PROMPT = [1, 2, 3, 0, 1]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Path]:
    root = tmp_path_factory.mktemp("dspark_law")
    settings = {"vocab_size": VOCAB, "initializer_range": 0.05, "num_hidden_layers": 6}
    return (
        make_tiny_model(root / "t", seed=0, **settings),
        make_tiny_model(root / "o", seed=7, **settings),
        root,
    )


def _lean_on_the_previous_token(head: str) -> None:
    """Make the confidence depend strongly on the previous token (its Markov embedding), so a rule that
    peeked at a draft's own token through the next confidence would bias the law visibly."""
    path = os.path.join(head, "model.safetensors")
    tensors = load_file(path)
    weight = tensors["confidence_head.proj.weight"]  # [1, H + r]
    weight[:, -4:] *= 6.0
    save_file(tensors, path)


class FreeThenSteep:
    """A step cost: 1 s up to 600 verified tokens, then 1 s more per token; never re-measured."""

    ready = True

    def seconds(self, tokens: int) -> float:
        return 1.0 + max(0, tokens - 600)

    def observe(self, tokens: int, seconds: float) -> None:
        del tokens, seconds


@pytest.mark.parametrize(
    ("markov", "mode", "method"),
    [
        ("vanilla", "threshold", "probabilistic"),
        ("rnn", "throughput", "block"),
        ("vanilla", "throughput", "probabilistic"),
    ],
)
def test_target_law_is_kept_with_confidence_chosen_lengths(
    models: tuple[str, str, Path], markov: str, mode: str, method: str
) -> None:
    target, other, root = models
    head = write_dspark(
        root / f"{markov}-{mode}-{method}", target, markov=markov, rank=4, seed=2, block_size=3
    )
    _lean_on_the_previous_token(head)
    spec = {"model": head, "num_speculative_tokens": 3, "rejection_sample_method": method}
    spec |= (
        {"confidence_threshold": 0.75} if mode == "threshold" else {"confidence_verification": "throughput"}
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=256, log_stats_interval=None)
        assert llm.engine.confidence is not None
        if mode == "throughput":
            llm.engine.confidence.cost = FreeThenSteep()  # type: ignore[assignment]
        seeds = range(N) if mode == "threshold" else [None] * N
        params = [
            SamplingParams(temperature=1.0, seed=s, max_tokens=LENGTH + 1, ignore_eos=True) for s in seeds
        ]
        outs = llm.generate([PROMPT] * N, params)
    finally:
        torch.set_num_threads(threads)
    total = llm.metrics.total
    assert total.num_accepted_tokens > 0.2 * total.num_draft_tokens  # drafts matter
    assert sum(c > 0 for c in total.verify_lengths) >= 3, f"lengths hardly varied: {total.verify_lengths}"
    counts = Counter(tuple(o.outputs[0].token_ids[:LENGTH]) for o in outs)
    fit = chi_square(counts, engine_laws.exact_law(target, PROMPT, VOCAB, LENGTH))
    assert fit.passed, f"{markov}/{mode}/{method}: {fit}"
    control = chi_square(counts, engine_laws.exact_law(other, PROMPT, VOCAB, LENGTH))
    assert not control.passed, f"the check has no power: another model's law also fits ({control})"
