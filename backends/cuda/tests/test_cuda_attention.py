"""CUDA attention on CPU: the SDPA path is the reference; the flash glue is checked against an
emulated ``flash_attn_with_kvcache`` (flash-attn's documented semantics in torch)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from cuda_testlib import emulated_flash_with_kvcache, ragged_batch, real_rows, reference
from spec_backend_cuda import CudaBackend
from spec_backend_cuda import attention as cuda_attention
from spec_backend_cuda.attention import (
    cuda_ragged_attention,
    flash_layer_reason,
    flash_ragged_attention,
    flash_unsupported_reason,
    ragged_flash,
    rotation_index,
)

from spec_backend.backends.attention import sdpa_ragged_attention

LAYOUTS = [
    pytest.param(None, 5, id="random-ragged"),
    pytest.param([5, 5, 5], 5, id="uniform-K+1"),
    pytest.param([1, 1], 1, id="decode-Q1"),
    pytest.param([7, 1, 3], 7, id="prefill-mixed"),
]


@pytest.mark.parametrize(("query_lens", "q_len"), LAYOUTS)
def test_sdpa_path_on_cpu_equals_the_reference(query_lens: list[int] | None, q_len: int) -> None:
    batch = 3 if query_lens is None else len(query_lens)
    query, key, value, meta = ragged_batch(batch, q_len, 4, 2, 16, query_lens=query_lens, seed=1)
    out, weights = cuda_ragged_attention(
        torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta
    )
    ref, _ = sdpa_ragged_attention(torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta)
    assert weights is None and out.shape == (batch, q_len, 4, 16)
    assert torch.equal(out, ref)  # same device-agnostic function on CPU
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(("query_lens", "q_len"), [*LAYOUTS, pytest.param([3, 1], 4, id="kv-shorter-than-Q")])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_flash_glue_matches_the_reference_on_real_rows(
    query_lens: list[int] | None, q_len: int, kv_heads: int
) -> None:
    batch = 4 if query_lens is None else len(query_lens)
    prefix = 0 if query_lens == [3, 1] else 12  # kv < Q: padding rows see no key at all
    query, key, value, meta = ragged_batch(
        batch, q_len, 4, kv_heads, 8, query_lens=query_lens, max_prefix=prefix, seed=2
    )
    out = ragged_flash(query, key, value, meta, 8**-0.5, emulated_flash_with_kvcache)  # [B, Q, Hq, D]
    ref = reference(query, key, value, meta)
    for got, want in zip(real_rows(out, meta), real_rows(ref, meta), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()  # padding rows are finite (zeros where they see no key)


def test_rotation_indices_are_inverse_permutations() -> None:
    lens = torch.tensor([4, 1, 2, 3])
    left, back = rotation_index(lens, 4, to_left=True), rotation_index(lens, 4, to_left=False)
    rows = torch.arange(4).expand(4, 4)
    assert torch.equal(left.gather(1, back), rows)  # back then left = identity
    assert torch.equal(left[0], torch.arange(4))  # a full request is not moved
    assert left[1].tolist() == [1, 2, 3, 0]  # one real row ends up last
    assert sorted(left[2].tolist()) == [0, 1, 2, 3]


def test_flash_path_is_chosen_from_shapes_and_dtypes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    query, key, _, _ = ragged_batch(1, 2, 2, 1, 8)
    if not cuda_attention.flash_attn_installed():
        assert flash_unsupported_reason(query, key) == "flash_attn is not installed"
    monkeypatch.setattr(cuda_attention, "flash_attn_installed", lambda: True)
    assert "not cuda" in str(flash_unsupported_reason(query, key))


def test_flash_path_refuses_clearly_where_it_cannot_run() -> None:
    query, key, value, meta = ragged_batch(2, 3, 2, 1, 8)
    with pytest.raises(ValueError, match="flash attention path cannot run here"):
        flash_ragged_attention(torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta)


def test_missing_metadata_is_a_clear_error() -> None:
    query, key, value, _ = ragged_batch(1, 2, 2, 1, 8)
    with pytest.raises(ValueError, match="spec_attn_metadata=RaggedAttentionMetadata"):
        cuda_ragged_attention(torch.nn.Identity(), query, key, value, None)


def test_backend_attention_choices() -> None:
    assert CudaBackend().attention_function() is cuda_ragged_attention
    assert CudaBackend(attention="sdpa").attention_function() is cuda_attention.cuda_sdpa_attention
    assert CudaBackend(attention="flash").attention_function() is flash_ragged_attention
    with pytest.raises(ValueError, match="attention must be one of"):
        CudaBackend(attention="xformers")


def _step(runner: Any, seqs: list[list[int]], last_only: bool) -> torch.Tensor:
    """One forward of ``runner`` feeding ``seqs[b]`` to slot ``b``."""
    from spec_backend.step import build_step_batch

    lens = [len(s) for s in seqs]
    tokens = torch.tensor([s + [0] * (max(lens) - len(s)) for s in seqs])  # [B, Q]
    batch = build_step_batch(0, tokens, lens, runner.cache.lengths[: len(seqs)])
    return runner.forward(batch, last_only).logits


def test_registered_in_transformers_it_matches_the_reference_model(tmp_path: object) -> None:
    """A tiny Llama run through AttentionInterface['cuda'] (SDPA path on CPU) == the reference."""
    from spec_backend.backends.reference import ReferenceBackend
    from spec_backend.runtime.kv_cache import RaggedKVCache, kv_layout
    from spec_backend.runtime.loader import load_model, register_attention
    from spec_backend.runtime.runner import ModelRunner
    from spec_backend.runtime.sources import resolve_model
    from spec_backend.tools.tiny import make_tiny_model

    path = make_tiny_model(str(tmp_path), vocab_size=64)
    logits = []
    for backend in (ReferenceBackend(), CudaBackend()):
        model = load_model(
            resolve_model(path), register_attention(backend), torch.float32, torch.device("cpu")
        )
        cache = RaggedKVCache(kv_layout(model.config, torch.float32, torch.device("cpu")), 64, 2)
        runner = ModelRunner(model, cache)
        for _ in range(2):
            runner.cache.add_slot()

        prefill = _step(runner, [[1, 2, 3, 4, 5], [6, 7]], last_only=True)  # [2, V]
        verify = _step(runner, [[8, 9, 10], [11]], last_only=False)  # [4, V]: ragged K+1
        logits.append(torch.cat([prefill, verify]))
    torch.testing.assert_close(logits[0], logits[1], atol=1e-6, rtol=1e-6)


def test_sdpa_masks_never_cross_a_graph_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mask cached eagerly (the warm-up) is rebuilt inside a capture, where its construction is
    recorded; a mask built inside a capture (no values until a replay) is rebuilt outside it. The
    capture is simulated: only the module's ``capturing()`` answer changes."""
    query, key, value, meta = ragged_batch(2, 3, 4, 2, 16, seed=3)

    def masks() -> list[int]:
        cuda_attention.cuda_sdpa_attention(
            torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta
        )
        return [id(m) for m in meta.mask_cache.values()]

    eager = masks()
    assert masks() == eager  # eager calls share the step's mask
    monkeypatch.setattr(cuda_attention, "capturing", lambda: True)
    cuda_attention.begin_capture()
    captured = masks()
    assert len(captured) == 1 and captured != eager  # rebuilt inside the capture
    assert masks() == captured  # every layer of the captured forward shares it
    cuda_attention.begin_capture()  # the next capture (another size) records its own
    second = masks()
    assert second != captured
    monkeypatch.setattr(cuda_attention, "capturing", lambda: False)
    assert masks() != second  # outside the capture: not the graph's mask


@pytest.mark.parametrize(("query_lens", "q_len"), LAYOUTS)
@pytest.mark.parametrize("window", [1, 4, 9])
def test_flash_glue_slides_the_window_like_the_reference(
    query_lens: list[int] | None, q_len: int, window: int
) -> None:
    """A sliding window reaches flash-attn as window_size=(W - 1, 0): the real rows (drafted positions of
    a verify step included) see the reference's windowed keys."""
    batch = 4 if query_lens is None else len(query_lens)
    query, key, value, meta = ragged_batch(batch, q_len, 4, 2, 8, query_lens=query_lens, seed=5)
    out = ragged_flash(query, key, value, meta, 8**-0.5, emulated_flash_with_kvcache, window)
    ref = reference(query, key, value, meta, window)
    for got, want in zip(real_rows(out, meta), real_rows(ref, meta), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    full = reference(query, key, value, meta)
    assert not torch.allclose(ref, full)  # the window changes the answer on these lengths


def test_sinks_soft_caps_and_latent_values_take_the_sdpa_path() -> None:
    """Layers flash-attn's kernel cannot compute (sinks, a soft cap, values of another head dim) are
    named by flash_layer_reason and computed by the reference path, windowed or not."""
    from spec_backend.backends.attention import LayerAttention

    query, key, value, meta = ragged_batch(2, 3, 4, 2, 16, seed=6)
    assert flash_layer_reason(16, value, LayerAttention(window=4)) is None
    assert (
        flash_layer_reason(16, value, LayerAttention(sinks=torch.zeros(4))) == "the layer has attention sinks"
    )
    assert flash_layer_reason(16, value, LayerAttention(softcap=30.0)) == "the layer has a logit soft cap"
    assert flash_layer_reason(16, value[..., :8]) == "value head dim 8 differs from the query's 16"
    kwargs: dict[str, Any] = {
        "spec_attn_metadata": meta,
        "s_aux": torch.tensor([0.5, -1.0, 0.0, 2.0]),
        "sliding_window": 3,
    }
    out, _ = cuda_ragged_attention(torch.nn.Identity(), query, key, value, None, **kwargs)
    ref, _ = sdpa_ragged_attention(torch.nn.Identity(), query, key, value, None, **kwargs)
    assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="flash attention path cannot run here"):
        flash_ragged_attention(torch.nn.Identity(), query, key, value, None, **kwargs)


def test_token_trees_take_the_sdpa_path_and_flash_refuses_them() -> None:
    """A tree step's ancestor mask: the auto path routes it to SDPA (the reference's mask), the flash
    path alone refuses it by name rather than masking causally."""
    from dataclasses import replace

    query, key, value, meta = ragged_batch(2, 4, 4, 2, 16, query_lens=[4, 3], seed=3)
    tree = torch.zeros((2, 4, 4), dtype=torch.bool)
    for b, parents in enumerate(([-1, -1, 0], [-1, 0])):  # columns 1.. are nodes; column 0 the root
        tree[b, 0, 0] = True
        for i, p in enumerate(parents):
            tree[b, i + 1] = tree[b, p + 1]
            tree[b, i + 1, i + 1] = True
    depths = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 0]])
    meta = replace(meta, tree=tree, tree_depths=depths, mask_cache={})
    out, _ = cuda_ragged_attention(torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta)
    ref, _ = sdpa_ragged_attention(torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta)
    causal, _ = sdpa_ragged_attention(
        torch.nn.Identity(),
        query,
        key,
        value,
        None,
        spec_attn_metadata=replace(meta, tree=None, mask_cache={}),
    )
    assert torch.equal(out, ref) and not torch.equal(out, causal)
    with pytest.raises(ValueError, match="token tree's ancestor mask"):
        flash_ragged_attention(torch.nn.Identity(), query, key, value, None, spec_attn_metadata=meta)
