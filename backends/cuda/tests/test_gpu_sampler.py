"""GPU tier: the conformance suite on the CUDA backend, and the rejection sampler captured in a CUDA
graph replaying exactly like eager calls (seeded requests)."""

from __future__ import annotations

import pytest
import torch
from spec_backend_cuda import CudaBackend
from spec_backend_cuda.graph_runner import CudaGraphDriver

from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata

pytestmark = pytest.mark.cuda

DRAFTS = [[5, 7, 1], [2], [9, 9, 9], [3, 4]]
SEEDS = [11, 12, 13, 14]


def test_conformance_suite_passes() -> None:
    from spec_backend.testing import run_conformance

    report = run_conformance(CudaBackend(), attention_atol=2e-3)  # flash-attn computes in half precision
    print(report.summary())
    report.assert_passed()


@pytest.mark.parametrize(
    "temperatures", [[0.0] * 4, [1.0] * 4, [0.0, 0.7, 1.0, 1.3]], ids=["greedy", "random", "mixed"]
)
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_captured_sampler_replays_like_eager(temperatures: list[float], with_draft_probs: bool) -> None:
    vocab, device = 4096 + 123, "cuda"
    sampler = RejectionSampler(backend=CudaBackend())
    meta = SpecDecodeMetadata.from_draft_tokens(DRAFTS, device)
    rows = meta.num_tokens + meta.batch_size
    sampling = SamplingMetadata.from_lists(
        temperatures, seeds=SEEDS, positions=[10, 20, 30, 40], device=device
    )
    logits = torch.zeros(rows, vocab, device=device)  # [T + B, V] static input
    draft_probs = (
        torch.full((meta.num_tokens, vocab), 1.0 / vocab, device=device) if with_draft_probs else None
    )

    def call() -> torch.Tensor:  # [B, max_K + 1] int32
        return sampler(meta, draft_probs, logits, sampling)

    graph, out = CudaGraphDriver().capture_once(call)
    gen = torch.Generator(device=device).manual_seed(0)
    for step in range(4):
        logits.copy_(torch.randn(rows, vocab, device=device, generator=gen) * 4)
        if draft_probs is not None:
            draft_probs.copy_(
                torch.softmax(torch.randn(meta.num_tokens, vocab, device=device, generator=gen), -1)
            )
        assert sampling.positions is not None
        sampling.positions.add_(step + 1)  # the next step's positions, updated in place
        graph.replay()
        torch.cuda.synchronize()
        fresh = SamplingMetadata.from_lists(
            temperatures, seeds=SEEDS, positions=sampling.positions.tolist(), device=device
        )
        expected = sampler(meta, None if draft_probs is None else draft_probs.clone(), logits.clone(), fresh)
        assert torch.equal(out, expected), step


def test_greedy_tokens_match_torch_argmax_at_qwen_vocab() -> None:
    vocab, device = 151936, "cuda"
    sampler = RejectionSampler(backend=CudaBackend())
    drafts = [[1, 2, 3, 4]] * 8
    meta = SpecDecodeMetadata.from_draft_tokens(drafts, device)
    logits = torch.randn(meta.num_tokens + 8, vocab, device=device)
    out = sampler(meta, None, logits, SamplingMetadata.greedy(8, device))
    target = logits.argmax(dim=-1)
    first = target[meta.target_logits_indices[::4].long()]  # each request's first target row
    assert torch.equal(out[:, 0].long(), first)  # drafts are random ids: the first one is rejected
