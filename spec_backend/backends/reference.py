"""The reference backend: pure torch on CPU. It is the specification the other backends must match."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from spec_backend.backends.attention import sdpa_ragged_attention
from spec_backend.backends.base import (
    AttentionFn,
    Availability,
    Backend,
    CapturePolicy,
    GraphFn,
    GraphOutput,
    GraphRunner,
    SamplerTuning,
    TokenLimits,
)
from spec_backend.backends.int4_linear import install_int4_linears
from spec_backend.backends.int8_linear import install_int8_linears
from spec_backend.backends.native_layer import install_native_layers
from spec_backend.backends.q8_0_projection import install_q8_0_projection
from spec_backend.backends.vocab_projection import (
    install_small_batch_linears,
    install_tall_skinny_projection,
)
from spec_backend.sampling.ops import SamplerOps

logger = logging.getLogger("spec_backend.backends")


class EagerGraphRunner(GraphRunner):
    """Runs the callable eagerly at the real size: 'capture' only records the planned sizes."""

    def capture(self, example_inputs: Mapping[str, torch.Tensor]) -> None:
        del example_inputs  # nothing to capture: eager execution

    def run(self, inputs: Mapping[str, torch.Tensor]) -> GraphOutput:
        return self.fn(**inputs)


class ReferenceBackend(Backend):
    """Pure-torch backend: eager graph runner, SDPA attention, torch sampler ops."""

    name = "reference"
    supported_quantizations = ("int4", "int8")
    device_type = "cpu"

    def probe(self) -> Availability:
        return Availability(True)

    def token_limits(self) -> TokenLimits:
        return TokenLimits(max_query_tokens_per_request=None)

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        return CapturePolicy(max_capture_size=512, graph_budget=None, enabled=False)

    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        return EagerGraphRunner(fn, capture_sizes)

    def attention_function(self) -> AttentionFn:
        return sdpa_ragged_attention

    def sampler_ops(self) -> SamplerOps:
        from spec_backend.sampling.torch_ops import TorchSamplerOps

        ops: SamplerOps = TorchSamplerOps()
        return ops

    def sampler_tuning(self) -> SamplerTuning:
        """Batches verified in groups of <= 2M logits (8 MiB float32): intermediates stay in cache."""
        return SamplerTuning(vocab_block=1024, max_grid=None, device_uniforms=True, group_elements=1 << 21)

    def prepare_model(self, model: torch.nn.Module) -> None:
        """Linear layers that are GGUF Q4_1 blocks run packed (``int4_linear``: a quarter-byte per weight
        instead of four, with our AVX512-VNNI kernel or torch's int4 kernel; logged, lossy as that module
        says);
        ``SPEC_BACKEND_INT4=0`` keeps every weight in float32 (exact de-quantized numerics). With
        ``LLM(quantization="int4" | "int8")`` every linear layer is quantized (lossy, opt-in). The other
        few-row products (the vocabulary projection, float linear layers while a step verifies K+1
        positions) run far faster on CPU BLAS as tall-skinny products (``vocab_projection``). An LM head made
        of GGUF Q8_0 blocks runs from its int8 codes with our kernel (``q8_0_projection``; exact)."""
        config: Any = model.config
        mode = getattr(config, "spec_quantization", None)
        if mode == "int8":
            packed, what = install_int8_linears(model), "int8 (opt-in, lossy)"
        elif mode == "int4" or os.environ.get("SPEC_BACKEND_INT4", "1") != "0":
            packed = install_int4_linears(model, quantize=mode == "int4")
            what = "int4 (opt-in, lossy)" if mode == "int4" else "GGUF Q4_1 packed as int4"
        else:
            packed, what = 0, ""
        if packed:  # rounding amplifies tiny batch-dependent differences: make attention rows invariant
            config.spec_batch_invariant = True
            vnni = any(getattr(m, "kernel", "") == "vnni" for m in model.modules())
            logger.info(
                "spec_backend: %d linear layers run %s with %s activations; logits differ slightly from "
                "the float32 model",
                packed,
                what,
                "int8 (per 32 values, AVX512-VNNI kernel)" if vnni else "bfloat16",
            )
            native = install_native_layers(model)
            if native:
                logger.info("spec_backend: %d decoder layers run as one native call each", native)
            _install_native_eagle3(model)
        install_small_batch_linears(model)
        if install_q8_0_projection(model):
            logger.info("spec_backend: LM head runs from its GGUF Q8_0 blocks (exact: float32 activations)")
        install_tall_skinny_projection(model)


def _install_native_eagle3(model: torch.nn.Module) -> None:
    """EAGLE-3 heads' first layers as one native call (imported here: it needs ``models.eagle3``)."""
    from spec_backend.backends.native_eagle3 import install_native_eagle3_layers

    if install_native_eagle3_layers(model):
        logger.info("spec_backend: the EAGLE-3 head's first layer runs as one native call")
