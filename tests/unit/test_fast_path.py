"""The Q4_1 path a model runs on the cpu backend, chosen by measurement at load (``cpu/fast_path.py``):
the rule on given times (the fastest path that beats float32 on both steps; float32 otherwise), the pin
and its refusals, a real measurement on a model's layer at the verify width the engine passes, what
``prepare_model`` installs for each outcome with the log saying which and why, and the engine's guarantee
on whatever the measurement picks. No timing thresholds: the times are given, or only their shape is
checked."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import PROMPTS, check_speculation_is_lossless, one_thread, require_native_kernels  # noqa: F401 - autouse

from spec_backend.backends.base import ModelOptions
from spec_backend.cpu import fast_path
from spec_backend.cpu.attention import is_batch_invariant
from spec_backend.cpu.backend import CpuBackend
from spec_backend.cpu.fast_path import PATH_ENV, PATHS, Decision, choose, decide, pinned_path
from spec_backend.cpu.int4_linear import Int4Linear
from spec_backend.cpu.native_layer import NativeDecoderLayer
from spec_backend.engine import LLM
from spec_backend.testing.fixtures.q4_1 import make_q4_1_model

#: head dim 16, every product a multiple of 16 outputs and 32 inputs (native layers apply)
WIDE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
NGRAM = {
    "adaptive_draft_length": False,
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
}


@pytest.fixture(scope="module", autouse=True)
def native_kernels() -> None:
    require_native_kernels()


@pytest.fixture(autouse=True)
def fresh_decisions() -> Iterator[None]:
    """Each test measures (or fakes a measurement) itself: no decision kept from an earlier test."""
    fast_path._DECISIONS.clear()
    yield
    fast_path._DECISIONS.clear()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_q4_1_model(tmp_path_factory.mktemp("wide"), "llama", 5, **WIDE)


def _loaded(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_the_fastest_path_that_beats_float32_on_both_steps_wins() -> None:
    assert choose({"native": (1, 2), "int4-bf16": (3, 3), "float32": (4, 5)}) == (
        "native", "the fastest of native, int4-bf16, float32",
    )  # fmt: skip
    # native is the fastest at decode but slower than float32 at verify: never picked
    assert choose({"native": (1, 6), "int4-bf16": (3, 4), "float32": (4, 5)}) == (
        "int4-bf16", "the fastest of int4-bf16, float32; native is not faster than float32 on both steps",
    )  # fmt: skip
    assert choose({"native": (5, 1), "int4-bf16": (4, 6), "float32": (4, 5)}) == (
        "float32", "no packed path is faster than float32 on both steps",
    )  # fmt: skip
    # quantization="int4": the user asked for packed weights, float32 is no candidate
    assert choose({"native": (2, 2), "int4-bf16": (1, 1)}) == (
        "int4-bf16",
        "the fastest of native, int4-bf16",
    )
    assert choose({"int4-bf16": (1, 1)}) == ("int4-bf16", "the only candidate")


def test_the_pin_and_its_refusals(monkeypatch: pytest.MonkeyPatch, model_dir: str) -> None:
    assert pinned_path() is None
    for value, expected in [("measure", None), ("float32", "float32"), ("int4-bf16", "int4-bf16")]:
        monkeypatch.setenv(PATH_ENV, value)
        assert pinned_path() == expected
    monkeypatch.setenv(PATH_ENV, "fast")
    with pytest.raises(
        ValueError, match=f"{PATH_ENV} must be one of measure, native, int4-bf16, float32; got 'fast'"
    ):
        pinned_path()
    monkeypatch.setenv(PATH_ENV, "float32")
    with pytest.raises(
        ValueError, match=f"{PATH_ENV}=float32 cannot run here; this model and machine allow "
    ):
        decide(_loaded(model_dir), quantize=True, speculative_tokens=None)  # int4 asked: no float32
    monkeypatch.setenv(PATH_ENV, "native")
    monkeypatch.setattr(fast_path, "native_op", lambda name: None)  # a machine without the kernels
    with pytest.raises(
        ValueError, match=r"=native cannot run here; this model and machine allow int4-bf16, float32"
    ):
        decide(_loaded(model_dir), quantize=False, speculative_tokens=None)


def test_a_real_measurement_times_every_path_at_the_verify_width(model_dir: str) -> None:
    """The first Q4_1 layer, built as each path (weights shared: the model is not changed), timed on 1 row
    and K+1 = 3 rows; the decision is the rule's on those times."""
    model = _loaded(model_dir)
    before = dict(model.named_parameters())
    decision = decide(model, quantize=False, speculative_tokens=2)
    assert list(decision.times) == list(PATHS) and decision.verify_rows == 3
    assert all(0 < t < float("inf") for times in decision.times.values() for t in times)
    assert (decision.path, decision.reason) == choose(decision.times)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is p for n, p in before.items())
    assert not is_batch_invariant(model)
    assert all(type(m) is torch.nn.Linear for m in model.model.layers.modules() if hasattr(m, "in_features"))


@pytest.mark.parametrize("winner", PATHS)
def test_prepare_model_installs_the_measured_path_and_says_why(
    winner: str, model_dir: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    times = {"native": (5.0, 5.0), "int4-bf16": (5.0, 5.0), "float32": (2e-3, 3e-3)}
    times[winner] = (1e-3, 2e-3)  # seconds per layer
    seen: list[int] = []

    def fake(layer: Any, rotary: Any, paths: list[str], quantize: bool, verify_rows: int, blocks: Any) -> Any:
        seen.append(verify_rows)
        return {p: times[p] for p in paths}

    monkeypatch.setattr(fast_path, "measure", fake)
    model = _loaded(model_dir)
    with caplog.at_level(logging.INFO, logger="spec_backend.backends"):
        CpuBackend().prepare_model(model, ModelOptions(speculative_tokens=3))
    assert seen == [4]
    layers, packed = model.model.layers, [m for m in model.modules() if isinstance(m, Int4Linear)]
    native = [layer for layer in layers if isinstance(layer, NativeDecoderLayer)]  # their products fused in
    kernels = {"native": set(), "int4-bf16": {"torch"}, "float32": set()}[winner]
    assert len(native) == (2 if winner == "native" else 0) and {m.kernel for m in packed} == kernels
    assert len(packed) == (14 if winner == "int4-bf16" else 0)
    assert is_batch_invariant(model) == (winner != "float32")
    assert f"{winner}: " in caplog.text and f"{winner} 1.000/2.000" in caplog.text
    assert "ms per layer for 1/4 rows" in caplog.text


def test_the_engine_passes_its_k_and_stays_lossless_on_the_measured_path(
    model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LLM`` hands ``prepare_model`` its K (verify steps of K+1 rows); whatever path the measurement
    picks, speculative greedy output equals plain greedy output; so does the float32 path, pinned."""
    decisions: list[Decision] = []
    real = fast_path.decide

    def spy(*args: Any) -> Decision:
        decisions.append(real(*args))
        return decisions[-1]

    monkeypatch.setattr("spec_backend.cpu.backend.decide", spy)
    check_speculation_is_lossless(LLM(model_dir, speculative_config=NGRAM))
    assert decisions[0].verify_rows == 4 and decisions[0].path in PATHS
    monkeypatch.setenv(PATH_ENV, "float32")
    llm = LLM(model_dir, speculative_config=NGRAM)
    assert not [m for m in llm.model.modules() if isinstance(m, Int4Linear)]
    check_speculation_is_lossless(llm)
    assert decisions[1] == Decision("float32", f"pinned by {PATH_ENV}")
    monkeypatch.delenv(PATH_ENV)
    LLM(model_dir)  # no speculative config: verify steps measured at the default K
    assert decisions[2].verify_rows == fast_path.DEFAULT_SPECULATIVE_TOKENS + 1


def test_unmeasurable_models_take_the_native_path_where_it_runs(model_dir: str) -> None:
    """A model without a plain decoder layer to time (an EAGLE-3 head's single layer) is not measured."""
    model = _loaded(model_dir)
    model.model.rotary_emb = None  # no rotary embedding to time a layer with
    decision = decide(model, quantize=False, speculative_tokens=None)
    assert decision == Decision(
        "native", "not measured: no plain decoder layer with Q4_1 or GGUF block weights to time"
    )


def test_layers_no_kernel_takes_stay_float(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """k and v with 8 outputs (both int4 kernels take multiples of 16) stay float32 nn.Linear on either
    packed path, instead of failing the model's load; the rest is packed, and the engine's guarantee
    holds."""
    shapes = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 1, "intermediate_size": 64}
    model_dir = make_q4_1_model(tmp_path / "narrow", "llama", 2, **shapes)
    for path, kernel in [("native", "native"), ("int4-bf16", "torch")]:
        monkeypatch.setenv(PATH_ENV, path)
        llm = LLM(model_dir, speculative_config=NGRAM)
        kernels = {
            n.rsplit(".", 1)[-1]: m.kernel for n, m in llm.model.named_modules() if isinstance(m, Int4Linear)
        }
        assert kernels == {p: kernel for p in ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
        assert all(  # float32: a TallSkinnyProjection where this machine's rows set is not empty
            type(layer.self_attn.k_proj).__name__ in ("TallSkinnyProjection", "Linear")
            and layer.self_attn.k_proj.weight.dtype == torch.float32
            for layer in llm.model.model.layers
        )
        check_speculation_is_lossless(llm)


def test_a_layer_shape_is_measured_once_per_process(model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two loads of one model run the same path (two engines on it give the same tokens, whatever noise
    the second measurement would have met); another verify width is measured anew."""
    calls: list[int] = []
    answers = iter([{"native": (1.0, 1.0), "int4-bf16": (2.0, 2.0), "float32": (3.0, 3.0)},
                    {"native": (3.0, 3.0), "int4-bf16": (1.0, 1.0), "float32": (2.0, 2.0)}])  # fmt: skip

    def fake(layer: Any, rotary: Any, paths: list[str], quantize: bool, verify_rows: int, blocks: Any) -> Any:
        calls.append(verify_rows)
        return next(answers)

    monkeypatch.setattr(fast_path, "measure", fake)
    first, again = (decide(_loaded(model_dir), quantize=False, speculative_tokens=3) for _ in range(2))
    assert first is again and first.path == "native" and calls == [4]
    assert decide(_loaded(model_dir), quantize=False, speculative_tokens=5).path == "int4-bf16"
    assert calls == [4, 6]
