"""Sampled DFlash2 drafts keep the target's law.

DFlash2's candidate selector draws each draft among its position's ``selector_top_k`` candidates from
the softmax of the candidates' scores, and that distribution ``q`` (zero outside the candidates) goes to
the sampler. A tiny target (vocabulary 4, 6 layers) and a random DFlash2 head with ``selector_top_k`` 2,
so two of the four ids can only come from the sampler's residual ``max(p - q, 0)`` at each position;
``rejection_sample_method`` ``probabilistic`` and ``block``, K=3, temperature 1. The first 4 generated
tokens of N requests are compared with the target's exact law (enumerated in float64) by Pearson χ²,
noise floor p >= 1e-5 (``testing.montecarlo``). Negative control: the same counts against another
model's law must fail, so the check has power at this N.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import engine_laws

from spec_backend import LLM, SamplingParams
from spec_backend.testing.fixtures.draft_checkpoints import write_dflash2
from spec_backend.testing.montecarlo import chi_square
from spec_backend.tools.tiny import make_tiny_model

pytestmark = pytest.mark.statistical

VOCAB, LENGTH, N = 4, 4, 6000
PROMPT = [1, 2, 3, 0, 1]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    root = tmp_path_factory.mktemp("dflash2_law")
    settings = {"vocab_size": VOCAB, "initializer_range": 0.05, "num_hidden_layers": 6}
    target = make_tiny_model(root / "t", seed=0, **settings)
    other = make_tiny_model(root / "o", seed=7, **settings)
    head = write_dflash2(Path(root / "d2"), target, seed=2, window=3, top_k=2)
    return target, other, head


@pytest.mark.parametrize("method", ["probabilistic", "block"])
def test_target_law_is_kept_with_selector_drafts(models: tuple[str, str, str], method: str) -> None:
    target, other, head = models
    spec = {
        "adaptive_draft_length": False,
        "method": "dflash",
        "model": head,
        "num_speculative_tokens": 3,
        "rejection_sample_method": method,
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=256, log_stats_interval=None)
        params = [
            SamplingParams(temperature=1.0, seed=s, max_tokens=LENGTH + 1, ignore_eos=True) for s in range(N)
        ]
        outs = llm.generate([PROMPT] * N, params)
    finally:
        torch.set_num_threads(threads)
    assert llm.metrics.total.num_accepted_tokens > 0.2 * llm.metrics.total.num_draft_tokens  # drafts matter
    counts = Counter(tuple(o.outputs[0].token_ids[:LENGTH]) for o in outs)
    fit = chi_square(counts, engine_laws.exact_law(target, PROMPT, VOCAB, LENGTH))
    assert fit.passed, f"{method}: {fit}"
    control = chi_square(counts, engine_laws.exact_law(other, PROMPT, VOCAB, LENGTH))
    assert not control.passed, f"the check has no power: another model's law also fits ({control})"
