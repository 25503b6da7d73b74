"""GPU tier: the embedded engine on the CUDA backend — greedy speculative output equals greedy plain
output token for token, and equals the CPU reference backend in float32.

The default ``CudaBackend()`` captures the engine's decode step in CUDA graphs; the graph runner itself is
covered by test_gpu_graphs.py, every drafter with graphs by test_gpu_drafters.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from spec_backend_cuda import CudaBackend

pytestmark = pytest.mark.cuda
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6],
    [40, 41, 42],
    [11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13],
    [90, 3, 90, 3, 90],
]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("transformers")
    from spec_backend.tools.tiny import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("llama"),
        "llama",
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def _generate(model_dir: str, backend: object, dtype: str, speculate: bool) -> list[list[int]]:
    from spec_backend.engine import LLM, SamplingParams

    llm = LLM(model_dir, speculative_config=NGRAM, backend=backend, dtype=dtype, log_stats_interval=None)  # type: ignore[arg-type]
    llm.set_speculation(speculate)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24))
    assert all(o.outputs[0].finish_reason != "error" for o in outs), [o.outputs[0].error for o in outs]
    return [list(o.outputs[0].token_ids) for o in outs]


def test_greedy_speculative_equals_plain_float32(model_dir: str) -> None:
    plain = _generate(model_dir, CudaBackend(), "float32", speculate=False)
    spec = _generate(model_dir, CudaBackend(), "float32", speculate=True)
    assert spec == plain
    from spec_backend.backends.reference import ReferenceBackend

    assert _generate(model_dir, ReferenceBackend(), "float32", speculate=False) == plain


def _backend(path: str) -> CudaBackend:
    """``auto``, ``sdpa``, ``triton``, each with ``+fused`` (``fused_kernels=True``) or not."""
    return CudaBackend(attention=path.removesuffix("+fused"), fused_kernels=path.endswith("+fused"))


@pytest.mark.parametrize("path", ["triton", "triton+fused"])
def test_triton_kernels_greedy_speculative_equals_plain_float32(model_dir: str, path: str) -> None:
    """The triton attention (and the fused RMSNorm and gating kernels) compiled: float32 greedy
    speculative decoding gives plain decoding's tokens on the same backend."""
    plain = _generate(model_dir, _backend(path), "float32", speculate=False)
    assert _generate(model_dir, _backend(path), "float32", speculate=True) == plain


@pytest.mark.parametrize("attention", ["auto", "sdpa", "triton", "triton+fused"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_runs_on_both_attention_paths(model_dir: str, attention: str, dtype: str) -> None:
    """Half precision: speculative and plain greedy agree on each request's first two tokens (numerics
    of Q=1 and Q=K+1 kernels differ in the last bits, so later near-ties may diverge)."""
    plain = _generate(model_dir, _backend(attention), dtype, speculate=False)
    spec = _generate(model_dir, _backend(attention), dtype, speculate=True)
    assert all(len(o) == 24 for o in plain + spec)
    assert [o[:2] for o in spec] == [o[:2] for o in plain]


def test_flash_path_is_used_for_half_precision_when_installed(model_dir: str) -> None:
    from spec_backend_cuda import attention as cuda_attention

    if not cuda_attention.flash_attn_installed():
        pytest.skip("flash_attn is not installed")
    calls: list[int] = []
    original = cuda_attention.ragged_flash

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    cuda_attention.ragged_flash = counting  # type: ignore[assignment]
    try:
        _generate(model_dir, CudaBackend(), "float16", speculate=True)
    finally:
        cuda_attention.ragged_flash = original
    assert calls


def test_async_scheduling_gives_the_synchronous_tokens_with_graphs(model_dir: str) -> None:
    """On by default on CUDA (``launches_async``): plain steps launched ahead over CUDA graphs give the
    synchronous engine's greedy and seeded sampled tokens; 3 slots for 4 prompts: an admission drains."""
    from spec_backend.engine import LLM, SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=24), SamplingParams(temperature=0.9, seed=5)]
    outs = {}
    for setting in (None, False):
        llm = LLM(model_dir, backend=CudaBackend(), dtype="float32", max_num_seqs=3, async_scheduling=setting)
        assert (llm.engine.lookahead is not None) is (setting is None) and llm.engine.captured is not None
        done = llm.generate(PROMPTS, params * 2)
        outs[setting] = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in done]
    assert outs[None] == outs[False]
    assert all(reason != "error" for _, reason in outs[None])


@pytest.mark.parametrize("method", ["ngram_gpu", "draft_model", "eagle3", "medusa"])
def test_speculative_steps_launched_ahead_give_the_synchronous_tokens(
    model_dir: str, method: str, tmp_path: Path
) -> None:
    """``ngram_gpu``, a draft model (the target itself), an EAGLE-3 or a Medusa head, K drafts every step:
    the verify steps launch before the host lands the step before them (``engine/spec_ahead.py``, over
    CUDA graphs and the device's lengths) and give the synchronous engine's greedy and seeded sampled
    tokens. (A model's catch-up ahead feeds more rows than the synchronous one: on a GPU a near-tie could
    draft another token, which changes sampled tokens, never greedy ones: greedy only there.)"""
    from spec_backend.engine import LLM, SamplingParams
    from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3, write_medusa

    spec: dict[str, object] = {"method": method, "num_speculative_tokens": 3, "adaptive_draft_length": False}
    spec |= {"prompt_lookup_min": 1} if method == "ngram_gpu" else {"model": model_dir}
    if method == "eagle3":
        spec["model"] = write_eagle3(tmp_path / "eagle3", model_dir, "speculators", aux_ids=[0, 1, 1])
    if method == "medusa":  # the tiny model's hidden size and vocabulary
        spec["model"] = write_medusa(tmp_path / "medusa", 32, 128, 3, "vllm")
    params = [
        SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=5, max_tokens=40, ignore_eos=True),
    ]
    if method in ("draft_model", "eagle3"):
        params[1] = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    outs, ahead = {}, 0
    for setting in (None, False):
        llm = LLM(model_dir, backend=CudaBackend(), dtype="float32", max_num_seqs=4,
                  async_scheduling=setting, speculative_config=spec)  # fmt: skip
        done = llm.generate(PROMPTS, params * 2)
        outs[setting] = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in done]
        if llm.engine.lookahead is not None:
            ahead = llm.engine.lookahead.speculative_launches
    assert outs[None] == outs[False] and ahead > 0
    assert all(reason == "length" for _, reason in outs[None])
