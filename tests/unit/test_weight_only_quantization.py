"""Opt-in weight-only quantization (``LLM(quantization="int4" | "int8")``) on the cpu backend:
each kernel's error against the float32 layer, every linear layer replaced, the engine's guarantee
(speculative greedy = plain greedy, batched = alone) on the quantized model, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_fixtures import PROMPTS, check_speculation_is_lossless, one_thread  # noqa: F401 - autouse

from spec_backend.cpu.int4_linear import Int4Linear, quantize_int4
from spec_backend.cpu.int8_linear import Int8Linear
from spec_backend.engine import LLM
from spec_backend.tools.tiny import make_tiny_model

KINDS = {"int4": Int4Linear, "int8": Int8Linear}


def test_int8_kernel_error_is_bounded() -> None:
    """Noise floor: codes round to 1/254 of the row's largest weight, then bfloat16 (2^-9) on activations,
    scales and output; bound 2^-6 of the sum of |x_i w_i| plus one code step per input."""
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(96, 40, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 96, generator=g) * 0.1)
    packed = Int8Linear(linear)
    x = torch.randn(5, 96, generator=g)
    with torch.no_grad():
        got, ref = packed(x), linear(x)
    step = linear.weight.abs().amax(dim=1) / 127  # [N]
    bound = (x.abs() @ linear.weight.abs().T) * 2**-6 + x.abs().sum(-1, keepdim=True) * step / 2 + 1e-6
    assert ((got - ref).abs() <= bound).all() and not torch.equal(got, ref)


def test_int4_quantization_rounds_to_the_nearest_block_level() -> None:
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    found = quantize_int4(w)
    assert found is not None
    codes, scale, low = found
    rebuilt = (codes.reshape(8, 2, 32).float() * scale[..., None] + low[..., None]).reshape(8, 64)
    step = scale.repeat_interleave(32, dim=1)  # [8, 64]
    assert ((rebuilt - w).abs() <= step / 2 + 1e-6).all()
    assert quantize_int4(torch.randn(4, 40)) is None  # input size not a multiple of 32


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_quantized_engine_keeps_its_guarantee(tmp_path: Path, kind: str) -> None:
    model = make_tiny_model(tmp_path / "m", "llama", seed=2)
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
    }
    llm = LLM(model, speculative_config=spec, quantization=kind)
    replaced = [m for m in llm.model.modules() if isinstance(m, KINDS[kind])]
    assert len(replaced) == 2 * 7  # every decoder linear; the LM head stays float32
    assert all(
        isinstance(m, KINDS[kind]) for m in llm.model.model.layers.modules() if hasattr(m, "in_features")
    )
    check_speculation_is_lossless(llm)


def test_float_is_the_default_and_bad_modes_are_refused(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "m", "llama", seed=2)
    assert not [m for m in LLM(model).model.modules() if isinstance(m, Int4Linear | Int8Linear)]
    allowed = r"allowed are None or one of \['int4', 'int8'\]"
    with pytest.raises(ValueError, match=r"quantization='awq' is not available on backend 'cpu': " + allowed):
        LLM(model, quantization="awq")
    with pytest.raises(  # the reference backend is the pure-torch specification: no quantized layers
        ValueError, match=r"quantization='int4' is not available on backend 'reference': allowed are None \("
    ):
        LLM(model, quantization="int4", backend="reference")
