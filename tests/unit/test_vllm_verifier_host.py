"""The plugin's verification inside vLLM runs eagerly every step (vLLM captures the forward, not its
sampler), so its host work is part of every step. Measured on an H100 (docs/benchmarks.md, issue 43) it
made a vLLM step 1-2 ms slower at small batches; part of that was one device read per call (the sampling
flags) and two host-to-device copies (the request and slot index of the batch layout), each of which
waits for the GPU. These tests hold the adapter to none of either after a batch composition's first
call, and show that reusing layouts changes no output.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from spec_backend.integrations.vllm_sampler import Verifier
from spec_backend.sampling import RejectionSampler
from spec_backend.testing.host_reads import CallCounter, HostReads

V = 32
#: tensors built from host values (each a host-to-device copy on an accelerator)
HOST_BUILT = {torch.tensor, torch.as_tensor, torch.from_numpy}


def vllm_args(nums: list[int], mode: str, seed: int = 0) -> tuple[Any, ...]:
    """``rejection_sample``'s arguments as vLLM passes them: ``mode`` greedy, random or mixed (request 0
    greedy, the others sampled; request 1 seeded)."""
    gen = torch.Generator().manual_seed(seed)
    total, batch = sum(nums), len(nums)
    target = torch.randn(total, V, generator=gen) * 3  # [T, V]
    drafts = torch.multinomial(torch.softmax(target, -1), 1, generator=gen).squeeze(1).to(torch.int32)
    temp = torch.ones(batch)
    if mode != "random":
        temp[0 if mode == "mixed" else slice(None)] = 0.0
    meta = SimpleNamespace(
        all_greedy=mode == "greedy",
        all_random=mode == "random",
        temperature=None if mode == "greedy" else temp,
        generators={1: torch.Generator().manual_seed(7)} if mode == "mixed" and batch > 1 else {},
    )
    cu = torch.cumsum(torch.tensor(nums), 0).to(torch.int32)
    bonus = torch.randint(0, V, (batch, 1), generator=gen)
    return drafts, nums, max(nums), cu, None, target, bonus, meta


@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
def test_a_call_reads_nothing_back_and_copies_nothing_after_the_first(mode: str) -> None:
    verifier = Verifier(RejectionSampler())
    verifier(*vllm_args([2, 3, 1], mode))  # the first call of this composition builds its layout
    args = vllm_args([2, 3, 1], mode, seed=1)
    with HostReads() as reads, CallCounter(HOST_BUILT) as built:
        verifier(*args)
    assert (reads.count, built.count) == (0, 0)


def test_the_counters_see_a_fresh_layout() -> None:
    """Negative control: a composition not seen before builds its request and slot index on the host."""
    verifier, args = Verifier(RejectionSampler()), vllm_args([2, 3, 1], "greedy")
    with CallCounter(HOST_BUILT) as built:
        verifier(*args)
    assert built.count > 0


@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
def test_reused_layouts_give_the_outputs_of_fresh_ones(mode: str) -> None:
    """Compositions interleaved (and evicted: a cache of one) against a new verifier per call, with the
    same seeds: the same tokens. Greedy requests equal the target's argmax chain."""
    compositions = [[2, 3, 1], [4], [2, 3, 1], [0, 2], [4], [2, 3, 1]]
    reused = Verifier(RejectionSampler())
    reused.LAYOUTS_KEPT = 1
    for i, nums in enumerate(compositions):
        torch.manual_seed(100 + i)  # unseeded requests draw from the global generator
        got = reused(*vllm_args(nums, mode, seed=i))
        torch.manual_seed(100 + i)
        want = Verifier(RejectionSampler())(*vllm_args(nums, mode, seed=i))
        assert torch.equal(got, want), (nums, got, want)
    assert len(reused._layouts) == 1


def test_greedy_output_is_the_argmax_chain() -> None:
    drafts, nums, k, cu, _, target, bonus, meta = vllm_args([3, 2], "greedy")
    drafts = target.argmax(-1).to(torch.int32)  # every draft is the target's choice
    drafts[3] = (drafts[3] + 1) % V  # request 1 rejects its first draft
    verifier = Verifier(RejectionSampler())
    for _ in range(2):  # fresh layout, then reused
        out = verifier(drafts, nums, k, cu, None, target, bonus, meta)
        assert out.tolist() == [
            [*target[:3].argmax(-1).tolist(), int(bonus[0])],
            [int(target[3].argmax()), -1, -1, -1],
        ]


def test_expand_to_tokens_equals_repeat_interleave() -> None:
    """The searchsorted spread against the obvious one, over random compositions with empty requests."""
    from spec_backend.integrations.vllm_sampler import expand_to_tokens

    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        batch = int(torch.randint(1, 9, (1,), generator=gen))
        nums = torch.randint(0, 5, (batch,), generator=gen)  # [B]
        cu = torch.cumsum(nums, 0).to(torch.int32)  # [B]
        temp = torch.randint(0, 3, (batch,), generator=gen).float() / 2  # [B], some 0 (greedy)
        want = torch.repeat_interleave(torch.where(temp == 0, torch.ones_like(temp), temp), nums)
        assert torch.equal(expand_to_tokens(temp, cu, int(nums.sum()), 0, 1), want)
