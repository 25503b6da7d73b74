"""The triton attention kernel on CPU (``TRITON_INTERPRET=1``, set by the root conftest) against the
float32 reference: layouts, grouped heads, head dims off the tile, windows, soft caps, sinks, values of
another head dim, keys past each request's length kept out, and lengths updated in place between
replays of a strict simulated graph. bfloat16 is checked on a GPU only (``test_gpu_attention.py``): the
triton 3.9 interpreter's ``tl.dot`` misreads bfloat16 operands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_testlib import ragged_batch, real_rows, reference

pytest.importorskip("triton")

from spec_backend_cuda import CudaBackend
from spec_backend_cuda.attention import ATTENTION_PATHS, triton_chain_attention
from spec_backend_cuda.triton_attention import (
    SHARED_MEMORY_BUDGET,
    triton_ragged_attention,
    triton_unsupported_reason,
)

from spec_backend.backends.attention import sdpa_ragged_attention
from spec_backend.backends.graph_common import SimulatedGraphDriver
from spec_backend.step import RaggedAttentionMetadata

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CUDA GPU is present: compiled triton kernels cannot read these CPU tensors "
    "(test_gpu_attention.py and test_gpu_engine.py run the kernel there)",
)

#: float32 runs ``tl.dot`` in IEEE precision: only summation order differs from the reference
TOLERANCE = {torch.float32: 2e-6, torch.float16: 2e-3}
LAYOUTS = [
    pytest.param(None, 5, 3, id="random-ragged"),
    pytest.param([5, 5], 5, 2, id="uniform-K+1"),
    pytest.param([1, 1], 1, 2, id="decode-Q1"),
    pytest.param([19, 1, 3], 19, 3, id="prefill-mixed"),  # 2 x 19 rows: two row blocks of a program
]


def _call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    return triton_ragged_attention(torch.nn.Identity(), query, key, value, None, **kwargs)[0]


def _explicit_reference(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any
) -> torch.Tensor:
    args = (query.float(), key.float(), value.float(), None)
    return sdpa_ragged_attention(torch.nn.Identity(), *args, **kwargs)[0]


def _assert_rows_close(
    out: torch.Tensor, ref: torch.Tensor, meta: RaggedAttentionMetadata, tol: float
) -> None:
    for got, want in zip(real_rows(out.float(), meta), real_rows(ref, meta), strict=True):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("query_lens", "q_len", "batch"), LAYOUTS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 2, 16), (6, 2, 24), (3, 3, 40)])
@pytest.mark.parametrize("window", [None, 1, 7])
def test_the_kernel_matches_the_reference(
    dtype: torch.dtype,
    query_lens: list[int] | None,
    q_len: int,
    batch: int,
    heads: int,
    kv_heads: int,
    dim: int,
    window: int | None,
) -> None:
    """Groups of 2, 3 and 1 query heads per kv head; head dims 16, 24 and 40 (the last two off the
    kernel's power-of-two tile); prefixes up to 80 keys (two key blocks)."""
    query, key, value, meta = ragged_batch(
        batch, q_len, heads, kv_heads, dim, dtype, max_prefix=80, seed=3, query_lens=query_lens
    )
    out = _call(query, key, value, spec_attn_metadata=meta, sliding_window=window)
    assert out.shape == (batch, q_len, heads, dim) and out.dtype == dtype and out.is_contiguous()
    _assert_rows_close(out, reference(query, key, value, meta, window), meta, TOLERANCE[dtype])


@pytest.mark.parametrize("window", [None, 5])
def test_soft_caps_sinks_and_latent_values_match_the_explicit_reference(window: int | None) -> None:
    """Gemma 2's soft cap, GPT-OSS's sinks (one more softmax column per head) and values of their own
    head dim (multi-head latent attention), against the reference's explicit path."""
    query, key, _, meta = ragged_batch(3, 4, 4, 2, 32, max_prefix=70, seed=5)
    value = torch.randn(3, 2, key.shape[2], 16, generator=torch.Generator().manual_seed(6))  # Dv = 16
    sinks = torch.tensor([-1.0, 0.5, 3.0, 0.0])
    for extra in ({"softcap": 2.5}, {"s_aux": sinks}, {"softcap": 4.0, "s_aux": sinks}, {}):
        kwargs: dict[str, Any] = {"spec_attn_metadata": meta, "sliding_window": window, **extra}
        out = _call(query, key, value, **kwargs)
        assert out.shape == (3, 4, 4, 16)
        _assert_rows_close(out, _explicit_reference(query, key, value, **kwargs), meta, 2e-6)


def test_keys_past_each_requests_length_do_not_reach_the_output() -> None:
    """NaN in every cache position at or past ``kv_lens[b]``: the kernel's output is unchanged (its loads
    stop at each request's length), where the masked SDPA over the whole view turns NaN (negative control:
    those positions are inside the view it reads)."""
    query, key, value, meta = ragged_batch(3, 5, 4, 2, 16, max_prefix=60, seed=7)
    clean = _call(query, key, value, spec_attn_metadata=meta)
    poisoned_k, poisoned_v = key.clone(), value.clone()
    for b, kv in enumerate(meta.kv_lens.tolist()):
        poisoned_k[b, :, kv:] = float("nan")
        poisoned_v[b, :, kv:] = float("nan")
    assert int(meta.kv_lens.min()) < key.shape[2]  # some request has positions past its length
    assert torch.equal(_call(query, poisoned_k, poisoned_v, spec_attn_metadata=meta), clean)
    sdpa = sdpa_ragged_attention(
        torch.nn.Identity(), query, poisoned_k, poisoned_v, None, spec_attn_metadata=meta
    )[0]
    assert not torch.isfinite(sdpa).all()


def test_a_request_without_keys_is_written_as_zeros() -> None:
    """A padded request of a captured batch (no query, no key): zeros, not a softmax over nothing."""
    query, key, value, meta = ragged_batch(2, 3, 4, 2, 16, query_lens=[3, 3], seed=8)
    meta.query_lens[1] = 0
    meta.kv_lens[1] = 0
    out = _call(query, key, value, spec_attn_metadata=meta)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    ref = reference(
        query[:1], key[:1], value[:1], RaggedAttentionMetadata(meta.query_lens[:1], meta.kv_lens[:1])
    )
    torch.testing.assert_close(out[0], ref[0], atol=2e-6, rtol=2e-6)


def test_lengths_given_as_strided_views_are_read_with_their_strides() -> None:
    """Lengths that are columns of one ``[B, 2]`` buffer (stride 2): each request reads its own."""
    query, key, value, meta = ragged_batch(3, 4, 4, 2, 16, max_prefix=40, seed=12)
    both = torch.stack([meta.query_lens, meta.kv_lens], dim=1)  # [B, 2]
    strided = RaggedAttentionMetadata(both[:, 0], both[:, 1])
    assert strided.kv_lens.stride(0) == 2
    out = _call(query, key, value, spec_attn_metadata=strided)
    _assert_rows_close(out, reference(query, key, value, meta), meta, 2e-6)


def test_lengths_updated_in_place_replay_under_a_strict_graph_driver() -> None:
    """The kernel reads the lengths on the device: a strict simulated graph (which refuses host reads at
    capture and replay) replays it with new lengths written in place, as a CUDA graph would."""
    query, key, value, meta = ragged_batch(4, 4, 4, 2, 16, max_prefix=50, seed=9)

    def call() -> torch.Tensor:
        return _call(query, key, value, spec_attn_metadata=meta)

    graph, out = SimulatedGraphDriver(strict=True).capture(call, None)
    for seed in range(3):
        gen = torch.Generator().manual_seed(100 + seed)
        q_lens = torch.randint(1, 5, (4,), generator=gen)
        meta.query_lens.copy_(q_lens)
        meta.kv_lens.copy_(
            torch.minimum(q_lens + torch.randint(0, 50, (4,), generator=gen), torch.tensor(key.shape[2]))
        )
        query.copy_(torch.randn(query.shape, generator=gen))
        graph.replay()
        _assert_rows_close(out, reference(query, key, value, meta), meta, 2e-6)


def test_calls_it_cannot_compute_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    query, key, value, meta = ragged_batch(2, 3, 4, 2, 16, seed=10)
    tree = RaggedAttentionMetadata(meta.query_lens, meta.kv_lens, tree=torch.ones(2, 3, 3, dtype=torch.bool))
    cases: list[tuple[dict[str, Any], tuple[torch.Tensor, ...], str]] = [
        ({"spec_attn_metadata": tree}, (query, key, value), "token tree"),
        ({"spec_attn_metadata": meta}, (query, key.half(), value), "dtypes"),
        ({"spec_attn_metadata": meta}, (query.double(), key.double(), value.double()), "dtypes"),
        ({"spec_attn_metadata": meta}, (query[:, :3], key, value), "do not group"),
    ]
    for kwargs, tensors, words in cases:
        with pytest.raises(ValueError, match=f"triton attention path cannot run here: .*{words}"):
            _call(*tensors, **kwargs)
    with pytest.raises(ValueError, match="dropout"):
        triton_ragged_attention(
            torch.nn.Identity(), query, key, value, None, 0.1, 0.1, spec_attn_metadata=meta
        )
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "tensors are on cpu" in str(triton_unsupported_reason(query, key, value, meta))


def test_the_triton_path_routes_token_trees_to_sdpa() -> None:
    """``CudaBackend(attention="triton")``: chains through the kernel, a tree's ancestor mask on SDPA."""
    assert CudaBackend(attention="triton").attention_function() is triton_chain_attention
    assert ATTENTION_PATHS["triton"] is triton_chain_attention
    query, key, value, meta = ragged_batch(2, 3, 4, 2, 16, query_lens=[3, 3], seed=11)
    parents = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).expand(2, 3, 3)
    tree = RaggedAttentionMetadata(
        meta.query_lens, meta.kv_lens, tree=parents.contiguous(), tree_depths=torch.tensor([[0, 1, 1]] * 2)
    )
    args = (torch.nn.Identity(), query, key, value, None)
    routed = triton_chain_attention(*args, spec_attn_metadata=tree)[0]
    assert torch.equal(routed, sdpa_ragged_attention(*args, spec_attn_metadata=tree)[0])
    chain = triton_chain_attention(*args, spec_attn_metadata=meta)[0]
    assert torch.equal(chain, _call(query, key, value, spec_attn_metadata=meta))


#: (dtype, rows, head dim, value head dim): a SmolLM2 decode step (3 heads a group x 5 tokens), a 1B
#: model's verify step (4 x 9), a prefill block of the widest heads, latent attention's value dims
COMPILED = [
    ("float16", 15, 64, 64),
    ("bfloat16", 36, 128, 128),
    ("bfloat16", 512, 256, 256),
    ("float32", 36, 128, 128),
    ("float32", 512, 256, 256),
    ("bfloat16", 8, 192, 128),
]


def _compiled(cases: list[list[Any]]) -> list[dict[str, Any]]:
    script = Path(__file__).with_name("compile_triton_attention.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(cases)], capture_output=True, text=True, env=env, timeout=600
    )
    if "ptxas" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("triton's NVIDIA compiler (ptxas) is not bundled with this triton")
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_kernel_compiles_for_ampere_and_hopper_within_shared_memory() -> None:
    """The interpreter runs what a GPU would refuse: the kernel is compiled here (triton's bundled ptxas,
    no GPU) for compute capability 9.0 with every branch on (and, for two shapes, none), and for 8.0 at
    the widest float32 tiles, at the tiles ``launch_config`` picks, ints typed as a launch types them;
    each build's shared memory fits ``SHARED_MEMORY_BUDGET`` (the 99 KiB of an 8.6/8.9 GPU). Negative
    control: float32 at 64 x 64 tiles, three stages deep, needs more and is caught."""
    cases = [[*shape, 90, None, True] for shape in COMPILED] + [
        [*shape, 90, None, False] for shape in COMPILED[:2]
    ]
    cases.append([*COMPILED[4], 80, None, True])  # the most shared memory, on Ampere
    cases.append(["float32", 64, 128, 128, 80, [64, 64, 3], True])
    results = _compiled(cases)
    assert [r["case"] for r in results] == cases
    for result in results[:-1]:
        assert "error" not in result, result
        assert result["shared"] <= SHARED_MEMORY_BUDGET, result
    assert results[-1].get("shared", 0) > SHARED_MEMORY_BUDGET, results[-1]


_WIDE_SLOTS = """
import torch
from spec_backend_cuda.triton_attention import triton_ragged_attention
from spec_backend.step import RaggedAttentionMetadata
stride = 2**30 + 4096  # an int32 stride whose multiple by the slot index passes 2**31
keys = torch.empty(2 * stride + 256, dtype=torch.float16).as_strided((3, 1, 16, 16), (stride, 256, 16, 1))
gen = torch.Generator().manual_seed(0)
for slot in range(3):
    keys[slot].copy_(torch.randn(1, 16, 16, generator=gen).half())
query, value = torch.randn(3, 2, 1, 16, generator=gen).half(), torch.randn(3, 1, 16, 16, generator=gen).half()
meta = RaggedAttentionMetadata(torch.tensor([1, 1, 1]), torch.tensor([16, 16, 16]))
def attend(k):
    return triton_ragged_attention(torch.nn.Identity(), query, k, value, None, spec_attn_metadata=meta)[0]
print(torch.equal(attend(keys), attend(keys.contiguous())))
"""


def test_slot_offsets_past_two_to_the_31_are_64_bit() -> None:
    """A cache whose slot stride fits int32 but whose last slot starts past element 2^31 (a large model's
    long, wide cache): the kernel's offsets are 64-bit and read the right keys (with 32-bit offsets the
    address wraps; run in its own process, as a wrapped read may crash it). The storage is reserved,
    never touched past the three slots, so it costs little memory."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _WIDE_SLOTS], capture_output=True, text=True, env=env, timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "True", (done.returncode, done.stderr[-2000:])
