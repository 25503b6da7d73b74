"""The native row attention kernel (``csrc/attention_rows.cpp``) behind the cpu backend's
batch-invariant attention: SDPA's values within float32 rounding, every row independent of the other rows
of the call (prefill, verify and decode give a position the same bits), and clear errors on bad input — on
every ISA variant of the kernels this CPU runs (``isa_fixtures``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from isa_fixtures import VARIANTS, use_variant

from spec_backend.cpu.attention import cpu_ragged_attention, mark_batch_invariant, native_attention_rows
from spec_backend.cpu.native import native_op
from spec_backend.step import RaggedAttentionMetadata


@pytest.fixture(autouse=True, params=VARIANTS)
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return use_variant(str(request.param), monkeypatch)


HQ, HKV, D = 6, 2, 32


def _qkv(q_len: int, kv_len: int, batch: int = 1, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, HQ, q_len, D, generator=g)  # [B, Hq, Q, D]
    k = torch.randn(batch, HKV, kv_len, D, generator=g)  # [B, Hkv, L, D]
    return q, k, torch.randn(batch, HKV, kv_len, D, generator=g)


def _rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lens: list[int], kv_lens: list[int]
) -> torch.Tensor:
    meta = RaggedAttentionMetadata(torch.tensor(q_lens), torch.tensor(kv_lens))
    out = native_attention_rows(q, k, v, meta, None)
    assert out is not None
    return out  # [B, Q, Hq, D]


def test_rows_match_sdpa_within_float32_rounding() -> None:
    """A ragged batch (request 1 padded) with grouped-query heads; noise floor: float32 dot products and
    softmax of <= 90 keys, |error| <= 2^-20 of the values' scale; padding rows are zeros."""
    q, k, v = _qkv(12, 90, batch=2)
    out = _rows(q, k, v, [12, 5], [90, 40])
    for b, (q_len, kv_len) in enumerate([(12, 90), (5, 40)]):
        for i in range(q_len):
            seen = kv_len - q_len + i + 1
            ref = F.scaled_dot_product_attention(
                q[b : b + 1, :, i : i + 1], k[b : b + 1, :, :seen], v[b : b + 1, :, :seen], enable_gqa=True
            )[0, :, 0]  # [Hq, D]
            assert torch.allclose(out[b, i], ref, rtol=0, atol=2**-20 * float(v.abs().max()))
    assert not out[1, 5:].any()


@pytest.mark.parametrize("prompt", [31, 33, 47, 143, 192])
def test_a_row_does_not_depend_on_the_other_rows(prompt: int) -> None:
    """A prompt prefilled alone, prefilled one token longer (a draft model catching up), and decoded
    row by row: the same bits for every position. (torch's SDPA breaks the first on this machine for
    these lengths, which is why the kernel exists.)"""
    q, k, v = _qkv(prompt + 1, prompt + 1, seed=prompt)
    short = _rows(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], [prompt], [prompt])
    longer = _rows(q, k, v, [prompt + 1], [prompt + 1])
    assert torch.equal(short[:, :prompt], longer[:, :prompt])
    for i in [0, prompt // 2, prompt - 1, prompt]:
        alone = _rows(q[:, :, i : i + 1].contiguous(), k, v, [1], [i + 1])
        assert torch.equal(alone[0, 0], longer[0, i])


def test_the_backend_attention_uses_it_for_batch_invariant_models() -> None:
    q, k, v = _qkv(4, 20)
    meta = RaggedAttentionMetadata(torch.tensor([4]), torch.tensor([20]))
    module = torch.nn.Module()
    mark_batch_invariant(module)
    out, _ = cpu_ragged_attention(module, q, k, v, None, scaling=D**-0.5, spec_attn_metadata=meta)
    assert torch.equal(out, _rows(q, k, v, [4], [20]))
    wide, _ = cpu_ragged_attention(  # float64 (tests' reference models): torch's row by row path
        module, q.double(), k.double(), v.double(), None, scaling=D**-0.5, spec_attn_metadata=meta,
    )  # fmt: skip
    assert wide.dtype == torch.float64 and torch.allclose(wide.float(), out, atol=1e-5)


def test_bad_inputs_are_refused() -> None:
    q, k, v = _qkv(2, 8)
    op = native_op("attention_rows")
    assert op is not None
    with pytest.raises(RuntimeError, match="must be float32"):
        op(q.double(), k, v, torch.tensor([2]), torch.tensor([8]), 0.1)
    with pytest.raises(RuntimeError, match="head dim must be a multiple of 16 up to 256, got 8"):
        op(q[..., :8], k[..., :8], v[..., :8], torch.tensor([2]), torch.tensor([8]), 0.1)
    wide_q, wide_k, wide_v = (t[..., :16].repeat(1, 1, 1, 17) for t in (q, k, v))  # head dim 272
    with pytest.raises(RuntimeError, match="head dim must be a multiple of 16 up to 256, got 272"):
        op(wide_q, wide_k, wide_v, torch.tensor([2]), torch.tensor([8]), 0.1)
    with pytest.raises(RuntimeError, match="request 0: q_len 3, kv_len 2 do not fit"):
        op(q, k, v, torch.tensor([3]), torch.tensor([2]), 0.1)
    with pytest.raises(RuntimeError, match="one entry per request"):
        op(q, k, v, torch.tensor([2, 2]), torch.tensor([8, 8]), 0.1)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 200, 1000])
def test_rows_match_a_float64_softmax(n: int) -> None:
    """The kernel's own exp (vectorised, degree-7 polynomial) and its sums against softmax in float64,
    one row over n keys (partial blocks of 16 included): within 4e-6 of the output's size, float32
    rounding of the scores and sums (measured: at most 4.3e-7); a coarser exp or a key past n counted
    would exceed it."""
    op = native_op("attention_rows")
    assert op is not None
    g = torch.Generator().manual_seed(n)
    q = torch.randn(1, 1, 1, 64, generator=g) * 3
    k, v = torch.randn(1, 1, n + 5, 64, generator=g), torch.randn(1, 1, n + 5, 64, generator=g)
    out = op(q, k, v, torch.tensor([1]), torch.tensor([n]), 0.125)[0, 0, 0]  # [D]
    weights = torch.softmax((q.double() @ k[:, :, :n].double().transpose(-1, -2)) * 0.125, -1)  # [1, 1, 1, n]
    ref = (weights @ v[:, :, :n].double())[0, 0, 0]  # [D]
    assert float((out.double() - ref).abs().max()) <= 4e-6 * float(ref.abs().max())


def test_key_and_value_of_different_layouts_are_accepted() -> None:
    """Key and value of one decode row as a layer computes them without a cache (the fast-path
    measurement): the key a new tensor out of the rotary embedding, the value a transposed view of its
    projection. Their strides differ only on dims of size 1, which are only indexed at 0: accepted, the
    contiguous inputs' result bit for bit. Layouts that differ on a longer dim are refused."""
    q, k, v = _qkv(1, 1)  # [1, H, 1, D]
    value_view = v.clone().as_strided(v.shape, (HKV * D, D, HKV * D, 1))  # as [1, 1, Hkv, D] transposed
    assert value_view.stride() != k.stride()
    assert torch.equal(_rows(q, k, value_view, [1], [1]), _rows(q, k, v, [1], [1]))
    q, k, v = _qkv(2, 4)
    op = native_op("attention_rows")
    assert op is not None
    with pytest.raises(RuntimeError, match=r"key and value must share strides \(on dims longer than 1\)"):
        op(q, k, v.transpose(1, 2).contiguous().transpose(1, 2), torch.tensor([2]), torch.tensor([4]), 0.1)


def test_heads_read_from_a_transposed_projection_are_accepted() -> None:
    """transformers splits the q/k/v projections' outputs into heads by views; when a projection returns
    its product transposed (``TallSkinnyProjection``: ``(W @ x.T).T``, a float layer of a model whose
    other layers are packed), the heads' last dim is strided. Such inputs give the contiguous inputs'
    result bit for bit (before the fix: "query, key and value must be float32 [B, H, T, D] with a
    contiguous last dim")."""
    q, k, v = _qkv(3, 7)
    rows = q.transpose(1, 2).reshape(3, HQ * D)  # [Q, Hq*D] as the projection computes it
    strided = rows.T.contiguous().T.reshape(1, 3, HQ, D).transpose(1, 2)  # [1, Hq, Q, D], last-dim stride Q
    assert strided.stride(-1) == 3 and torch.equal(strided, q)
    assert torch.equal(_rows(strided, k, v, [3], [7]), _rows(q, k, v, [3], [7]))
    strided_k = k.transpose(2, 3).contiguous().transpose(2, 3)  # [1, Hkv, L, D] with last-dim stride L
    assert torch.equal(_rows(q, strided_k, v, [3], [7]), _rows(q, k, v, [3], [7]))
