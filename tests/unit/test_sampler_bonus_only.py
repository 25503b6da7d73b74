"""A batch without drafts (plain decoding) takes ``output.bonus_only``, not the whole verification; its
tokens must be the verification's own, bit for bit, in every mix of greedy and sampled requests, with
top-k and top-p, seeded and unseeded, in the standard and a non-standard logits layout."""

from __future__ import annotations

import random

import pytest
import torch

from spec_backend.backends.reference import ReferenceBackend
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling import sampler as sampler_module

V = 97


def _case(trial: int) -> tuple[SpecDecodeMetadata, torch.Tensor, SamplingMetadata]:
    rnd = random.Random(trial)
    batch = rnd.randint(1, 7)
    logits = torch.randn(batch, V, generator=torch.Generator().manual_seed(trial)) * 3  # [B, V]
    metadata = SpecDecodeMetadata.from_draft_tokens([[] for _ in range(batch)], device="cpu")
    sampling = SamplingMetadata.from_lists(
        [rnd.choice([0.0, 0.5, 1.0, 1.7]) for _ in range(batch)],
        [rnd.choice([0, 3, 20]) for _ in range(batch)],
        [rnd.choice([1.0, 0.8, 0.3]) for _ in range(batch)],
        [rnd.choice([None, 5, 2**40]) for _ in range(batch)],
        [rnd.randint(0, 500) for _ in range(batch)],
    )
    return metadata, logits, sampling


@pytest.mark.parametrize("trial", range(30))
def test_plain_steps_give_the_verifications_tokens(trial: int, monkeypatch: pytest.MonkeyPatch) -> None:
    metadata, logits, sampling = _case(trial)
    sampler = RejectionSampler(backend=ReferenceBackend())
    if sampling.seeds is not None:  # unseeded rows draw fresh seeds: pin them for the comparison
        sampling.seeds = torch.where(sampling.seeds >= 0, sampling.seeds, torch.full_like(sampling.seeds, 9))
    calls: list[int] = []
    real = sampler_module.bonus_only

    def spy(*args: object) -> torch.Tensor:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(sampler_module, "bonus_only", spy)
    fast = sampler(metadata, None, logits, sampling)
    general = _general(sampler, metadata, logits, sampling)
    assert calls == [1]  # the plain batch took the fast path, the widened one did not
    assert fast.dtype == torch.int32 and fast.shape == (metadata.batch_size, 1)
    assert torch.equal(fast, general)


def _general(
    sampler: RejectionSampler, metadata: SpecDecodeMetadata, logits: torch.Tensor, sampling: SamplingMetadata
) -> torch.Tensor:
    """The same batch through the full verification (one null draft per request: q = 0 there, so the
    verification emits the target's token at the bonus position with the same random numbers)."""
    from spec_backend.sampling import PLACEHOLDER_TOKEN_ID

    batch = metadata.batch_size
    widened = SpecDecodeMetadata.from_draft_tokens([[PLACEHOLDER_TOKEN_ID]] * batch, device="cpu")
    rows = torch.stack([logits, logits], dim=1).reshape(2 * batch, V)  # target row == bonus row
    out = sampler(widened, None, rows, sampling)  # [B, 2]
    return out[:, :1]
