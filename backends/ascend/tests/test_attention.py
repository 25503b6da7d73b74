"""Ascend ragged attention (through the fake FIA) equals the reference attention; the fake rejects
what the documented op rejects."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from helpers import ragged_batch, real_rows, reference
from spec_backend_ascend import AscendBackend
from spec_backend_ascend.attention import ascend_ragged_attention

from spec_backend.step import RaggedAttentionMetadata

#: FIA returns float16 for a float32 model (the op has no float32): outputs carry float16 rounding.
FP16_OUT_TOL = {"atol": 2e-3, "rtol": 2e-3}


def _run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: RaggedAttentionMetadata) -> torch.Tensor:
    out, weights = ascend_ragged_attention(torch.nn.Module(), q, k, v, None, spec_attn_metadata=meta)
    assert weights is None and out.dtype == q.dtype
    return out


def _layout(dim: int, q_len: int) -> str:
    """The layout a call must use: TND for its head dims (64, 128, 192), BNSD for others, BNSD_BSND
    beyond 16 query tokens per request."""
    if q_len > 16:
        return "BNSD_BSND"
    return "TND" if dim in (64, 128, 192) else "BNSD"


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "q_len"),
    [
        (4, 4, 16, 1),
        (4, 2, 32, 4),
        (8, 1, 16, 16),
        (6, 3, 64, 7),
        (4, 2, 16, 24),
        (2, 2, 128, 3),
        (2, 1, 192, 1),
        (2, 1, 256, 5),
        (2, 2, 256, 20),
    ],
)
def test_matches_reference_on_random_ragged_batches(
    fake_npu: ModuleType, heads: int, kv_heads: int, dim: int, q_len: int
) -> None:
    gen = torch.Generator().manual_seed(heads * 100 + dim + q_len)
    for batch in (1, 3):
        q, k, v, meta = ragged_batch(gen, batch, q_len, heads, kv_heads, dim)
        got, want = _run(q, k, v, meta), reference(q, k, v, meta)
        rows = real_rows(meta, q_len)
        torch.testing.assert_close(got[rows], want[rows], **FP16_OUT_TOL)
    layouts = [c[1]["input_layout"] for c in fake_npu.CALLS if c[0] == "npu_fused_infer_attention_score"]
    assert layouts == [_layout(dim, q_len)] * 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(fake_npu: ModuleType, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    q, k, v, meta = ragged_batch(gen, 4, 5, 8, 2, 32, dtype=dtype)
    got, want = _run(q, k, v, meta), reference(q, k, v, meta).to(dtype)
    rows = real_rows(meta, 5)
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(got[rows], want[rows], atol=tol, rtol=tol)


def test_decode_call_is_tnd_with_pages_and_right_down_causal(fake_npu: ModuleType) -> None:
    q = torch.randn(2, 4, 3, 64)
    k = v = torch.randn(2, 2, 10, 64)
    meta = RaggedAttentionMetadata(torch.tensor([3, 1]), torch.tensor([10, 6]))
    _run(q, k, v, meta)
    (call,) = [c[1] for c in fake_npu.CALLS if c[0] == "npu_fused_infer_attention_score"]
    assert call["input_layout"] == "TND" and call["sparse_mode"] == 3 and call["block_size"] == 128
    assert call["actual_seq_lengths"] == [3, 6]  # cumulative over the padded rows
    assert call["actual_seq_lengths_kv"] == [10, 8]  # kv - q + Q: padding rows after the real ones
    assert call["block_table"].dtype == torch.int32 and call["num_key_value_heads"] == 2


@pytest.mark.parametrize("dim", [16, 32, 256])
def test_head_dims_tnd_rejects_take_the_bnsd_layout(fake_npu: ModuleType, dim: int) -> None:
    """TND accepts head dims 64/128/192 only (error 561002 on the device otherwise): other dims run the
    BNSD layout over the padded dense cache with the same static query and shifted kv lengths."""
    q = torch.randn(2, 4, 3, dim)
    k = v = torch.randn(2, 2, 10, dim)
    meta = RaggedAttentionMetadata(torch.tensor([3, 1]), torch.tensor([10, 6]))
    _run(q, k, v, meta)
    (call,) = [c[1] for c in fake_npu.CALLS if c[0] == "npu_fused_infer_attention_score"]
    assert call["input_layout"] == "BNSD" and call["sparse_mode"] == 3 and "block_table" not in call
    assert call["actual_seq_lengths"] == [3, 3] and call["actual_seq_lengths_kv"] == [10, 8]


@pytest.mark.parametrize("dim", [8, 24, 528])
def test_head_dims_no_layout_accepts_are_refused(fake_npu: ModuleType, dim: int) -> None:
    q = torch.randn(1, 2, 2, dim)
    k = torch.randn(1, 2, 4, dim)
    meta = RaggedAttentionMetadata(torch.tensor([2]), torch.tensor([4]))
    with pytest.raises(ValueError, match=rf"multiples of 16 up to 512, got query {dim}"):
        _run(q, k, k, meta)
    assert not [c for c in fake_npu.CALLS if c[0] == "npu_fused_infer_attention_score"]


def test_fake_fia_refuses_bnsd_bsnd_with_one_query_token(fake_npu: ModuleType) -> None:
    """BNSD_BSND (BNSD in, BSND out) supports only a query S > 1 (op doc), so prefill never uses it
    for one token."""
    q = torch.zeros(1, 2, 1, 32, dtype=torch.float16)
    k = torch.zeros(1, 2, 4, 32, dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"BNSD_BSND .* only query S > 1"):
        fake_npu.npu_fused_infer_attention_score(
            q, k, k, num_heads=2, input_layout="BNSD_BSND", actual_seq_lengths=[1], actual_seq_lengths_kv=[4]
        )


def test_backend_hands_out_the_fused_attention(fake_npu: ModuleType) -> None:
    assert AscendBackend().attention_function() is ascend_ragged_attention
    with pytest.raises(ValueError, match="spec_attn_metadata"):
        ascend_ragged_attention(
            torch.nn.Module(),
            torch.zeros(1, 1, 1, 16),
            torch.zeros(1, 1, 1, 16),
            torch.zeros(1, 1, 1, 16),
            None,
        )


def _fia_kwargs(fake: ModuleType, q_len: int = 4, batch: int = 2) -> dict[str, object]:
    return {
        "query": torch.zeros(batch * q_len, 4, 64, dtype=torch.float16),
        "key": torch.zeros(batch, 2, 128, 64, dtype=torch.float16),
        "value": torch.zeros(batch, 2, 128, 64, dtype=torch.float16),
        "atten_mask": torch.ones(2048, 2048, dtype=torch.int8).triu(1),
        "block_table": torch.arange(batch, dtype=torch.int32).view(batch, 1),
        "actual_seq_lengths": [q_len * (b + 1) for b in range(batch)],
        "actual_seq_lengths_kv": [q_len] * batch,
        "num_heads": 4,
        "num_key_value_heads": 2,
        "input_layout": "TND",
        "block_size": 128,
        "sparse_mode": 3,
    }


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({}, None),
        ({"_q_len": 17}, "0..16 query tokens per request"),
        ({"query": torch.zeros(8, 4, 64)}, "float16 or bfloat16"),
        ({"query": torch.zeros(4, 8, 64, dtype=torch.float16).transpose(0, 1)}, "contiguous"),
        ({"actual_seq_lengths": [4, 7]}, "cumulative"),
        ({"actual_seq_lengths": torch.tensor([4, 8])}, "list of ints"),
        ({"block_size": 64}, "multiple of 128"),
        ({"block_table": torch.zeros(2, 1, dtype=torch.int64)}, "int32"),
        ({"atten_mask": None}, "sparse_mode=3 with atten_mask"),
        ({"atten_mask": torch.ones(16, 16, dtype=torch.int8).triu(1)}, "2048"),
        ({"sparse_mode": 2}, "TND supports"),
        ({"num_key_value_heads": 3}, "N % Nkv"),
        ({"actual_seq_lengths_kv": [2, 4]}, "query length <= kv length"),
        ({"actual_seq_lengths_kv": [4, 300]}, "needs 3 blocks"),
        ({"scale_value": 0.5}, "unexpected keyword argument 'scale_value'"),
        ({"actual_seq_lengths": [4, 4], "query": torch.zeros(4, 4, 64, dtype=torch.float16)}, None),  # q=0
        ({"actual_seq_lengths_kv": [4, 4]}, None),  # query as long as its keys
        ({"_dim": 32}, r"561002: When layout is TND, queryD\(32\)"),
        ({"_dim": 256}, r"561002: When layout is TND, queryD\(256\)"),
    ],
)
def test_fake_fia_validates_like_the_documented_op(
    fake_npu: ModuleType, change: dict[str, object], error: str | None
) -> None:
    kwargs = _fia_kwargs(fake_npu, q_len=int(change.pop("_q_len", 4)))  # type: ignore[call-overload]
    dim = int(change.pop("_dim", 64))  # type: ignore[call-overload]
    for name in ("query", "key", "value"):
        tensor: torch.Tensor = kwargs[name]  # type: ignore[assignment]
        kwargs[name] = tensor[..., :1].expand(*tensor.shape[:-1], dim).contiguous()
    kwargs.update(change)
    query, key, value = kwargs.pop("query"), kwargs.pop("key"), kwargs.pop("value")
    if error is None:
        out, lse = fake_npu.npu_fused_infer_attention_score(query, key, value, **kwargs)
        assert out.shape == query.shape and lse.shape == (1,)  # type: ignore[union-attr]
        return
    with pytest.raises((RuntimeError, TypeError), match=error):
        fake_npu.npu_fused_infer_attention_score(query, key, value, **kwargs)


@pytest.mark.parametrize(("dim", "q_len"), [(64, 4), (128, 1), (192, 3), (32, 4), (16, 20)])
@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_every_layout_over_batch_sizes_and_caches_of_several_pages(
    fake_npu: ModuleType, dim: int, q_len: int, batch: int
) -> None:
    """Each layout (TND for head dims 64/128/192, BNSD for others, BNSD_BSND past 16 query tokens) over
    batch sizes 1..4 and caches spanning 1 to 4 of TND's 128-token pages: the op gets contiguous keys
    and values (the fake, like the device, rejects a strided view: with batch 1 and more than one page
    the paged cache used to be one) and the output equals the reference."""
    gen = torch.Generator().manual_seed(dim * 10 + batch)
    for max_prefix in (20, 200, 420):
        q, k, v, meta = ragged_batch(gen, batch, q_len, 4, 2, dim, max_prefix=max_prefix)
        torch.testing.assert_close(
            _run(q, k, v, meta)[real_rows(meta, q_len)],
            reference(q, k, v, meta)[real_rows(meta, q_len)],
            **FP16_OUT_TOL,
        )
    calls = [c[1] for c in fake_npu.CALLS if c[0] == "npu_fused_infer_attention_score"]
    assert {c["input_layout"] for c in calls} == {_layout(dim, q_len)}


def test_the_conformance_suites_attention_tier(fake_npu: ModuleType) -> None:
    """The public suite's attention tier (decode, verify and prefill shapes, caches of several pages)."""
    from test_engine_greedy import CpuEmulatedAscend

    from spec_backend.testing.attention_checks import check_attention

    for result in check_attention(CpuEmulatedAscend(), atol=FP16_OUT_TOL["atol"]):
        result.check()


@pytest.mark.parametrize("dim", [64, 32])
def test_token_tree_steps_match_the_reference_with_an_explicit_mask(fake_npu: ModuleType, dim: int) -> None:
    """A tree step (ragged trees, siblings that must not see each other) through BNSD, sparse_mode 0 and
    the [B, 1, Q, L] mask equals the reference's tree attention (whatever head dim: no TND)."""
    from spec_backend.step import build_tree_step_batch

    gen = torch.Generator().manual_seed(dim)
    trees, cached = [[-1, -1, 0, 1, 0], [-1, 0], [-1, -1, -1]], [9, 4, 13]
    width = 1 + max(len(t) for t in trees)
    batch = build_tree_step_batch(0, torch.zeros((3, width), dtype=torch.int64), trees, cached)
    meta, length = batch.attention, max(cached) + width
    q = torch.randn(3, 4, width, dim, generator=gen).half().float()
    k, v = (torch.randn(3, 2, length, dim, generator=gen).half().float() for _ in range(2))
    got, want = _run(q, k, v, meta), reference(q, k, v, meta)
    rows = real_rows(meta, width)
    torch.testing.assert_close(got[rows], want[rows], **FP16_OUT_TOL)
    causal = reference(q, k, v, RaggedAttentionMetadata(meta.query_lens, meta.kv_lens))  # no tree mask
    assert not torch.allclose(causal[rows], want[rows], **FP16_OUT_TOL)  # the check has power
    (call,) = [c[1] for c in fake_npu.CALLS if c[0] == "npu_fused_infer_attention_score"]
    assert (call["input_layout"], call["sparse_mode"], tuple(call["atten_mask"].shape)) == (
        "BNSD",
        0,
        (3, 1, width, length),
    )
