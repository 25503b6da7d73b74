"""Real-hardware checks (``ascend`` marker): run on the Ascend CI runner, skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
from helpers import ragged_batch, real_rows, reference
from spec_backend_ascend import AscendBackend
from spec_backend_ascend.attention import ascend_ragged_attention

from spec_backend.step import RaggedAttentionMetadata

pytestmark = pytest.mark.ascend


@pytest.fixture
def npu() -> torch.device:
    status = AscendBackend().probe()
    if not status.available:
        pytest.skip(str(status))
    return torch.device("npu")


@pytest.mark.parametrize("dim", [128, 256])  # TND, and the BNSD route for a dim TND rejects
@pytest.mark.parametrize(
    ("q_len", "dtype"), [(1, torch.float16), (4, torch.bfloat16), (16, torch.float16), (40, torch.float16)]
)
def test_fused_attention_matches_reference_on_device(
    npu: torch.device, q_len: int, dtype: torch.dtype, dim: int
) -> None:
    gen = torch.Generator().manual_seed(q_len)
    q, k, v, meta = ragged_batch(gen, 5, q_len, 8, 2, dim, dtype=dtype, max_prefix=300)
    on_device = RaggedAttentionMetadata(meta.query_lens.to(npu), meta.kv_lens.to(npu))
    out, _ = ascend_ragged_attention(
        torch.nn.Module(), q.to(npu), k.to(npu), v.to(npu), None, spec_attn_metadata=on_device
    )
    rows = real_rows(meta, q_len)
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    torch.testing.assert_close(out.cpu()[rows].float(), reference(q, k, v, meta)[rows], atol=tol, rtol=tol)


@pytest.mark.parametrize(("q_len", "window"), [(1, 64), (4, 64), (4, 1), (40, 100)])
def test_sliding_window_band_matches_reference_on_device(npu: torch.device, q_len: int, window: int) -> None:
    """The band mode (sparse_mode 4, pre_tokens = W - 1) on the device: decode presented as 2 rows,
    verify and prefill, against the windowed reference."""
    from spec_backend.backends.attention import sdpa_ragged_attention

    gen = torch.Generator().manual_seed(q_len + window)
    q, k, v, meta = ragged_batch(gen, 5, q_len, 8, 2, 128, dtype=torch.float16, max_prefix=300)
    on_device = RaggedAttentionMetadata(meta.query_lens.to(npu), meta.kv_lens.to(npu))
    out, _ = ascend_ragged_attention(
        torch.nn.Module(),
        q.to(npu),
        k.to(npu),
        v.to(npu),
        None,
        spec_attn_metadata=on_device,
        sliding_window=window,
    )
    want, _ = sdpa_ragged_attention(
        torch.nn.Module(),
        q.float(),
        k.float(),
        v.float(),
        None,
        spec_attn_metadata=meta,
        sliding_window=window,
    )
    rows = real_rows(meta, q_len)
    torch.testing.assert_close(out.cpu()[rows].float(), want[rows], atol=5e-3, rtol=5e-3)


def test_graph_replay_with_updated_lengths_on_device(npu: torch.device) -> None:
    heads, kv_heads, dim, q_len, slots, length = 8, 2, 128, 4, 4, 256
    gen = torch.Generator().manual_seed(0)
    cache_k = torch.randn(slots, kv_heads, length, dim, generator=gen).half().to(npu)
    cache_v = torch.randn(slots, kv_heads, length, dim, generator=gen).half().to(npu)

    def fn(query: torch.Tensor) -> torch.Tensor:
        batch = query.shape[0] // q_len
        q = query.view(batch, q_len, heads, dim).transpose(1, 2)
        full = torch.full((batch,), q_len)
        meta = RaggedAttentionMetadata(full, torch.full((batch,), length))
        out, _ = ascend_ragged_attention(
            torch.nn.Module(), q, cache_k[:batch], cache_v[:batch], None, spec_attn_metadata=meta
        )
        return out.reshape(batch * q_len, heads, dim)

    runner = AscendBackend().graph_runner(fn, [q_len * n for n in (1, 2, 4)])
    runner.capture({"query": torch.zeros(4 * q_len, heads, dim, dtype=torch.float16, device=npu)})
    meta = RaggedAttentionMetadata(torch.tensor([4, 1, 3]), torch.tensor([100, 7, 256]))
    runner.set_update_hook(lambda size, inputs: runner.update_attention(size, meta.query_lens, meta.kv_lens))  # type: ignore[attr-defined]
    query = torch.randn(3 * q_len, heads, dim, generator=gen).half()
    got = runner.run({"query": query.to(npu)}).cpu().view(3, q_len, heads, dim)
    want = reference(
        query.view(3, q_len, heads, dim).transpose(1, 2), cache_k[:3].cpu(), cache_v[:3].cpu(), meta
    )
    rows = real_rows(meta, q_len)
    torch.testing.assert_close(got[rows].float(), want[rows], atol=5e-3, rtol=5e-3)


@pytest.mark.parametrize("dim", [128, 256])
def test_token_tree_mask_matches_reference_on_device(npu: torch.device, dim: int) -> None:
    """A tree step through BNSD with the explicit [B, 1, Q, L] mask (sparse_mode 0) on the device."""
    from dataclasses import replace

    from spec_backend.step import build_tree_step_batch

    gen = torch.Generator().manual_seed(dim)
    trees, cached = [[-1, -1, 0, 1, 0], [-1, 0], [-1, -1, -1]], [90, 40, 130]
    width = 1 + max(len(t) for t in trees)
    meta = build_tree_step_batch(0, torch.zeros((3, width), dtype=torch.int64), trees, cached).attention
    q = torch.randn(3, 8, width, dim, generator=gen).half()
    k, v = (torch.randn(3, 2, max(cached) + width, dim, generator=gen).half() for _ in range(2))
    on_device = replace(
        meta,
        query_lens=meta.query_lens.to(npu),
        kv_lens=meta.kv_lens.to(npu),
        tree=meta.tree.to(npu) if meta.tree is not None else None,
        tree_depths=meta.tree_depths.to(npu) if meta.tree_depths is not None else None,
        mask_cache={},
    )
    out, _ = ascend_ragged_attention(
        torch.nn.Module(), q.to(npu), k.to(npu), v.to(npu), None, spec_attn_metadata=on_device
    )
    rows = real_rows(meta, width)
    want = reference(q.float(), k.float(), v.float(), meta)
    torch.testing.assert_close(out.cpu()[rows].float(), want[rows], atol=5e-3, rtol=5e-3)
