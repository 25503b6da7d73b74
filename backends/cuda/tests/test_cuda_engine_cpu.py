"""End to end on CPU: the engine with the CUDA backend's parts (attention dispatch, the flash glue over an
emulated ``flash_attn_with_kvcache``, the triton attention, RMSNorm and gating kernels and the triton
sampler ops interpreted) gives the reference tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_testlib import emulated_flash_with_kvcache, tree_spec
from spec_backend_cuda import CudaBackend
from spec_backend_cuda.attention import cuda_sdpa_attention, flash_layer_reason, ragged_flash

from spec_backend.backends.attention import layer_attention, ragged_metadata
from spec_backend.backends.base import AttentionFn, Availability

PROMPTS = [[5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 3], [7, 1, 2, 7, 1], [11, 12, 13]]
NGRAM = {
    "adaptive_draft_length": False,
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 2,
    "prompt_lookup_min": 1,
}


class CpuEmulatedCuda(CudaBackend):
    """The CUDA backend with tensors on the CPU: SDPA attention path, interpreted triton sampler."""

    def device(self) -> torch.device:
        return torch.device("cpu")

    def probe(self) -> Availability:
        return Availability(True, "emulated on the CPU")  # the engine refuses unavailable backends


def _emulated_flash(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The dispatch of ``cuda_ragged_attention`` with the emulated kernel: layers flash cannot compute
    (``flash_layer_reason``) take the SDPA path, the rest the flash glue with the layer's window."""
    layer = layer_attention(kwargs)
    if flash_layer_reason(query.shape[-1], value, layer) is not None:
        return cuda_sdpa_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    meta = ragged_metadata(kwargs, module)
    return ragged_flash(query, key, value, meta, scale, emulated_flash_with_kvcache, layer.window), None


class CpuEmulatedCudaFlash(CpuEmulatedCuda):
    """As above, with the flash path's glue running over the emulated flash kernel."""

    name = "cuda-emulated-fa"  # not "flash": transformers reserves names containing it

    def attention_function(self) -> AttentionFn:
        return _emulated_flash


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CUDA GPU is present: compiled triton kernels cannot read these CPU tensors "
    "(test_gpu_engine.py runs the real backend there)",
)
def test_greedy_speculative_generation_matches_the_reference(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.tools.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    params = engine.SamplingParams(temperature=0.0, max_tokens=10)
    outputs = {}
    for name, backend in (
        ("reference", "reference"),
        # no GPU to capture on: the engine's captured-step path runs through the eager graph runner
        ("cuda-sdpa", CpuEmulatedCuda(enforce_eager=True)),
        ("cuda-flash-glue", CpuEmulatedCudaFlash(enforce_eager=True)),
        ("cuda-triton", CpuEmulatedCuda(attention="triton", enforce_eager=True)),
        ("cuda-fused", CpuEmulatedCuda(attention="triton", fused_kernels=True, enforce_eager=True)),
    ):
        llm = engine.LLM(model, speculative_config=NGRAM, backend=backend, log_stats_interval=None)
        outputs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
    assert outputs["cuda-sdpa"] == outputs["reference"]
    assert outputs["cuda-flash-glue"] == outputs["reference"]
    assert outputs["cuda-triton"] == outputs["reference"]
    assert outputs["cuda-fused"] == outputs["reference"]  # fused norms and MLPs, triton attention
    assert all(len(o) == 10 for o in outputs["reference"])


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CUDA GPU is present: compiled triton kernels cannot read these CPU tensors "
    "(test_gpu_engine.py runs the real backend there)",
)
@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])
@pytest.mark.parametrize("rings", [False, True])
def test_sliding_window_models_match_the_reference(tmp_path: Path, family: str, rings: bool) -> None:
    """Gemma 3 (sliding and global layers) and GPT-OSS (sliding layers with sinks): the CUDA backend's
    SDPA path and its flash glue (window_size over the emulated kernel; sinks routed to SDPA) give the
    reference's tokens, speculative, on prompts longer than the window. ``rings``: the windowed layers
    keep window rings (prefix caching off); the reference keeps every position."""
    pytest.importorskip("triton")
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.testing.fixtures.families import WINDOW, make_family_model

    model = make_family_model(tmp_path / family, family)
    assert max(len(p) for p in PROMPTS) > 2 * WINDOW
    params = engine.SamplingParams(temperature=0.0, max_tokens=10)
    outputs = {}
    for name, backend in (
        ("reference", "reference"),
        ("cuda-sdpa", CpuEmulatedCuda(enforce_eager=True)),
        ("cuda-flash-glue", CpuEmulatedCudaFlash(enforce_eager=True)),
        ("cuda-triton", CpuEmulatedCuda(attention="triton", enforce_eager=True)),
    ):
        prefix = name == "reference" or not rings
        llm = engine.LLM(
            model, speculative_config=NGRAM, backend=backend, log_stats_interval=None,
            enable_prefix_caching=prefix,
        )  # fmt: skip
        outputs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
    assert outputs["cuda-sdpa"] == outputs["reference"]
    assert outputs["cuda-flash-glue"] == outputs["reference"]
    assert outputs["cuda-triton"] == outputs["reference"]


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CUDA GPU is present: compiled triton kernels cannot read these CPU tensors "
    "(test_gpu_drafters.py runs DSpark on the real backend there)",
)
def test_dspark_greedy_output_matches_the_reference(tmp_path: Path) -> None:
    """DSpark (Markov head, confidence-chosen verify lengths, ragged and 0 included) over the CUDA
    backend's attention and sampler ops gives the reference's tokens, and the plain output."""
    pytest.importorskip("triton")
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark
    from spec_backend.tools.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    spec = {"model": write_dspark(tmp_path / "dspark", model, block_size=4), "num_speculative_tokens": 4}
    params = engine.SamplingParams(temperature=0.0, max_tokens=10)
    plain = engine.LLM(model, backend="reference", log_stats_interval=None).generate(PROMPTS, params)
    outputs = {}
    for name, backend in (
        ("reference", "reference"),
        ("cuda-sdpa", CpuEmulatedCuda(enforce_eager=True)),
        ("cuda-flash-glue", CpuEmulatedCudaFlash(enforce_eager=True)),
    ):
        llm = engine.LLM(model, speculative_config=spec, backend=backend, log_stats_interval=None)
        outputs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
        assert llm.metrics.total.num_draft_tokens > 0 and llm.metrics.total.verify_lengths
    assert outputs["reference"] == [list(o.outputs[0].token_ids) for o in plain]
    assert outputs["cuda-sdpa"] == outputs["reference"]
    assert outputs["cuda-flash-glue"] == outputs["reference"]


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CUDA GPU is present: compiled triton kernels cannot read these CPU tensors "
    "(test_gpu_drafters.py runs trees on the real backend there)",
)
@pytest.mark.parametrize("method", ["dspark", "eagle3", "eagle3-dynamic"])
def test_token_trees_match_the_reference(tmp_path: Path, method: str) -> None:
    """A branching tree drafted by DSpark (one block forward) or EAGLE-3 (level by level under the draft
    head's own tree attention; static, and EAGLE-2's dynamic tree), verified through the CUDA backend's
    attention (tree steps take SDPA) and sampler ops: the reference's tokens, which are the plain output."""
    pytest.importorskip("triton")
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.tools.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    spec = tree_spec(method, model, tmp_path, 2, "[(0,), (1,), (0, 0), (1, 0), (0, 1)]", 5)
    params = engine.SamplingParams(temperature=0.0, max_tokens=10)
    plain = engine.LLM(model, backend="reference", log_stats_interval=None).generate(PROMPTS, params)
    outputs = {}
    for name, backend in (
        ("reference", "reference"),
        ("cuda", CpuEmulatedCuda(enforce_eager=True)),
        ("cuda-triton", CpuEmulatedCuda(attention="triton", enforce_eager=True)),  # trees on SDPA
        ("cuda-fused", CpuEmulatedCuda(fused_kernels=True, enforce_eager=True)),  # the heads' too
    ):
        llm = engine.LLM(model, speculative_config=spec, backend=backend, log_stats_interval=None)
        outputs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params)]
        assert llm.engine.tree is not None and llm.metrics.total.num_draft_tokens > 0
    assert outputs["reference"] == [list(o.outputs[0].token_ids) for o in plain]
    assert outputs["cuda"] == outputs["reference"]
    assert outputs["cuda-triton"] == outputs["reference"]
    assert outputs["cuda-fused"] == outputs["reference"]
