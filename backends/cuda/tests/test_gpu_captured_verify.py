"""GPU tier: the rejection sampler captured as CUDA graphs (``runtime/captured_verify``) gives the eager
sampler's tokens and verified-draft counts, greedy and seeded sampled, at captured, padded and eager (above
the largest) sizes, with placeholder drafts; and a replay reads nothing back but its output."""

from __future__ import annotations

import pytest
import torch
from spec_backend_cuda import CudaBackend

from spec_backend.graphs import plan_capture_sizes
from spec_backend.runtime.captured_verify import CapturedVerify
from spec_backend.sampling import RejectionSampler, SpecDecodeMetadata
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID
from spec_backend.sampling.sampling_metadata import SamplingFlags, SamplingMetadata

pytestmark = pytest.mark.cuda

VOCAB = 4096


def _batch(batch: int, q: int, greedy: bool, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Logits [B*q, V] peaked where the drafts are (so some are accepted), tokens [B, q] with a tail of
    placeholders in every other request, temperatures, seeds and positions [B]."""
    tokens = torch.randint(0, VOCAB, (batch, q), generator=gen)  # [B, q]
    for b in range(0, batch, 2):
        tokens[b, max(1, q - b % q) :] = PLACEHOLDER_TOKEN_ID
    logits = torch.randn(batch * q, VOCAB, generator=gen)  # [N, V]
    nxt = torch.roll(tokens, -1, dims=1).clamp_min(0).reshape(-1)  # [N] the draft after each row
    logits[torch.arange(batch * q), nxt] += 6.0
    temperature = torch.zeros(batch) if greedy else torch.rand(batch, generator=gen) + 0.5
    seeds = torch.randint(0, 2**62, (batch,), generator=gen)
    positions = torch.randint(0, 1000, (batch,), generator=gen)
    return tuple(t.cuda() for t in (logits, tokens, temperature, seeds, positions))


def _eager(sampler: RejectionSampler, q: int, *batch: torch.Tensor) -> tuple[list[list[int]], list[int]]:
    logits, tokens, temperature, seeds, positions = batch
    b = tokens.shape[0]
    drafts = tokens[:, 1:]  # [B, K]
    metadata = SpecDecodeMetadata.from_layout(drafts.reshape(-1).to(torch.int32), [q - 1] * b, None)
    flags = SamplingFlags.of(temperature.tolist(), [0] * b, [1.0] * b, seeds.tolist())
    top_k, top_p = torch.zeros_like(seeds), torch.ones_like(temperature)
    sampling = SamplingMetadata.prevalidated(temperature, top_k, top_p, seeds, positions, flags)
    out = sampler(metadata, None, logits, sampling).tolist()  # [B, q]
    valid = torch.cumprod((drafts != PLACEHOLDER_TOKEN_ID).long(), 1).sum(1).tolist()
    return [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in out], valid


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_captured_sampler_equals_eager(k: int, greedy: bool) -> None:
    backend = CudaBackend(graph_progress=False)
    sampler = RejectionSampler(backend=backend)
    q = k + 1
    sizes = tuple(plan_capture_sizes(k, max_num_seqs=8, backend=backend))
    captured = CapturedVerify(sampler, backend, q, sizes, VOCAB, torch.device("cuda"))
    runner = captured.runners["greedy" if greedy else "sampled"]
    gen = torch.Generator().manual_seed(k + 10 * greedy)
    batches = (1, 3, 8, 9)  # captured, padded, largest, eager above it
    for batch in batches:
        inputs = _batch(batch, q, greedy, gen)
        logits, tokens, temperature, seeds, positions = inputs
        flags = SamplingFlags.of(temperature.tolist(), [0] * batch, [1.0] * batch, seeds.tolist())
        top_k, top_p = torch.zeros_like(seeds), torch.ones_like(temperature)
        sampling = SamplingMetadata.prevalidated(temperature, top_k, top_p, seeds, positions, flags)
        kind = "greedy" if greedy else "sampled"
        assert captured(kind, logits, tokens, sampling) == _eager(sampler, q, *inputs)
    fits = sum(1 for b in batches if b * q <= sizes[-1])
    assert runner.replays == fits >= 1 and runner.eager_calls == len(batches) - fits >= 1
