"""Probabilistic drafting through the engine: the target's law is kept, and block verification gains.

A tiny target and a different tiny draft model (vocabulary 4, so both distributions are far from point
masses) run ``draft_model`` with K=3 and ``rejection_sample_method`` ``"probabilistic"`` (standard rule,
draft probabilities passed) or ``"block"`` (lossless block verification, Sun et al. 2024), temperature 1.

* Law: the first 4 generated tokens of N requests (distinct seeds) against the exact law of the target
  (enumerated with transformers in float64), Pearson χ², noise floor p >= 1e-5 (``testing.montecarlo``).
  Negative control: the same counts against the *draft's* law must fail — the check has power at this N.
* Gain: paired by seed, block's emitted-per-step exceeds standard's: the mean paired difference of
  verification steps per request (each request emits 5 tokens; fewer steps = more tokens accepted) is
  positive with z > 3 (one-sided, chance 1.3e-3 under no gain; observed z ≈ 6). Control: with point-mass
  drafts (``"strict"`` drafts the argmax, no probabilities) block and standard coincide, as the theory says.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import engine_laws

from spec_backend import LLM, SamplingParams
from spec_backend.testing.exact import SeqDist
from spec_backend.testing.montecarlo import chi_square
from spec_backend.tools.tiny import make_tiny_model

pytestmark = pytest.mark.statistical

VOCAB, LENGTH, N = 4, 4, 6000
PROMPT = [1, 2, 3, 0, 1]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("draft_probs")
    target = make_tiny_model(root / "t", vocab_size=VOCAB, seed=0, initializer_range=0.05)
    draft = make_tiny_model(root / "d", vocab_size=VOCAB, seed=7, initializer_range=0.05)
    return target, draft


def exact_law(model_dir: str) -> SeqDist:
    return engine_laws.exact_law(model_dir, PROMPT, VOCAB, LENGTH)


def run(target: str, draft: str, method: str) -> tuple[Counter[tuple[int, ...]], list[int]]:
    spec = {
        "method": "draft_model",
        "model": draft,
        "num_speculative_tokens": 3,
        "rejection_sample_method": method,
    }
    llm = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=256, log_stats_interval=None)
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=LENGTH + 1, ignore_eos=True) for s in range(N)
    ]
    outs = llm.generate([PROMPT] * N, params)
    counts = Counter(tuple(o.outputs[0].token_ids[:LENGTH]) for o in outs)
    return counts, [o.num_steps for o in outs]


@pytest.fixture(scope="module")
def results(models: tuple[str, str]) -> dict[str, tuple[Counter[tuple[int, ...]], list[int]]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {m: run(*models, m) for m in ("probabilistic", "block", "strict")}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("method", ["probabilistic", "block", "strict"])
def test_target_law_is_kept(models: tuple[str, str], results: dict, method: str) -> None:
    target, draft = models
    fit = chi_square(results[method][0], exact_law(target))
    assert fit.passed, f"{method}: {fit}"
    control = chi_square(results[method][0], exact_law(draft))
    assert not control.passed, f"the check has no power: the draft's law also fits ({control})"


def _paired_gain(standard: list[int], block: list[int]) -> tuple[float, float]:
    diffs = [s - b for s, b in zip(standard, block, strict=True)]  # fewer steps with block = gain
    return statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5


def test_block_verification_gains_with_probabilistic_drafts(results: dict) -> None:
    mean, se = _paired_gain(results["probabilistic"][1], results["block"][1])
    assert mean > 3 * se, f"block saves {mean:.4f} steps per request, standard error {se:.4f}"


def test_point_mass_drafts_give_block_no_gain(models: tuple[str, str]) -> None:
    """With argmax drafts and no probabilities, the block rule equals the standard one (same steps)."""
    target, draft = models
    steps = {}
    for mode in ({}, {"enable_block_verify": True}):
        spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}
        llm = LLM(
            target,
            dtype="float64",
            speculative_config=spec,
            additional_config={"rejection_sampler_config": mode} if mode else None,
            max_num_seqs=256,
            log_stats_interval=None,
        )
        params = [
            SamplingParams(temperature=1.0, seed=s, max_tokens=LENGTH + 1, ignore_eos=True)
            for s in range(500)
        ]
        steps[bool(mode)] = sum(o.num_steps for o in llm.generate([PROMPT] * 500, params))
    assert abs(steps[True] - steps[False]) <= 0.05 * steps[False]
