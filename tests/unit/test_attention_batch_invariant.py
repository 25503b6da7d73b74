"""The cpu backend's batch-invariant attention (models with packed int4 layers): every row is bit for bit
what it is when computed alone, whatever the step's query count, batch and padding. Negative control: an
unmarked model gets the reference's SDPA path, which is not, at float32 rounding level."""

from __future__ import annotations

import pytest
import torch

from spec_backend.cpu.attention import cpu_ragged_attention, mark_batch_invariant
from spec_backend.step import RaggedAttentionMetadata

H, HKV, D = 6, 2, 16


def _run(
    invariant: bool, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lens: list[int], kv_lens: list[int]
) -> torch.Tensor:
    module = torch.nn.Module()
    if invariant:
        mark_batch_invariant(module)
    meta = RaggedAttentionMetadata(torch.tensor(q_lens), torch.tensor(kv_lens))
    out, _ = cpu_ragged_attention(module, q, k, v, None, spec_attn_metadata=meta)
    return out  # [B, Q, H, D]


def _case(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, 5, D, generator=g)
    k, v = torch.randn(2, HKV, 40, D, generator=g), torch.randn(2, HKV, 40, D, generator=g)
    return q, k, v


@pytest.mark.parametrize("invariant", [True, False])
def test_rows_do_not_depend_on_the_rest_of_the_step(invariant: bool) -> None:
    q, k, v = _case()
    # request 0 verifies 5 rows ending at position 29; request 1 has 3 rows ending at 39 (padded to 5)
    step = _run(invariant, q, k, v, [5, 3], [30, 40])
    alone = [
        _run(invariant, q[:1, :, i : i + 1], k[:1, :, : 26 + i], v[:1, :, : 26 + i], [1], [26 + i])
        for i in range(5)
    ]
    same = all(torch.equal(step[0, i], alone[i][0, 0]) for i in range(5))
    other = _run(invariant, q[1:, :, :3], k[1:], v[1:], [3], [40])  # request 1 without request 0 beside it
    same = same and torch.equal(step[1, :3], other[0])
    if invariant:
        assert same
    else:  # the default kernel's rows move with the step's shape, at float32 rounding level
        assert not same and all(torch.allclose(step[0, i], alone[i][0, 0], atol=1e-5) for i in range(5))


def test_long_prefills_keep_the_causal_rule() -> None:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, 24, D, generator=g)
    k, v = torch.randn(1, HKV, 24, D, generator=g), torch.randn(1, HKV, 24, D, generator=g)
    fast, invariant = _run(False, q, k, v, [24], [24]), _run(True, q, k, v, [24], [24])
    assert torch.allclose(fast, invariant, atol=1e-5)
