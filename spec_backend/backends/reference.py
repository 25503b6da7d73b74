"""The reference backend: pure torch on CPU, eager. It is the specification the other backends must match.

Nothing here depends on the CPU's instruction set, an environment variable or a compiler: attention is
SDPA over the engine's ragged cache (``attention.sdpa_ragged_attention``), the sampler runs the torch
ops, and ``prepare_model`` leaves the model as transformers loaded it. The fast CPU path (native
kernels, packed and quantized linear layers) is the ``cpu`` backend (``spec_backend.cpu``), checked
against this one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

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
from spec_backend.sampling.ops import SamplerOps


class EagerGraphRunner(GraphRunner):
    """Runs the callable eagerly at the real size: 'capture' only records the planned sizes."""

    def capture(self, example_inputs: Mapping[str, torch.Tensor], shared: Collection[str] = ()) -> None:
        del example_inputs, shared  # nothing to capture: eager execution

    def run(self, inputs: Mapping[str, torch.Tensor]) -> GraphOutput:
        return self.fn(**inputs)


class ReferenceBackend(Backend):
    """Pure-torch backend: eager graph runner, SDPA attention, torch sampler ops, no model preparation."""

    name = "reference"
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

    def default_dtype(self, loaded: torch.dtype) -> torch.dtype:
        """float32, or float64 for a float64 checkpoint: CPUs have no fast half-precision matmul."""
        return torch.float64 if loaded == torch.float64 else torch.float32
