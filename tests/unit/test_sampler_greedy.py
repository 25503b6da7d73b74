"""Greedy verification is bit-exact with argmax decoding, in every mode, with any K in 0..128."""

from __future__ import annotations

import random

import pytest
import torch

from spec_backend.config.rejection import RejectionSamplerConfig
from spec_backend.sampling import PLACEHOLDER_TOKEN_ID, RejectionSampler, SamplingMetadata, SpecDecodeMetadata

V = 11
CONFIGS = {
    "standard": RejectionSamplerConfig(),
    "block-lossless": RejectionSamplerConfig(enable_block_verify=True),
    "block-cumulative": RejectionSamplerConfig(enable_block_verify=True, block_verify_mode="cumulative"),
    "entropy": RejectionSamplerConfig(enable_entropy_verify=True),
    "block-lossless+entropy": RejectionSamplerConfig(enable_block_verify=True, enable_entropy_verify=True),
}


def make_batch(ks: list[int], seed: int = 0) -> tuple[SpecDecodeMetadata, torch.Tensor, list[list[int]]]:
    """Random logits; each request's drafts follow the argmax for a random prefix, then diverge."""
    gen = torch.Generator().manual_seed(seed)
    pyrng = random.Random(seed)
    rows = sum(k + 1 for k in ks)
    logits = torch.randn(rows, V, generator=gen)
    logits[:, 3] = logits[:, 5]  # exact ties: argmax must take the first index
    drafts: list[list[int]] = []
    row = 0
    for k in ks:
        agree = pyrng.randint(0, k)
        d = []
        for j in range(k):
            best = int(torch.argmax(logits[row + j]))
            d.append(best if j < agree else pyrng.choice([t for t in range(V) if t != best]))
        drafts.append(d)
        row += k + 1
    return SpecDecodeMetadata.from_draft_tokens(drafts), logits, drafts


def expected_greedy(logits: torch.Tensor, drafts: list[list[int]]) -> list[list[int]]:
    out, row = [], 0
    for d in drafts:
        tokens = []
        for j, x in enumerate(d):
            best = int(torch.argmax(logits[row + j]))
            tokens.append(best)
            if x != best:
                break
        else:
            tokens.append(int(torch.argmax(logits[row + len(d)])))
        out.append(tokens)
        row += len(d) + 1
    return out


def rows_of(out: torch.Tensor) -> list[list[int]]:
    return [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in out.tolist()]


@pytest.mark.parametrize("mode", sorted(CONFIGS))
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_greedy_bit_exact_mixed_k(mode: str, with_draft_probs: bool) -> None:
    ks = [0, 1, 2, 3, 4, 5, 6, 7, 8, 128, 3, 0]
    md, logits, drafts = make_batch(ks)
    draft_probs = torch.softmax(torch.randn(md.num_tokens, V), dim=-1) if with_draft_probs else None
    out = RejectionSampler(CONFIGS[mode])(md, draft_probs, logits, SamplingMetadata.greedy(len(ks)))
    assert out.dtype == torch.int32 and out.shape == (len(ks), 129)
    assert rows_of(out) == expected_greedy(logits, drafts)
    # placeholders fill everything after the emitted tokens
    for row, want in zip(out.tolist(), expected_greedy(logits, drafts), strict=True):
        assert row[len(want) :] == [PLACEHOLDER_TOKEN_ID] * (129 - len(want))


def test_all_drafts_accepted_gives_bonus_argmax() -> None:
    logits = torch.randn(4, V)
    drafts = [[int(torch.argmax(logits[j])) for j in range(3)]]
    out = RejectionSampler()(
        SpecDecodeMetadata.from_draft_tokens(drafts), None, logits, SamplingMetadata.greedy(1)
    )
    assert out.tolist() == [drafts[0] + [int(torch.argmax(logits[3]))]]


def test_greedy_rows_unaffected_by_random_rows_in_the_batch() -> None:
    ks = [3, 0, 5, 2, 8]
    md, logits, drafts = make_batch(ks, seed=1)
    temps = [0.0, 0.7, 0.0, 1.3, 0.0]
    sampling = SamplingMetadata.from_lists(temps, top_k=[0, 3, 0, 0, 0], top_p=[1.0, 1.0, 1.0, 0.8, 1.0])
    out = RejectionSampler()(md, None, logits, sampling)
    want = expected_greedy(logits, drafts)
    got = rows_of(out)
    for b, t in enumerate(temps):
        if t == 0:
            assert got[b] == want[b]


def test_greedy_uses_raw_logits_in_half_precision() -> None:
    md, logits, drafts = make_batch([4, 2], seed=3)
    half = logits.to(torch.bfloat16)
    out = RejectionSampler()(md, None, half, SamplingMetadata.greedy(2))
    assert rows_of(out) == expected_greedy(half.float(), drafts)
