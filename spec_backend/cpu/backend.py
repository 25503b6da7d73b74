"""The cpu backend: the reference backend's semantics with this project's native CPU kernels.

It is available where the native kernels (``native.py``: ``csrc/*.cpp``, built once per machine with
``-march=native``) build and run; ``load_backend()`` then prefers it to ``reference``. What it changes,
all in ``prepare_model`` and the attention function (the conformance suite checks it against the
reference):

* GGUF Q4_1 linear layers run packed (``int4_linear``: int8 activations with the AVX512-VNNI kernel,
  else bfloat16 with torch's int4 kernel; lossy, logged) unless ``SPEC_BACKEND_INT4=0``;
  ``ModelOptions.quantization`` "int4" / "int8" quantizes every linear layer (opt-in, lossy).
* a packed model's decoder layers (and an EAGLE-3 head's first layer) run as one native call each, and
  its attention rows are computed independently of the batch (``attention``), so speculative greedy
  output still equals plain greedy output;
* few-row products (the vocabulary projection, float linear layers while a step verifies K+1
  positions) run as tall-skinny BLAS products (``vocab_projection``), and an LM head of GGUF Q8_0 blocks
  runs from its int8 codes (``q8_0_projection``; exact).
"""

from __future__ import annotations

import logging
import os

import torch

from spec_backend.backends.base import AttentionFn, Availability, ModelOptions
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.cpu.attention import cpu_ragged_attention, mark_batch_invariant
from spec_backend.cpu.int4_linear import install_int4_linears
from spec_backend.cpu.int8_linear import install_int8_linears
from spec_backend.cpu.native import native_kernel_error, native_op
from spec_backend.cpu.native_eagle3 import install_native_eagle3_layers
from spec_backend.cpu.native_layer import install_native_layers
from spec_backend.cpu.q8_0_projection import install_q8_0_projection
from spec_backend.cpu.vocab_projection import install_small_batch_linears, install_tall_skinny_projection

logger = logging.getLogger("spec_backend.backends")

#: ``SPEC_BACKEND_INT4=0`` keeps GGUF Q4_1 layers de-quantized to float32 (exact de-quantized numerics)
INT4_ENV = "SPEC_BACKEND_INT4"


class CpuBackend(ReferenceBackend):
    """The reference backend plus native CPU kernels and packed / quantized linear layers."""

    name = "cpu"
    supported_quantizations = ("int4", "int8")

    def probe(self) -> Availability:
        """Available once the native kernels are built (the first probe on a machine builds them, about
        15 s; later ones load the cached build) and answer; the note says which int4 kernel runs."""
        error = native_kernel_error()
        if error is not None:
            return Availability(False, f"the native CPU kernels do not build here: {error}")
        if native_op("attention_rows") is None:
            return Availability(False, "the native CPU kernels built but define no attention_rows op")
        vnni = native_op("q4_1_q8_mm") is not None
        return Availability(True, "int4 layers: AVX512-VNNI kernel" if vnni else "int4 layers: torch kernel")

    def attention_function(self) -> AttentionFn:
        return cpu_ragged_attention

    def prepare_model(self, model: torch.nn.Module, options: ModelOptions) -> None:
        """Packed or quantized linear layers, native layers, tall-skinny projections (module docstring)."""
        mode = options.quantization
        if mode == "int8":
            packed, what = install_int8_linears(model), "int8 (opt-in, lossy)"
        elif mode == "int4" or os.environ.get(INT4_ENV, "1") != "0":
            packed = install_int4_linears(model, quantize=mode == "int4")
            what = "int4 (opt-in, lossy)" if mode == "int4" else "GGUF Q4_1 packed as int4"
        else:
            packed, what = 0, ""
        if packed:
            _native_layers(model, packed, what)
        install_small_batch_linears(model)
        if install_q8_0_projection(model):
            logger.info("spec_backend: LM head runs from its GGUF Q8_0 blocks (exact: float32 activations)")
        install_tall_skinny_projection(model)


def _native_layers(model: torch.nn.Module, packed: int, what: str) -> None:
    """A packed model: batch-invariant attention rows (rounding amplifies tiny batch-dependent
    differences), decoder layers and an EAGLE-3 head's first layer as one native call each."""
    vnni = any(getattr(m, "kernel", "") == "vnni" for m in model.modules())
    logger.info(
        "spec_backend: %d linear layers run %s with %s activations; logits differ slightly from the "
        "float32 model",
        packed,
        what,
        "int8 (per 32 values, AVX512-VNNI kernel)" if vnni else "bfloat16",
    )
    native = install_native_layers(model)
    if native:
        logger.info("spec_backend: %d decoder layers run as one native call each", native)
    if install_native_eagle3_layers(model):
        logger.info("spec_backend: the EAGLE-3 head's first layer runs as one native call")
    mark_batch_invariant(model)


__all__ = ["INT4_ENV", "CpuBackend"]
