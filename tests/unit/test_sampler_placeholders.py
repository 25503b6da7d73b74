"""Placeholder drafts (-1) are never tokens: they end a request's drafts at their position, losslessly.

The exact expectation: a batch whose request b has a placeholder at slot j_b gives the same output, token
for token, as the batch truncated to ``drafts[:j_b]`` whose bonus row is the placeholder's target row
(same seeds and positions, so the same random numbers). The truncated batch is an ordinary batch, whose
every mode the conformance suite proves; equality makes the placeholder case inherit that proof. It
holds in every mode, for the torch and the triton ops, with and without ``draft_probs`` and debug checks.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from triton_backend import MODES, TritonReferenceBackend, make_sampler

from spec_backend.backends.base import SamplerTuning
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.integrations.vllm_sampler import Verifier
from spec_backend.sampling import (
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    SamplerInputError,
    SamplingMetadata,
    SpecDecodeMetadata,
)

V = 48
P = PLACEHOLDER_TOKEN_ID
TUNING = SamplerTuning(vocab_block=16, max_grid=None, device_uniforms=True)
#: per request: drafts with placeholders; the greedy ones (temperature 0) are listed in GREEDY
DRAFTS = [[5, P, 7], [P], [3, 9, 11, P], [2, 4], [], [8, P, P, 1], [6, 6, P, 2, 2]]
GREEDY = {1, 3}


def _batch(drafts: list[list[int]], seed: int) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Logits [T+B, V] and draft probs [T, V] in vLLM's layout; drafts replaced near the target's argmax
    for about half of the positions so that acceptances happen."""
    gen = torch.Generator().manual_seed(seed)
    rows = sum(len(d) + 1 for d in drafts)
    logits = torch.randn(rows, V, generator=gen) * 2.5  # [T+B, V]
    dprobs = torch.softmax(torch.randn(sum(map(len, drafts)), V, generator=gen) * 2, dim=-1)  # [T, V]
    out, row = [], 0
    for d in drafts:
        new = []
        for j, t in enumerate(d):
            coin = bool(torch.rand(1, generator=gen) < 0.6)
            new.append(t if t == P or not coin else int(logits[row + j].argmax()))
        out.append(new)
        row += len(d) + 1
    dprobs = 0.5 * dprobs + 0.5 * torch.softmax(logits[_target_rows(out)], dim=-1)
    return logits, dprobs, out


def _target_rows(drafts: list[list[int]]) -> list[int]:
    rows, row = [], 0
    for d in drafts:
        rows += range(row, row + len(d))
        row += len(d) + 1
    return rows


def _truncated(
    drafts: list[list[int]], logits: torch.Tensor, dprobs: torch.Tensor
) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """Drafts cut at their first placeholder, the placeholder's target row as the bonus row."""
    cut, rows, drows, row, t0 = [], [], [], 0, 0
    for d in drafts:
        j = d.index(P) if P in d else len(d)
        cut.append(d[:j])
        rows += range(row, row + j + 1)  # targets 0..j-1, then row j (the placeholder's or the bonus row)
        drows += range(t0, t0 + j)
        row, t0 = row + len(d) + 1, t0 + len(d)
    return cut, logits[rows], dprobs[drows]


def _sampling(drafts: list[list[int]]) -> SamplingMetadata:
    n = len(drafts)
    return SamplingMetadata.from_lists(
        [0.0 if b in GREEDY else 0.9 for b in range(n)],
        seeds=[1000 + 17 * b for b in range(n)],
        positions=[40 + 3 * b for b in range(n)],
    )


def _pad(out: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(out, (0, width - out.shape[1]), value=P)


@pytest.mark.parametrize(
    ("mode", "ops", "with_q", "debug"),
    list(itertools.product(sorted(MODES), ["torch", "triton"], [0, 1], [0, 1])),
)
def test_placeholder_equals_truncated_drafts(mode: str, ops: str, with_q: int, debug: int) -> None:
    backend = ReferenceBackend() if ops == "torch" else TritonReferenceBackend(TUNING)
    sampler = make_sampler(mode, backend, debug=bool(debug))
    for seed in range(3 if ops == "torch" else 1):
        logits, dprobs, drafts = _batch(DRAFTS, seed)
        cut, cut_logits, cut_dprobs = _truncated(drafts, logits, dprobs)
        sampling = _sampling(drafts)
        got = sampler(
            SpecDecodeMetadata.from_draft_tokens(drafts), dprobs if with_q else None, logits, sampling
        )
        want = sampler(
            SpecDecodeMetadata.from_draft_tokens(cut), cut_dprobs if with_q else None, cut_logits, sampling
        )
        assert torch.equal(got, _pad(want, got.shape[1])), (mode, seed)
        for b, row in enumerate(got.tolist()):
            emitted = [t for t in row if t != P]
            assert emitted and all(0 <= t < V for t in emitted)
            j = drafts[b].index(P) if P in drafts[b] else len(drafts[b])
            assert len(emitted) <= j + 1  # nothing at or after the placeholder is accepted


@pytest.mark.parametrize("with_q", [0, 1])
def test_placeholder_position_samples_the_target_distribution(with_q: int) -> None:
    """Negative control for the null draft: when every earlier draft is accepted, the placeholder's
    position emits the target's token even where the target puts all its mass on the placeholder's
    index (V - 1, what ``p[row, -1]`` read before the fix) or on one token."""
    logits = torch.full((3, V), -30.0)
    logits[0, 4] = 30.0  # the first draft (4) is accepted with probability ~1
    logits[1, V - 1] = 30.0  # the placeholder's row: the target emits V - 1
    md = SpecDecodeMetadata.from_draft_tokens([[4, P]])
    dprobs = torch.full((2, V), 1.0 / V) if with_q else None
    for seed in range(20):
        sampling = SamplingMetadata.from_lists([1.0], seeds=[seed], positions=[seed])
        out = RejectionSampler()(md, dprobs, logits, sampling)
        assert out.tolist() == [[4, V - 1, P]]


def test_out_of_vocabulary_ids_are_errors_in_debug_and_never_indexes_otherwise() -> None:
    logits, _, _ = _batch([[1, 2]], 0)
    sampling = SamplingMetadata.from_lists([1.0], seeds=[3], positions=[0])
    for bad in (V, V + 1000, -7):
        ids = torch.tensor([1, bad], dtype=torch.int32)
        md = SpecDecodeMetadata.from_layout(ids, [2], None)
        with pytest.raises(SamplerInputError, match=rf"draft_token_ids contains id {bad}, outside"):
            RejectionSampler(debug=True)(md, None, logits, sampling)
        out = RejectionSampler()(md, None, logits, sampling)  # a null draft: the truncated result
        want = RejectionSampler()(SpecDecodeMetadata.from_draft_tokens([[1, P]]), None, logits, sampling)
        assert torch.equal(out, want)


def test_ids_that_do_not_fit_int32_are_named_errors_before_the_cast() -> None:
    for bad in (2**32 + 5, 2**31, -(2**31) - 3):
        with pytest.raises(SamplerInputError, match=rf"contains {bad}, outside \[0, 2\*\*31 - 1\]"):
            SpecDecodeMetadata.from_layout(torch.tensor([1, bad]), [2], None)
        with pytest.raises(SamplerInputError, match=rf"got {bad} in"):
            SpecDecodeMetadata.from_draft_tokens([[1, bad]])
    with pytest.raises(SamplerInputError, match=r"integer dtype, got torch.float32"):
        SpecDecodeMetadata.from_layout(torch.tensor([1.0]), [1], None)


@pytest.mark.parametrize("greedy", [0, 1])
def test_vllm_hook_passes_placeholders_through_losslessly(greedy: int) -> None:
    """The vLLM hook's adapter (no vLLM needed): -1 drafts from vLLM are handled like ours."""
    gen = torch.Generator().manual_seed(5)
    target = torch.randn(4, V, generator=gen)  # [T, V] vLLM-processed logits
    target[0, 3] = 40.0  # request 0's first draft (3) is accepted with probability ~1
    bonus = torch.tensor([[7], [9]])  # [B, 1]
    meta = SimpleNamespace(
        all_greedy=bool(greedy),
        all_random=not greedy,
        temperature=None if greedy else torch.ones(2),
        generators={0: torch.Generator().manual_seed(1), 1: torch.Generator().manual_seed(2)},
    )
    verifier = Verifier(RejectionSampler())
    drafts = torch.tensor([3, P, P, 5], dtype=torch.int32)
    out = verifier(drafts, [2, 2], 2, torch.tensor([2, 4]), None, target, bonus, meta)
    assert out.shape == (2, 3)
    row0 = [t for t in out[0].tolist() if t != P]
    assert row0[0] == 3
    assert len(row0) == 2 and 0 <= row0[1] < V  # the placeholder's position: a real token
    row1 = [t for t in out[1].tolist() if t != P]
    assert len(row1) == 1 and 0 <= row1[0] < V
    if greedy:
        assert row0[1] == int(target[1].argmax()) and row1[0] == int(target[2].argmax())
