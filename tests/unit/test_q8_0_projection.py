"""The LM head from GGUF Q8_0 blocks (``cpu/q8_0_projection``): exact recovery of the blocks, refusal
of anything else, the native kernel against a float64 product (not lossy), rows independent of the batch,
clear errors on bad inputs, and the engine's guarantee on a model prepared with it — the kernel's tests on
every ISA variant this CPU runs (``isa_fixtures``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from engine_fixtures import PROMPTS, one_thread, require_native_kernels  # noqa: F401 - autouse
from isa_fixtures import VARIANTS, use_variant

from spec_backend.cpu import q8_0_projection as q8
from spec_backend.cpu.vocab_projection import TallSkinnyProjection
from spec_backend.engine import LLM, SamplingParams
from spec_backend.testing.fixtures.q8_0 import make_q8_0_head_model, q8_0_round_trip


@pytest.fixture(scope="module", autouse=True)
def native_kernel() -> None:
    require_native_kernels()


@pytest.fixture(params=VARIANTS)
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ISA variant of this instance's kernel (``isa_fixtures``)."""
    return use_variant(str(request.param), monkeypatch)


def _q8_0(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return q8_0_round_trip(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.1)


def test_q8_0_blocks_are_recovered_exactly() -> None:
    w = _q8_0(40, 96)
    found = q8.recover_q8_0(w)
    assert found is not None
    codes, scale = found
    assert codes.dtype == torch.int8 and codes.shape == (40, 96) and scale.shape == (40, 3)
    assert int(codes.abs().amax()) == 127
    assert torch.equal((codes.reshape(40, 3, 32).float() * scale[..., None]).reshape(40, 96), w)


def test_anything_else_is_left_alone() -> None:
    assert q8.recover_q8_0(torch.randn(16, 64)) is None  # a float weight
    w = _q8_0(16, 64)
    w[3, 5] *= 1.0001  # one weight off its block's grid
    assert q8.recover_q8_0(w) is None
    assert q8.recover_q8_0(_q8_0(16, 64).double()) is None  # only float32 heads
    assert q8.recover_q8_0(torch.randn(16, 40)) is None  # K not a multiple of 32
    assert q8.recover_q8_0(_q8_0(16, 64) * 1.001) is None  # scales that are not fp16 values


def test_kernel_equals_the_float_product_up_to_summation_order(isa: str) -> None:
    """Noise floor: float32 accumulation of K = 576 products, |error| <= K·2^-24 of sum |x_i w_i| (2^-14.8);
    the bound is 2^-14. Negative control: activations rounded to bfloat16 (torch's packed kernels) break
    it, so the bound tells an exact kernel from a lossy one."""
    codes, scale = q8.recover_q8_0(_q8_0(300, 576, seed=1)) or pytest.fail("not Q8_0")
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(2))  # [M, K]
    got, ref = q8.q8_0_mm(x, codes, scale), q8.linear_reference(x, codes, scale)  # [M, N]
    bound = q8.linear_reference(x.abs(), codes.abs(), scale) * 2**-14
    assert got.dtype == torch.float32 and got.shape == (5, 300)
    assert ((got.double() - ref).abs() <= bound).all()
    lossy = q8.linear_reference(x.to(torch.bfloat16).float(), codes, scale)
    assert not ((lossy - ref).abs() <= bound).all()


def test_rows_do_not_depend_on_the_batch(isa: str) -> None:
    """Rows are bit-identical alone and in batches of 1..19 (tiles of 8 and their remainders)."""
    codes, scale = q8.recover_q8_0(_q8_0(100, 64, seed=3)) or pytest.fail("not Q8_0")
    x = torch.randn(19, 64, generator=torch.Generator().manual_seed(4))  # [M, K]
    alone = torch.cat([q8.q8_0_mm(x[i : i + 1], codes, scale) for i in range(19)])  # [M, N]
    for m in range(1, 20):
        assert torch.equal(q8.q8_0_mm(x[:m].contiguous(), codes, scale), alone[:m]), m


def test_kernel_refuses_bad_inputs(isa: str) -> None:
    codes, scale = q8.recover_q8_0(_q8_0(8, 64)) or pytest.fail("not Q8_0")
    with pytest.raises(RuntimeError, match="x must be a contiguous float32"):
        q8.q8_0_mm(torch.zeros(2, 64, dtype=torch.float64), codes, scale)
    with pytest.raises(RuntimeError, match="codes must be contiguous int8"):
        q8.q8_0_mm(torch.zeros(2, 64), codes.to(torch.int32), scale)
    with pytest.raises(RuntimeError, match="scale must be contiguous float32"):
        q8.q8_0_mm(torch.zeros(2, 64), codes, scale[:, :1].contiguous())
    with pytest.raises(RuntimeError, match="K must be a multiple of 32"):
        q8.q8_0_mm(torch.zeros(2, 40), codes, scale)


def test_a_tied_head_stays_tied() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(q8_0_round_trip(model.get_input_embeddings().weight))
    assert q8.install_q8_0_projection(model)
    head = model.get_output_embeddings()
    assert isinstance(head, q8.Q80Projection) and head.weight is model.get_input_embeddings().weight


def test_the_engine_runs_a_q8_0_head_and_stays_lossless(tmp_path: Path, isa: str) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = make_q8_0_head_model(tmp_path / "q8", seed=5)
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
    }
    llm = LLM(model_dir, speculative_config=spec)
    head = llm.model.get_output_embeddings()
    assert isinstance(head, q8.Q80Projection)
    params = SamplingParams(temperature=0.0, max_tokens=16)
    speculative = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    assert llm.metrics.total.num_accepted_tokens > 0
    llm.set_speculation(False)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == speculative
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hidden = torch.randn(7, 32, generator=torch.Generator().manual_seed(6))  # [M, H]
    with torch.no_grad():
        ref = reference.get_output_embeddings()(hidden)  # [M, V]
        assert torch.allclose(head(hidden), ref, rtol=0, atol=float(ref.abs().max()) * 2**-18)


def test_float_heads_and_opt_out_keep_the_float_projection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from spec_backend.cpu.few_rows import ROWS_ENV
    from spec_backend.testing.fixtures.q4_1 import make_q4_1_model

    monkeypatch.setenv(ROWS_ENV, "tall")  # a float head takes the tall-skinny product at some row count
    float_head = LLM(make_q4_1_model(tmp_path / "f")).model.get_output_embeddings()
    assert isinstance(float_head, TallSkinnyProjection)
    model_dir = make_q8_0_head_model(tmp_path / "q8", seed=5)
    monkeypatch.setattr(q8, "native_kernel_error", lambda: "RuntimeError: Ninja is required")
    with caplog.at_level(logging.WARNING, logger="spec_backend.backends"):
        llm = LLM(model_dir)
    assert isinstance(llm.model.get_output_embeddings(), TallSkinnyProjection)
    assert "stays float32 (native kernel unavailable: RuntimeError: Ninja is required)" in caplog.text
