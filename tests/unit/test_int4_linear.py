"""GGUF Q4_1 layers kept packed (``backends/int4_linear``): exact recovery of the blocks from their
de-quantized floats, refusal of anything else, the kernel's error against the float32 layer, and the
engine's guarantee on a prepared model (speculative greedy = plain greedy, token for token)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse

from spec_backend.backends.int4_linear import Int4Linear, install_int4_linears, recover_q4_1
from spec_backend.engine import LLM, SamplingParams
from spec_backend.engine.tiny import make_tiny_model
from spec_backend.testing.q4_1 import make_q4_1_model, q4_1_round_trip


def _q4_1(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return q4_1_round_trip(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.1)


def test_q4_1_blocks_are_recovered_exactly() -> None:
    w = _q4_1(48, 96)
    found = recover_q4_1(w)
    assert found is not None
    codes, scale, low = found
    assert codes.shape == (48, 96) and scale.shape == low.shape == (48, 3)
    assert int(codes.min()) == 0 and int(codes.max()) == 15
    rebuilt = codes.reshape(48, 3, 32).float() * scale[..., None] + low[..., None]
    assert torch.equal(rebuilt.reshape(48, 96), w)


def test_anything_else_is_left_alone() -> None:
    assert recover_q4_1(torch.randn(16, 64)) is None  # a float weight
    w = _q4_1(16, 64)
    w[3, 5] += 1e-4  # one weight off its block's grid
    assert recover_q4_1(w) is None
    assert recover_q4_1(_q4_1(16, 64).double()) is None  # only float32 layers
    assert recover_q4_1(torch.randn(16, 40)) is None  # K not a multiple of 32


@pytest.mark.parametrize("rows", [1, 3, 8, 64])
def test_kernel_matches_the_float_layer_within_bfloat16_rounding(rows: int) -> None:
    """Noise floor: activations, scales and zeros are rounded to bfloat16 (relative 2^-9) and the output
    too, so each output may differ from float32 by ~2^-8 of the sum of |x_i w_i|; the bound is 2^-7."""
    w = _q4_1(64, 128, seed=1)
    linear = torch.nn.Linear(128, 64, bias=True)
    with torch.no_grad():
        linear.weight.copy_(w)
    found = recover_q4_1(linear.weight)
    assert found is not None
    packed = Int4Linear(linear, *found)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, ref = packed(x), linear(x)
    scale = (x.abs() @ w.abs().T) + linear.bias.abs()  # [rows, 64]
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert ((got - ref).abs() <= scale * 2**-7).all()
    assert not torch.equal(got, ref)  # lossy, as documented (a kernel that ignored the bf16 path would pass)


def test_the_engine_packs_q4_1_models_and_stays_lossless(tmp_path: Path) -> None:
    model_dir = make_q4_1_model(tmp_path / "q4", seed=3)
    llm = LLM(
        model_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    )
    packed = [m for m in llm.model.modules() if isinstance(m, Int4Linear)]
    assert len(packed) == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers
    params = SamplingParams(temperature=0.0, max_tokens=16)
    speculative = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert llm.metrics.total.num_accepted_tokens > 0
    llm.set_speculation(False)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == speculative
    assert [llm.generate([p], params)[0].outputs[0].token_ids for p in PROMPTS] == speculative  # alone
    assert llm.model.config.spec_batch_invariant  # the attention keeps rows independent of the batch


def test_logits_stay_close_to_the_float_model(tmp_path: Path) -> None:
    """The prepared model against transformers' float32 reading of the same weights; noise floor
    2^-5 of the logits' spread (the bfloat16 roundings of ``test_kernel_matches...`` through 2 layers)."""
    from transformers import AutoModelForCausalLM

    model_dir = make_q4_1_model(tmp_path / "q4", seed=3)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    packed = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert install_int4_linears(packed) == 14
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ref, got = reference(ids).logits, packed(ids).logits  # [1, T, V]
    spread = float(ref.std())
    assert float((got - ref).abs().max()) < spread * 2**-5
    assert not torch.equal(got, ref)


def test_float_models_are_not_packed(tmp_path: Path) -> None:
    llm = LLM(make_tiny_model(tmp_path / "f", "llama"))
    assert not [m for m in llm.model.modules() if isinstance(m, Int4Linear)]


def test_packing_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_BACKEND_INT4", "0")
    llm = LLM(make_q4_1_model(tmp_path / "q4", seed=3))
    assert not [m for m in llm.model.modules() if isinstance(m, Int4Linear)]
