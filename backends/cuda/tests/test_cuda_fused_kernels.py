"""The fused kernels of ``CudaBackend(fused_kernels=True)`` on CPU under ``TRITON_INTERPRET=1``: the
RMSNorm against transformers' ``LlamaRMSNorm``, the gated MLP against ``LlamaMLP``, which modules they
replace (the engine's tokens with them: ``test_cuda_engine_cpu.py``). bfloat16 is left to a GPU: the
triton interpreter converts float32 to bfloat16 by truncation, not by rounding to nearest as a GPU does, so
a CPU comparison in bfloat16 would test the interpreter (float16 covers the rounding steps)."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from spec_backend_cuda import CudaBackend
from spec_backend_cuda.fused_mlp import (
    FUSABLE_MLPS,
    FusedGatedMLP,
    fusable_mlp,
    install_fused_mlps,
    silu_and_mul,
)
from spec_backend_cuda.fused_norm import FUSABLE_NORMS, FusedRMSNorm, fusable, install_fused_norms, rms_norm
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from spec_backend.backends.base import ModelOptions

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CUDA GPU is present: compiled triton kernels cannot read these CPU tensors "
    "(test_gpu_engine.py runs the kernels there)",
)

#: float32: the blocked sum of squares differs from torch's mean in the last bits; float16: a row may
#: round one unit of the last place the other way
TOLERANCE = {torch.float32: 4e-6, torch.float16: 2e-3}


def _norm(hidden: int, dtype: torch.dtype, weight_dtype: torch.dtype | None = None) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(hidden, eps=1e-5).to(weight_dtype or dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=torch.Generator().manual_seed(hidden)) * 0.5 + 1)
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hidden", [64, 96, 576])
@pytest.mark.parametrize("shape", [(3, 7), (1, 1), (0,)])
def test_the_kernel_matches_llama_rms_norm(dtype: torch.dtype, hidden: int, shape: tuple[int, ...]) -> None:
    """Hidden sizes on and off the power-of-two tile (SmolLM2's 576), one row, many, none."""
    norm = _norm(hidden, dtype)
    x = (torch.randn(*shape, hidden, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    got, want = rms_norm(x, norm.weight, norm.variance_epsilon), norm(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_a_float32_weight_over_half_inputs_promotes_as_transformers_does() -> None:
    """``weight * x.to(input_dtype)`` with a float32 weight and float16 rows is float32 in torch."""
    norm = _norm(96, torch.float16, weight_dtype=torch.float32)
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(2)).half()
    got, want = rms_norm(x, norm.weight, norm.variance_epsilon), norm(x)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=4e-6, rtol=4e-6)


def test_strided_rows_are_normalised_as_their_values() -> None:
    """A transposed view (rows not contiguous) gives what its contiguous copy gives."""
    norm = _norm(64, torch.float32)
    x = torch.randn(64, 5, generator=torch.Generator().manual_seed(3)).t()  # [5, 64], stride (1, 5)
    assert torch.equal(rms_norm(x, norm.weight, 1e-5), rms_norm(x.contiguous(), norm.weight, 1e-5))


@pytest.mark.parametrize(("classes", "base"), [(FUSABLE_NORMS, LlamaRMSNorm), (FUSABLE_MLPS, LlamaMLP)])
def test_the_fusable_classes_have_llamas_forward(classes: frozenset[str], base: type) -> None:
    """Each class in ``FUSABLE_NORMS`` / ``FUSABLE_MLPS`` that the installed transformers has runs
    ``LlamaRMSNorm``'s / ``LlamaMLP``'s forward word for word (a release that changes one must drop it)."""
    import importlib

    want = textwrap.dedent(inspect.getsource(base.forward))
    found = 0
    for name in sorted(classes):
        stem = name.removesuffix("RMSNorm").removesuffix("MLP")
        family = {"Qwen3Moe": "qwen3_moe"}.get(stem, stem.lower())
        cls = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), name, None)
        if cls is not None:
            found += 1
            assert textwrap.dedent(inspect.getsource(cls.forward)) == want, name
    assert found >= 4


def test_install_replaces_the_llama_norms_and_keeps_their_weights(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from spec_backend.tools.tiny import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny", hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    weights = {id(m.weight) for m in model.modules() if isinstance(m, LlamaRMSNorm)}
    hooked = model.model.layers[0].input_layernorm
    hooked.register_forward_hook(lambda *_: None)  # a hook's module is left as it is
    layers = model.config.num_hidden_layers
    assert install_fused_norms(model) == 2 * layers  # every norm but the hooked one
    fused = [m for m in model.modules() if isinstance(m, FusedRMSNorm)]
    assert {id(m.weight) for m in fused} | {id(hooked.weight)} == weights
    assert model.model.layers[0].input_layernorm is hooked and not fusable(torch.nn.LayerNorm(8))


def test_the_backend_option_fuses_at_prepare_model_and_is_checked(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from spec_backend.tools.tiny import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny", hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    CudaBackend().prepare_model(model, ModelOptions())
    assert not any(isinstance(m, FusedRMSNorm) for m in model.modules())  # off by default
    CudaBackend(fused_kernels=True).prepare_model(model, ModelOptions())
    layers = model.config.num_hidden_layers
    assert sum(isinstance(m, FusedRMSNorm) for m in model.modules()) == 2 * layers + 1
    assert sum(isinstance(m, FusedGatedMLP) for m in model.modules()) == layers
    with pytest.raises(ValueError, match="fused_kernels must be a bool, got 'yes'"):
        CudaBackend(fused_kernels="yes")  # type: ignore[arg-type]


def test_inputs_it_cannot_compute_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fused = FusedRMSNorm(_norm(16, torch.float32).weight, 1e-5)
    with pytest.raises(ValueError, match=r"inputs, got torch.float64"):
        fused(torch.randn(2, 16, dtype=torch.float64))
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match=r"runs on CUDA .* got a tensor on cpu"):
        fused(torch.randn(2, 16))


class _Config:
    hidden_size, intermediate_size, mlp_bias, hidden_act = 48, 80, False, "silu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_the_gated_mlp_matches_llama_mlp(dtype: torch.dtype, bias: bool) -> None:
    """Merged gate/up projections and the gating kernel against ``LlamaMLP`` (intermediate size 80: off
    the tile), with and without biases; the down projection is the module's own."""
    config = _Config()
    config.mlp_bias = bias
    torch.manual_seed(4)
    mlp = LlamaMLP(config).to(dtype)
    x = torch.randn(3, 5, 48).to(dtype)
    fused = FusedGatedMLP(mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    assert fused.down_proj is mlp.down_proj and fusable_mlp(mlp)
    torch.testing.assert_close(fused(x), mlp(x), atol=TOLERANCE[dtype] * 2, rtol=TOLERANCE[dtype] * 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_gating_kernel_rounds_as_torch(dtype: torch.dtype) -> None:
    """``silu(g) * u`` from one ``[N, 2I]`` tensor against torch's two ops on its halves: float16 bit for
    bit (the kernel rounds where torch does); float32 within the last bits of ``exp`` (torch's vectorised
    exp and the interpreter's differ there)."""
    gate_up = (torch.randn(4, 2, 2 * 80, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    want = torch.nn.functional.silu(gate_up[..., :80]) * gate_up[..., 80:]
    if dtype == torch.float16:
        assert torch.equal(silu_and_mul(gate_up, 80), want)
    torch.testing.assert_close(silu_and_mul(gate_up, 80), want, atol=1e-6, rtol=1e-6)
    assert silu_and_mul(gate_up[:0], 80).shape == (0, 2, 80)


def test_install_replaces_silu_mlps_only(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from spec_backend.tools.tiny import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny", hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    other = model.model.layers[0].mlp
    other.act_fn = torch.nn.GELU()  # another gating is left alone
    assert install_fused_mlps(model) == model.config.num_hidden_layers - 1
    assert model.model.layers[0].mlp is other and isinstance(model.model.layers[1].mlp, FusedGatedMLP)


def test_merging_frees_each_layers_gate_and_up_weights_before_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Peak memory of the swap: when a layer's merged matrix is built, the gate weights of the layers
    already merged are gone (before the fix every layer's were alive until the last merge: a large
    model could run out of memory at start-up)."""
    import weakref

    from spec_backend_cuda import fused_mlp
    from transformers import AutoModelForCausalLM

    from spec_backend.tools.tiny import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny", hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    olds = [weakref.ref(layer.mlp.gate_proj.weight) for layer in model.model.layers]
    alive: list[int] = []
    build = fused_mlp.FusedGatedMLP.__init__

    def counted(self: Any, *args: Any) -> None:
        alive.append(sum(ref() is not None for ref in olds))
        build(self, *args)

    monkeypatch.setattr(fused_mlp.FusedGatedMLP, "__init__", counted)
    assert install_fused_mlps(model) == len(olds) >= 2
    assert alive == list(range(len(olds), 0, -1))  # the merged layers' old weights are freed as it goes
    assert all(ref() is None for ref in olds)


def test_an_mlp_shared_by_two_parents_stays_shared() -> None:
    config = _Config()
    torch.manual_seed(6)
    shared = LlamaMLP(config)
    parents = torch.nn.ModuleList([torch.nn.Module(), torch.nn.Module()])
    parents[0].mlp, parents[1].mlp = shared, shared
    assert install_fused_mlps(parents) == 1
    assert isinstance(parents[0].mlp, FusedGatedMLP) and parents[0].mlp is parents[1].mlp


def test_a_weight_of_another_width_is_refused() -> None:
    with pytest.raises(ValueError, match=r"need a weight of shape \(16,\), got \(8,\)"):
        rms_norm(torch.randn(2, 16), torch.ones(8), 1e-5)
