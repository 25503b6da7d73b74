"""The cpu backend: the reference backend's semantics with this project's native CPU kernels.

It is available where the native kernels (``native.py``: ``csrc/*.cpp``, built once per machine for the
fastest ISA variant this CPU runs, ``isa.py``; ``SPEC_BACKEND_ISA`` caps it) build and run;
``load_backend()`` then prefers it to ``reference``. What it changes, all in ``prepare_model`` and the
attention function (the conformance suite checks it against the reference):

* GGUF Q4_1 linear layers run the path measured fastest on this machine when the model loads
  (``fast_path``: our int8-activation kernel with native decoder layers, torch's int4 kernel with
  bfloat16 activations, or the de-quantized float32 weights; the packed ones are lossy; logged with the
  times) unless ``SPEC_BACKEND_INT4=0``; ``ModelOptions.quantization`` "int4" / "int8" quantizes every
  linear layer (opt-in, lossy). A GGUF model's Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q5_0 and Q5_1 layers are
  read from the file (``ModelOptions.gguf_file``, ``kquant_linear``) and take part in the same
  measurement: Q4_K and Q4_0 as Q4_1, the others on an exact float32-activation kernel on the native path.
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
from typing import Any

import torch

from spec_backend.backends.base import AttentionFn, Availability, ModelOptions
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.cpu.attention import cpu_ragged_attention, mark_batch_invariant
from spec_backend.cpu.fast_path import Decision, decide, default_model_decision, describe, pack, pinned_path
from spec_backend.cpu.int4_linear import Int4Linear, PackedLinear
from spec_backend.cpu.int8_linear import install_int8_linears
from spec_backend.cpu.isa import cpu_flags, machine_variants, missing_flags
from spec_backend.cpu.kquant_linear import K8Linear, block_kinds, read_blocks
from spec_backend.cpu.native import native_op, required_op, selection
from spec_backend.cpu.native_eagle3 import install_native_eagle3_layers
from spec_backend.cpu.native_layer import install_native_layers
from spec_backend.cpu.q8_0_projection import install_q8_0_projection
from spec_backend.cpu.replayed_layer import install_replayed_layers
from spec_backend.cpu.sampler_ops import CpuSamplerOps
from spec_backend.cpu.vocab_projection import install_small_batch_linears, install_tall_skinny_projection
from spec_backend.sampling.ops import SamplerOps

logger = logging.getLogger("spec_backend.backends")

#: ``SPEC_BACKEND_INT4=0`` keeps GGUF Q4_1 layers de-quantized to float32 (exact de-quantized numerics)
INT4_ENV = "SPEC_BACKEND_INT4"


class CpuBackend(ReferenceBackend):
    """The reference backend plus native CPU kernels and packed / quantized linear layers."""

    name = "cpu"
    supported_quantizations = ("int4", "int8")

    def probe(self) -> Availability:
        """Available once a variant of the native kernels is built (the first probe on a machine builds it,
        about 15 s; later ones load the cached build) and answers; the note names the variant and why."""
        try:
            chosen = selection()
        except ValueError as exc:  # an unknown SPEC_BACKEND_ISA
            return Availability(False, str(exc))
        if chosen.variant is None:
            return Availability(False, f"the native CPU kernels do not build here: {chosen.reason}")
        if native_op("attention_rows") is None:
            return Availability(False, "the native CPU kernels built but define no attention_rows op")
        return Availability(
            True, f"{chosen.variant.name} kernels: {chosen.reason}; Q4_1 path measured per model at load"
        )

    def describe(self) -> dict[str, Any]:
        """``Backend.describe`` plus the kernels' ISA variant and why, every variant of this architecture
        and whether this CPU runs it, its SIMD flags, and the Q4_1 path the measurement picks for a layer
        of the bundled model's shapes (``fast_path.default_model_decision``; no model is loaded here)."""
        summary = super().describe()
        try:
            chosen = selection()
        except ValueError as exc:  # an unknown SPEC_BACKEND_ISA
            summary["kernels"] = str(exc)
            return summary
        name = chosen.variant.name if chosen.variant is not None else "none"
        summary["kernels"] = f"{name} ({chosen.reason})"
        runs = {v.name: ", ".join(missing_flags(v)) for v in machine_variants()}
        summary["isa variants"] = "; ".join(
            f"{n}: " + (f"this CPU lacks {lacks}" if lacks else "runs here") for n, lacks in runs.items()
        )
        simd = sorted(f for f in cpu_flags() if f.startswith(("avx", "fma", "f16c", "asimd")))
        summary["cpu flags"] = " ".join(simd) or "none found"
        if chosen.variant is not None:
            key = "q4_1 path for a SmolLM2-135M layer, measured now"
            try:
                summary[key] = describe(default_model_decision())
            except ModuleNotFoundError as exc:  # a core-only install: the layer comes from transformers
                if exc.name != "transformers":
                    raise
                summary[key] = "not measured: the layer needs the engine extra (pip install '.[engine]')"
        return summary

    def attention_function(self) -> AttentionFn:
        return cpu_ragged_attention

    def sampler_ops(self) -> SamplerOps:
        """The reference's torch ops, with greedy batches verified by one native call (``sampler_ops``)."""
        ops: SamplerOps = CpuSamplerOps(required_op("greedy_chain_output"))
        return ops

    def prepare_model(self, model: torch.nn.Module, options: ModelOptions) -> None:
        """Packed or quantized linear layers, native layers, tall-skinny projections (module docstring)."""
        mode = options.quantization
        if mode == "int8":
            packed, what = install_int8_linears(model), "int8 (opt-in, lossy)"
        elif mode == "int4" or os.environ.get(INT4_ENV, "1") != "0":
            packed, what = _int4_path(model, mode == "int4", options)
        else:
            packed, what = 0, ""
        if packed:
            _native_layers(model, packed, what)
        install_small_batch_linears(model)
        replayed = install_replayed_layers(model)  # after the projections took their final form
        if replayed:
            logger.info("spec_backend: %d float32 decoder layers replayed natively (bit for bit)", replayed)
        if install_q8_0_projection(model):
            logger.info("spec_backend: LM head runs from its GGUF Q8_0 blocks (exact: float32 activations)")
        install_tall_skinny_projection(model)


def _int4_path(model: torch.nn.Module, quantize: bool, options: ModelOptions) -> tuple[int, str]:
    """The measured path's packing (``fast_path``): how many layers were packed, and how."""
    # the file's blocks serve the packed paths only: a pinned float32 path skips decoding them
    unpacked = pinned_path() == "float32"
    blocks = read_blocks(model, options.gguf_file) if options.gguf_file and not unpacked else {}
    decision: Decision = decide(model, quantize, options.speculative_tokens, blocks)
    packed = pack(model, decision.path, quantize, blocks) if decision.path != "float32" else 0
    if packed or decision.times:
        logger.info(
            "spec_backend: packed-layer path for this model (Q4_1 and GGUF blocks): %s", describe(decision)
        )
    kinds = block_kinds(model)
    if kinds:
        logger.info(
            "spec_backend: %s layers run from their GGUF blocks on the k8 kernel (exact: float32 "
            "activations)",
            ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())),
        )
    return packed, "int4 (opt-in, lossy)" if quantize else "GGUF Q4_1/Q4_K packed as int4"


def _native_layers(model: torch.nn.Module, packed: int, what: str) -> None:
    """A packed model: batch-invariant attention rows (rounding amplifies tiny batch-dependent
    differences), decoder layers and an EAGLE-3 head's first layer as one native call each (where their
    products run on the native kernel)."""
    lossy = [m for m in model.modules() if isinstance(m, PackedLinear) and not isinstance(m, K8Linear)]
    isa = {m.isa for m in lossy if isinstance(m, Int4Linear) and m.kernel == "native"}
    if lossy:
        logger.info(
            "spec_backend: %d linear layers run %s with %s activations; logits differ slightly from the "
            "float32 model",
            len(lossy),
            what,
            f"int8 (per 32 values, {', '.join(sorted(isa))} kernel)" if isa else "bfloat16",
        )
    native = install_native_layers(model)
    if native:
        logger.info("spec_backend: %d decoder layers run as one native call each", native)
    if install_native_eagle3_layers(model):
        logger.info("spec_backend: the EAGLE-3 head's first layer runs as one native call")
    mark_batch_invariant(model)


__all__ = ["INT4_ENV", "CpuBackend"]
