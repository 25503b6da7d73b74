"""Sliding windows on Ascend (issue 39): the fused op's band mode (sparse_mode 4, pre_tokens = W - 1,
next_tokens = 0) through the fake FIA, which emulates the band as the op documents it (origin at each
request's bottom-right corner, ignored when the query's S is 1); and the layers the op cannot compute
(sinks, soft caps, latent attention) refused before any forward."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers import ragged_batch, real_rows
from spec_backend_ascend import AscendBackend
from spec_backend_ascend.attention import ascend_ragged_attention

from spec_backend.backends.attention import sdpa_ragged_attention
from spec_backend.backends.base import BackendError, ModelOptions
from spec_backend.step import RaggedAttentionMetadata

FP16_OUT_TOL = {"atol": 2e-3, "rtol": 2e-3}


def _windowed_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: RaggedAttentionMetadata, window: int
) -> torch.Tensor:
    out, _ = sdpa_ragged_attention(
        torch.nn.Module(),
        q.float(),
        k.float(),
        v.float(),
        None,
        spec_attn_metadata=meta,
        sliding_window=window,
    )
    return out


def _calls(fake: ModuleType) -> list[dict[str, object]]:
    return [c[1] for c in fake.CALLS if c[0] == "npu_fused_infer_attention_score"]


@pytest.mark.parametrize(("dim", "q_len"), [(16, 1), (64, 4), (128, 1), (32, 16), (64, 24)])
@pytest.mark.parametrize("window", [1, 5, 30])
def test_windowed_layers_match_the_reference(fake_npu: ModuleType, dim: int, q_len: int, window: int) -> None:
    """Decode (S = 1, presented as 2 rows), verify (S <= 16, BNSD even for TND's head dims: TND has no
    band mode) and prefill (BNSD_BSND) with a window: the real rows equal the windowed reference."""
    gen = torch.Generator().manual_seed(dim + q_len + window)
    q, k, v, meta = ragged_batch(gen, 3, q_len, 4, 2, dim, max_prefix=60)
    got, _ = ascend_ragged_attention(
        torch.nn.Module(), q, k, v, None, spec_attn_metadata=meta, sliding_window=window
    )
    rows = real_rows(meta, q_len)
    torch.testing.assert_close(got[rows], _windowed_reference(q, k, v, meta, window)[rows], **FP16_OUT_TOL)
    (call,) = _calls(fake_npu)
    assert call["input_layout"] == ("BNSD_BSND" if q_len > 16 else "BNSD")
    assert (call["sparse_mode"], call["pre_tokens"], call["next_tokens"]) == (4, window - 1, 0)
    assert got.shape == (3, q_len, 4, dim)


def test_one_token_decode_is_presented_with_two_rows(fake_npu: ModuleType) -> None:
    """The op ignores the band when the query's S is 1 (op doc): a windowed decode step feeds S = 2, the
    padding row after the real one, and kv lengths shifted by it (kv - q + 2)."""
    q = torch.randn(2, 4, 1, 16)
    k = v = torch.randn(2, 2, 10, 16)
    meta = RaggedAttentionMetadata(torch.tensor([1, 1]), torch.tensor([10, 7]))
    ascend_ragged_attention(torch.nn.Module(), q, k, v, None, spec_attn_metadata=meta, sliding_window=3)
    (call,) = _calls(fake_npu)
    assert call["actual_seq_lengths"] == [2, 2] and call["actual_seq_lengths_kv"] == [11, 8]


def test_fake_fia_band_follows_the_documented_op(fake_npu: ModuleType) -> None:
    """sparse_mode 4 keeps keys from pre_tokens before to next_tokens after the right-down diagonal; with a
    query S of 1 the band has no effect (every key counts); pre_tokens + next_tokens must be >= 0."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 2, 16, generator=gen).half()
    k, v = (torch.randn(1, 2, 6, 16, generator=gen).half() for _ in range(2))
    mask = torch.ones(2048, 2048, dtype=torch.int8).triu(1)
    common = {"atten_mask": mask, "num_heads": 2, "input_layout": "BNSD", "sparse_mode": 4}
    out, _ = fake_npu.npu_fused_infer_attention_score(q, k, v, pre_tokens=1, next_tokens=0, **common)
    scores = (q.float() @ k.float().transpose(-1, -2)).softmax(-1)  # unmasked, to be masked by hand
    for row, keys in ((0, [3, 4]), (1, [4, 5])):  # diagonals 4 and 5 (Skv - Sq + i), one key before
        w = torch.einsum("nd,nkd->nk", q.float()[0, :, row], k.float()[0, :, keys]).softmax(-1)  # [N, 2]
        want = torch.einsum("nk,nkd->nd", w, v.float()[0, :, keys])  # scale 1.0: the op's default
        torch.testing.assert_close(out[0, :, row].float(), want, atol=2e-3, rtol=2e-3)
    one, _ = fake_npu.npu_fused_infer_attention_score(
        q[:, :, :1].contiguous(), k, v, pre_tokens=0, next_tokens=0, **common
    )
    full = torch.einsum("nk,nkd->nd", scores[0, :, 0], v.float()[0])  # S = 1: the band is ignored
    torch.testing.assert_close(one[0, :, 0].float(), full, atol=2e-3, rtol=2e-3)
    with pytest.raises(RuntimeError, match="pre_tokens \\+ next_tokens >= 0"):
        fake_npu.npu_fused_infer_attention_score(q, k, v, pre_tokens=1, next_tokens=-3, **common)


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"s_aux": torch.zeros(4)}, "no attention sinks and no logit soft cap"),
        ({"softcap": 50.0}, "no attention sinks and no logit soft cap"),
        ({"_value_dim": 32}, "value 32"),
    ],
)
def test_layers_the_op_cannot_compute_are_refused(
    fake_npu: ModuleType, extra: dict[str, object], error: str
) -> None:
    q = torch.randn(1, 4, 2, 16)
    k = torch.randn(1, 2, 5, 16)
    v = torch.randn(1, 2, 5, int(extra.pop("_value_dim", 16)))  # type: ignore[call-overload]
    meta = RaggedAttentionMetadata(torch.tensor([2]), torch.tensor([5]))
    with pytest.raises(ValueError, match=error):
        ascend_ragged_attention(torch.nn.Module(), q, k, v, None, spec_attn_metadata=meta, **extra)
    assert not _calls(fake_npu)


@pytest.mark.parametrize(
    ("family", "what"),
    [("gpt_oss", "attention sinks"), ("deepseek_v3", "multi-head latent attention"), ("gemma3", None)],
)
def test_models_the_op_cannot_run_are_refused_at_load(
    fake_npu: ModuleType, tmp_path: Path, family: str, what: str | None
) -> None:
    """GPT-OSS (sinks) and DeepSeek-V3 (latent attention) are refused by prepare_model, which the engine
    calls right after loading; Gemma 3 (windows only) is accepted."""
    from transformers import AutoModelForCausalLM

    from spec_backend.testing.fixtures.families import make_family_model

    model = AutoModelForCausalLM.from_pretrained(make_family_model(tmp_path / family, family))
    if what is None:
        AscendBackend().prepare_model(model, ModelOptions())
        return
    with pytest.raises(BackendError, match=f"backend 'ascend' cannot run this {family} model: .*{what}"):
        AscendBackend().prepare_model(model, ModelOptions())
