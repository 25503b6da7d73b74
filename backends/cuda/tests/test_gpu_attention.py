"""GPU tier: the flash, SDPA and triton paths against the float32 reference, and attention inside a CUDA
graph (the triton kernel compiled here; on CPU it runs interpreted, bfloat16 excepted)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from cuda_testlib import ragged_batch, real_rows, reference
from spec_backend_cuda.attention import (
    cuda_ragged_attention,
    cuda_sdpa_attention,
    flash_attn_installed,
    flash_ragged_attention,
    flash_unsupported_reason,
    triton_chain_attention,
)
from spec_backend_cuda.graph_runner import CudaGraphDriver

from spec_backend.backends.attention import sdpa_ragged_attention

pytestmark = pytest.mark.cuda

TOLERANCE = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: 1e-4}
LAYOUTS = [
    pytest.param(None, 5, 6, id="random-ragged"),
    pytest.param([5] * 8, 5, 8, id="uniform-K+1"),
    pytest.param([1] * 4, 1, 4, id="decode-Q1"),
    pytest.param([37, 1, 12], 37, 3, id="prefill-mixed"),
]
PATHS = {
    "sdpa": cuda_sdpa_attention,
    "flash": flash_ragged_attention,
    "auto": cuda_ragged_attention,
    "triton": triton_chain_attention,
}


def _needs(path: str, dtype: torch.dtype) -> None:
    if path == "flash" and not flash_attn_installed():
        pytest.skip("flash_attn is not installed")
    if path == "flash" and dtype == torch.float32:
        pytest.skip("flash-attn has no float32 kernels")


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("query_lens", "q_len", "batch"), LAYOUTS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(8, 2, 64), (4, 4, 128)])
def test_paths_match_the_reference(
    path: str,
    dtype: torch.dtype,
    query_lens: list[int] | None,
    q_len: int,
    batch: int,
    heads: int,
    kv_heads: int,
    dim: int,
) -> None:
    _needs(path, dtype)
    query, key, value, meta = ragged_batch(
        batch, q_len, heads, kv_heads, dim, dtype, "cuda", max_prefix=300, seed=4, query_lens=query_lens
    )
    out, _ = PATHS[path](torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta)
    assert out.shape == (batch, q_len, heads, dim) and out.dtype == dtype and out.is_cuda
    ref = reference(query, key, value, meta)
    tol = TOLERANCE[dtype]
    for got, want in zip(real_rows(out.float().cpu(), meta), real_rows(ref, meta), strict=True):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_auto_dispatch(dtype: torch.dtype) -> None:
    query, key, value, meta = ragged_batch(3, 4, 4, 2, 64, dtype, "cuda", seed=5)
    auto, _ = cuda_ragged_attention(torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta)
    flash_ok = flash_unsupported_reason(query, key) is None
    expected_path = flash_ragged_attention if flash_ok else sdpa_ragged_attention
    expected, _ = expected_path(torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta)
    assert torch.equal(auto, expected)
    assert flash_ok == (flash_attn_installed() and dtype != torch.float32)


@pytest.mark.parametrize("path", ["sdpa", "flash", "triton"])
def test_attention_replays_in_a_cuda_graph_with_new_lengths(path: str) -> None:
    """Lengths are device tensors read by the kernels: updating them in place is enough for a replay."""
    _needs(path, torch.float16)
    query, key, value, meta = ragged_batch(4, 4, 8, 2, 64, torch.float16, "cuda", max_prefix=64, seed=6)
    fn = PATHS[path]

    def call() -> torch.Tensor:
        return fn(torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta)[0]

    graph, out = CudaGraphDriver().capture_once(call)
    length = key.shape[2]
    for seed in range(3):
        gen = torch.Generator().manual_seed(100 + seed)
        q_lens = torch.randint(1, 5, (4,), generator=gen)
        kv = torch.minimum(q_lens + torch.randint(0, 64, (4,), generator=gen), torch.tensor(length))
        meta.query_lens.copy_(q_lens)
        meta.kv_lens.copy_(kv)
        query.copy_(torch.randn(query.shape, generator=gen).half())
        graph.replay()
        torch.cuda.synchronize()
        eager = call()
        for got, want in zip(real_rows(out, meta), real_rows(eager, meta), strict=True):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("query_lens", "q_len", "batch"), LAYOUTS)
@pytest.mark.parametrize("window", [1, 16, 100])
def test_sliding_window_paths_match_the_reference(
    path: str, dtype: torch.dtype, query_lens: list[int] | None, q_len: int, batch: int, window: int
) -> None:
    """A layer's sliding window (transformers' ``sliding_window=``) on every path: flash-attn's local
    attention, ``window_size=(W - 1, 0)``, and SDPA's windowed mask, against the float32 reference."""
    _needs(path, dtype)
    query, key, value, meta = ragged_batch(
        batch, q_len, 8, 2, 64, dtype, "cuda", max_prefix=300, seed=7, query_lens=query_lens
    )
    out, _ = PATHS[path](
        torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta, sliding_window=window
    )
    ref = reference(query, key, value, meta, window)
    tol = TOLERANCE[dtype]
    for got, want in zip(real_rows(out.float().cpu(), meta), real_rows(ref, meta), strict=True):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_attention_sinks_take_the_sdpa_path_on_the_gpu() -> None:
    """GPT-OSS's sinks: the auto path computes them (SDPA's explicit path), the triton kernel too, the
    flash path refuses them."""
    query, key, value, meta = ragged_batch(3, 4, 8, 2, 64, torch.bfloat16, "cuda", max_prefix=40, seed=8)
    sinks = torch.linspace(-2.0, 2.0, 8, device="cuda")
    kwargs: dict[str, Any] = {"spec_attn_metadata": meta, "s_aux": sinks, "sliding_window": 16}
    auto, _ = cuda_ragged_attention(torch.nn.Identity(), query, key, value, None, **kwargs)
    cpu_meta = type(meta)(meta.query_lens.cpu(), meta.kv_lens.cpu())
    want, _ = sdpa_ragged_attention(
        torch.nn.Identity(),
        query.float().cpu(),
        key.float().cpu(),
        value.float().cpu(),
        None,
        spec_attn_metadata=cpu_meta,
        s_aux=sinks.cpu(),
        sliding_window=16,
    )
    for got, ref in zip(real_rows(auto.float().cpu(), meta), real_rows(want, cpu_meta), strict=True):
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    kernel, _ = triton_chain_attention(torch.nn.Identity(), query, key, value, None, **kwargs)
    for got, ref in zip(real_rows(kernel.float().cpu(), meta), real_rows(want, cpu_meta), strict=True):
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    if flash_attn_installed():
        with pytest.raises(ValueError, match="attention sinks"):
            flash_ragged_attention(torch.nn.Identity(), query, key, value, None, **kwargs)
