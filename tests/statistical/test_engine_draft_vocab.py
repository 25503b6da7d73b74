"""Probabilistic drafting with EAGLE-3's reduced draft vocabulary keeps the target's law.

A tiny target (vocabulary 4) and an EAGLE-3 head in the speculators format whose draft vocabulary
covers 3 of the 4 target ids (``d2t``): the head's distribution ``q`` is 0 on the missing id, so that
id can only come from the sampler's residual ``max(p - q, 0)``. With ``rejection_sample_method``
``probabilistic`` (standard rule, draft probabilities passed) and ``block``, K=3, temperature 1, the
first 4 generated tokens of N requests are compared with the target's exact law (enumerated in float64)
by Pearson χ², noise floor p >= 1e-5 (``testing.montecarlo``). Negative control: the same counts
against another model's law must fail, so the check has power at this N. A sanity check confirms the
missing id is generated (it must be, since the target gives it mass).
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
from spec_backend.testing.exact import SeqDist
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3
from spec_backend.testing.montecarlo import chi_square
from spec_backend.tools.tiny import make_tiny_model

pytestmark = pytest.mark.statistical

VOCAB, LENGTH, N = 4, 4, 6000
PROMPT = [1, 2, 3, 0, 1]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    root = tmp_path_factory.mktemp("draft_vocab")
    target = make_tiny_model(root / "t", vocab_size=VOCAB, seed=0, initializer_range=0.05)
    other = make_tiny_model(root / "o", vocab_size=VOCAB, seed=7, initializer_range=0.05)
    head = write_eagle3(Path(root / "e3"), target, "speculators", draft_vocab=3, aux_ids=[0, 1, 2], seed=3)
    return target, other, head


def exact_law(model_dir: str) -> SeqDist:
    return engine_laws.exact_law(model_dir, PROMPT, VOCAB, LENGTH)


def run(target: str, head: str, method: str) -> Counter[tuple[int, ...]]:
    spec = {"method": "eagle3", "model": head, "num_speculative_tokens": 3, "rejection_sample_method": method}
    llm = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=256, log_stats_interval=None)
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=LENGTH + 1, ignore_eos=True) for s in range(N)
    ]
    outs = llm.generate([PROMPT] * N, params)
    return Counter(tuple(o.outputs[0].token_ids[:LENGTH]) for o in outs)


@pytest.mark.parametrize("method", ["probabilistic", "block"])
def test_target_law_is_kept_with_a_reduced_draft_vocabulary(
    models: tuple[str, str, str], method: str
) -> None:
    target, other, head = models
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        counts = run(target, head, method)
    finally:
        torch.set_num_threads(threads)
    from safetensors.torch import load_file

    covered = set(load_file(os.path.join(head, "model.safetensors"))["t2d"].nonzero().flatten().tolist())
    missing = set(range(VOCAB)) - covered
    assert len(missing) == 1  # never drafted (tests/unit/test_drafter_eagle3.py checks that)
    assert any(t in missing for seq in counts for t in seq)  # generated through the residual only
    fit = chi_square(counts, exact_law(target))
    assert fit.passed, f"{method}: {fit}"
    control = chi_square(counts, exact_law(other))
    assert not control.passed, f"the check has no power: another model's law also fits ({control})"
