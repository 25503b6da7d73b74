"""Per-slot sampling parameters (``engine/sampling_state.py``): the host flags equal what the validating
constructor derives on the device, and the parameters follow each request when slots move."""

from __future__ import annotations

import random

import pytest
import torch
from engine_fixtures import one_thread  # noqa: F401 - autouse

from spec_backend.engine import LLM, SamplingParams
from spec_backend.sampling import SamplingMetadata
from spec_backend.sampling.sampling_metadata import SamplingFlags
from spec_backend.tools.tiny import make_tiny_model

FLAGS = ("all_greedy", "all_random", "apply_top_k", "apply_top_p", "has_seeds", "max_top_k")


@pytest.mark.parametrize("trial", range(40))
def test_host_flags_equal_the_validated_ones(trial: int) -> None:
    rnd = random.Random(trial)
    batch = rnd.randint(1, 6)
    temperature = [rnd.choice([0.0, 0.0, 0.7, 1.3]) for _ in range(batch)]
    top_k = [rnd.choice([0, 0, 1, 5, 50]) for _ in range(batch)]
    top_p = [rnd.choice([1.0, 1.0, 0.9, 0.5]) for _ in range(batch)]
    seeds = [rnd.choice([-1, 0, 7, 2**62]) for _ in range(batch)]
    checked = SamplingMetadata.from_lists(
        temperature, top_k, top_p, [None if s < 0 else s for s in seeds], [0] * batch
    )
    flags = SamplingFlags.of(temperature, top_k, top_p, seeds)
    assert {f: getattr(flags, f) for f in FLAGS} == {f: getattr(checked, f) for f in FLAGS}
    trusted = SamplingMetadata.prevalidated(
        checked.temperature, checked.top_k, checked.top_p, torch.tensor(seeds), torch.zeros(batch), flags
    )
    assert {f: getattr(trusted, f) for f in FLAGS} == {f: getattr(flags, f) for f in FLAGS}


def test_parameters_follow_their_requests_when_slots_move(tmp_path: object) -> None:
    """Requests of different lengths leave at different steps (the last slot moves into each freed one);
    every request's seeded samples equal its samples alone, so its parameters moved with it."""
    model = make_tiny_model(str(tmp_path), "llama", seed=2)
    llm = LLM(model, dtype="float64", speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    prompts = [[5, 6, 7, 5, 6, 7], [9, 8, 9, 8], [3, 1, 3, 1, 3], [40, 41, 42, 40], [11, 12, 11]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=4),
        SamplingParams(temperature=0.9, top_k=8, seed=11, max_tokens=14),
        SamplingParams(temperature=1.2, top_p=0.8, seed=12, max_tokens=7),
        SamplingParams(temperature=0.0, max_tokens=18),
        SamplingParams(temperature=0.6, seed=13, max_tokens=10),
    ]
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], q)[0].outputs[0].token_ids for p, q in zip(prompts, params, strict=True)]
    assert batched == alone
    assert [len(t) for t in batched] == [4, 14, 7, 18, 10]
