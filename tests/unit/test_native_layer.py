"""Whole decoder layers as native calls (``cpu/native_layer``): which layers are replaced and which are
left alone, the op's rows never depending on the batch or on how a token's row is split between calls
(what speculative greedy = plain greedy rests on), the ragged path against the general path bit for bit,
closeness to transformers' layers on the same packed products, and the engine's guarantee — on every ISA
variant of the kernels this CPU runs (``isa_fixtures``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import PROMPTS, check_speculation_is_lossless, one_thread  # noqa: F401 - autouse
from isa_fixtures import VARIANTS, use_variant

from spec_backend.cpu.fast_path import PATH_ENV
from spec_backend.cpu.int4_linear import install_int4_linears
from spec_backend.cpu.native import native_op
from spec_backend.cpu.native_layer import NativeDecoderLayer, install_native_layers, weight_names
from spec_backend.engine import LLM
from spec_backend.testing.fixtures.q4_1 import make_q4_1_model
from spec_backend.tools.tiny import make_tiny_model

#: head dim 16 (the op needs a multiple of 16), every product a multiple of 16 outputs and 32 inputs
WIDE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture(autouse=True, params=VARIANTS)
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on each ISA variant this CPU runs; the engine's packed path pinned to the native one."""
    monkeypatch.setenv(PATH_ENV, "native")
    return use_variant(str(request.param), monkeypatch)


def _ops(*names: str) -> list[Any]:
    ops = [native_op(name) for name in names]
    assert all(op is not None for op in ops)
    return ops


def _packed(path: Path, arch: str = "llama", **overrides: Any) -> Any:
    from transformers import AutoModelForCausalLM

    folder = (
        path if (path / "config.json").exists() else make_q4_1_model(path, arch, 5, **{**WIDE, **overrides})
    )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    install_int4_linears(model)
    return model


def test_supported_layers_are_replaced_and_others_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _packed(tmp_path / "wide")
    assert install_native_layers(model) == 2
    assert all(isinstance(layer, NativeDecoderLayer) for layer in model.model.layers)
    layer = model.model.layers[0].to(torch.float32)
    assert all(w is getattr(layer, name) for w, name in zip(layer._weights, weight_names(), strict=True))
    assert install_native_layers(_packed(tmp_path / "bias", attention_bias=True)) == 0  # biases
    assert install_native_layers(_packed(tmp_path / "qwen2", "qwen2")) == 0  # not in the registry
    assert install_native_layers(_packed(tmp_path / "d8", num_attention_heads=8)) == 0  # head dim 8
    from transformers import AutoModelForCausalLM

    float_dir = make_tiny_model(tmp_path / "float", **WIDE)
    assert install_native_layers(AutoModelForCausalLM.from_pretrained(float_dir)) == 0  # not packed
    monkeypatch.setenv("SPEC_BACKEND_NATIVE_LAYERS", "0")
    assert install_native_layers(_packed(tmp_path / "wide")) == 0


def _inputs(model: Any, positions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.tensor(positions)  # [B, Q]
    x = torch.randn(*ids.shape, 64, generator=torch.Generator().manual_seed(7))  # [B, Q, H]
    cos, sin = model.model.rotary_emb(x, position_ids=ids)  # [B, Q, D]
    return x, cos, sin


def test_rows_do_not_depend_on_the_batch_or_the_split(tmp_path: Path) -> None:
    """Request A verifies 4 rows at positions 5..8 beside request B decoding 1 row (3 padding rows);
    every row equals, bit for bit, that row computed alone, and A's rows computed one per call (plain
    decoding); the keys written are the same too. Then the general path's two ops around the row
    attention kernel give the ragged op's result bit for bit."""
    model = _packed(tmp_path / "wide")
    layer = NativeDecoderLayer(model.model.layers[0])
    layer_op, qkv_op, out_op, rows_op = _ops(
        "decoder_layer", "decoder_layer_qkv", "decoder_layer_out", "attention_rows"
    )
    shape = (4, 2, 16, layer.shape[3], layer.self_attn.scaling)
    x, cos, sin = _inputs(model, [[5, 6, 7, 8], [2, 3, 4, 5]])
    cache = torch.randn(2, 2, 2, 12, 16, generator=torch.Generator().manual_seed(8))  # k|v, [B, Hkv, C, D]

    def run(rows: slice, b: slice, q_lens: list[int], kv_lens: list[int], kv: torch.Tensor) -> torch.Tensor:
        q, k = torch.tensor(q_lens), torch.tensor(kv_lens)
        return layer_op(
            x[b, rows], cos[b, rows], sin[b, rows], layer._weights, kv[0, b], kv[1, b], q, k, *shape
        )

    batched_kv = cache.clone()
    batched = run(slice(None), slice(None), [4, 1], [9, 3], batched_kv)  # [2, 4, H]
    alone_kv = cache.clone()
    assert torch.equal(run(slice(None), slice(0, 1), [4], [9], alone_kv)[0], batched[0])
    assert torch.equal(run(slice(0, 1), slice(1, 2), [1], [3], alone_kv)[0, 0], batched[1, 0])
    split_kv = cache.clone()
    for i in range(4):
        assert torch.equal(run(slice(i, i + 1), slice(0, 1), [1], [6 + i], split_kv)[0, 0], batched[0, i])
    assert torch.equal(alone_kv, batched_kv) and torch.equal(split_kv[:, :1], batched_kv[:, :1])
    assert not torch.equal(batched_kv, cache)  # the keys were written

    general_kv = cache.clone()
    q, k, v = qkv_op(x, cos, sin, layer._weights, *shape[:4])  # [B, H, Q, D]
    general_kv[0, 0, :, 5:9], general_kv[1, 0, :, 5:9] = k[0], v[0]
    general_kv[0, 1, :, 2:3], general_kv[1, 1, :, 2:3] = k[1, :, :1], v[1, :, :1]
    lens = (torch.tensor([4, 1]), torch.tensor([9, 3]))
    attn = rows_op(q, general_kv[0], general_kv[1], *lens, shape[4])
    general = out_op(x, attn, layer._weights, *shape[:4])
    assert torch.equal(general[0], batched[0]) and torch.equal(general[1, 0], batched[1, 0])
    assert torch.equal(general_kv, batched_kv)


def test_logits_are_close_to_transformers_layers(tmp_path: Path) -> None:
    """The same packed products under transformers' layers and under the native op: norms, rotary
    embedding and SiLU differ in the last bits only, but a last-bit change can move an activation's int8
    code by one step, which moves an output by up to a step times the weight's size; noise floor 2^-8 of
    the logits' spread (measured 2^-20 to 2^-21 here: no code moved)."""
    reference = _packed(tmp_path / "wide")
    native = _packed(tmp_path / "wide")
    assert install_native_layers(native) == 2
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ref, got = reference(ids).logits, native(ids).logits  # [1, T, V]
    assert float((got - ref).abs().max()) < float(ref.std()) * 2**-8
    with torch.no_grad():  # transformers finds the native layers by their class: hidden states recorded
        ref_states = reference(ids, output_hidden_states=True).hidden_states
        got_states = native(ids, output_hidden_states=True).hidden_states
    assert isinstance(native.model.layers[0], type(reference.model.layers[0]))
    assert len(got_states) == len(ref_states) == 3  # embeddings and the 2 layers' outputs
    for a, b in zip(got_states, ref_states, strict=True):
        assert float((a - b).abs().max()) < float(b.std()) * 2**-8


def test_op_refuses_bad_inputs(tmp_path: Path) -> None:
    model = _packed(tmp_path / "wide")
    layer = NativeDecoderLayer(model.model.layers[0])
    x, cos, sin = _inputs(model, [[0, 1]])
    kv, lens = torch.zeros(2, 1, 2, 4, 16), (torch.tensor([2]), torch.tensor([2]))
    (op,), shape = _ops("decoder_layer"), (4, 2, 16, layer.shape[3], 0.25)
    with pytest.raises(RuntimeError, match="decoder layer needs 14 weight tensors, got 13"):
        op(x, cos, sin, layer._weights[:13], kv[0], kv[1], *lens, *shape)
    with pytest.raises(RuntimeError, match="q_len 2, kv_len 5 do not fit"):
        op(x, cos, sin, layer._weights, kv[0], kv[1], lens[0], torch.tensor([5]), *shape)
    with pytest.raises(RuntimeError, match="weight shapes do not match hidden 64"):
        op(x, cos, sin, layer._weights, kv[0], kv[1], *lens, 2, 2, 16, layer.shape[3], 0.25)


def _rows_reference(model: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    """transformers' generate (its cache: the general path) with the row attention kernel."""
    from transformers import AttentionInterface

    from spec_backend.cpu.attention import native_attention_rows
    from spec_backend.step import RaggedAttentionMetadata

    def rows(
        module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *a: Any, **k: Any
    ) -> Any:
        lengths = RaggedAttentionMetadata(torch.tensor([query.shape[2]]), torch.tensor([key.shape[2]]))
        return native_attention_rows(query, key, value, lengths, k.get("scaling")), None

    AttentionInterface.register("spec_rows_test", rows)
    before = model.config._attn_implementation
    model.set_attn_implementation("spec_rows_test")
    try:
        outs = [
            model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)[0, len(p) :] for p in prompts
        ]
    finally:
        model.set_attn_implementation(before)
    return [o.tolist() for o in outs]


def test_the_engine_runs_native_layers_and_stays_lossless(tmp_path: Path, isa: str) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
    }
    llm = LLM(make_q4_1_model(tmp_path / "wide", seed=5, **WIDE), speculative_config=spec)
    assert all(isinstance(layer, NativeDecoderLayer) for layer in llm.model.model.layers)
    assert {layer.isa for layer in llm.model.model.layers} == {isa}
    speculative = check_speculation_is_lossless(llm)
    assert _rows_reference(llm.model, PROMPTS, 16) == speculative  # the general path agrees


@pytest.mark.parametrize("sliding_window", [None, 8])
def test_mistral_layers_run_natively_without_a_sliding_window(sliding_window: int | None) -> None:
    """A Mistral model quantized to int4 (``quantization="int4"``'s path): its layers become native only
    without a sliding window (the op attends to every earlier position), and then its logits stay within
    the noise floor of ``test_logits_are_close_to_transformers_layers``."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=128, num_hidden_layers=2, sliding_window=sliding_window, **WIDE)
    torch.manual_seed(0)
    reference = MistralForCausalLM(config).eval()
    native = MistralForCausalLM(config).eval()
    native.load_state_dict(reference.state_dict())
    assert install_int4_linears(reference, quantize=True) == install_int4_linears(native, quantize=True) == 14
    assert install_native_layers(native) == (2 if sliding_window is None else 0)
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ref, got = reference(ids).logits, native(ids).logits  # [1, T, V]
    assert float((got - ref).abs().max()) < float(ref.std()) * 2**-8


def test_a_prefill_split_across_threads_equals_decoding_row_by_row(tmp_path: Path) -> None:
    """40 prompt rows (the row-wise steps then run in chunks of 16 on both threads) give bit for bit what
    40 one-row calls give: a prefill and plain decoding agree on every hidden state and cached key."""
    torch.set_num_threads(2)
    model = _packed(tmp_path / "wide")
    layer = NativeDecoderLayer(model.model.layers[0])
    (op,), shape = _ops("decoder_layer"), (4, 2, 16, layer.shape[3], layer.self_attn.scaling)
    x, cos, sin = _inputs(model, [list(range(40))])
    prefill_kv, split_kv = torch.zeros(2, 1, 2, 48, 16), torch.zeros(2, 1, 2, 48, 16)  # k|v [1, Hkv, C, D]
    lens = (torch.tensor([40]), torch.tensor([40]))
    prefill = op(x, cos, sin, layer._weights, prefill_kv[0], prefill_kv[1], *lens, *shape)
    for i in range(40):
        row = op(
            x[:, i : i + 1], cos[:, i : i + 1], sin[:, i : i + 1], layer._weights, split_kv[0], split_kv[1],
            torch.tensor([1]), torch.tensor([i + 1]), *shape,
        )  # fmt: skip
        assert torch.equal(row[0, 0], prefill[0, i]), i
    assert torch.equal(prefill_kv, split_kv)


def _windowed_int4(path: Path, window: int) -> LLM:
    """A Mistral model with a sliding window, quantized to int4 (its layers stay transformers')."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    MistralForCausalLM(
        MistralConfig(vocab_size=128, num_hidden_layers=2, sliding_window=window, **WIDE)
    ).save_pretrained(path)
    return LLM(str(path), quantization="int4")


@pytest.mark.parametrize("model", ["q4_1", "window"])
def test_a_token_tree_step_masks_by_ancestry(tmp_path: Path, model: str) -> None:
    """The native op masks causally by column: a tree step (siblings side by side) takes the general path,
    whose attention gives each row exactly the keys of its node's path (within a sliding window: by depth)
    — every node's final hidden state is, bit for bit, the one a plain forward of its path gives (what
    greedy tree output = plain rests on)."""
    from test_kv_cache import step

    from spec_backend.cpu.attention import is_batch_invariant
    from spec_backend.runtime.runner import ModelRunner
    from spec_backend.step import HiddenStateRequest, build_tree_step_batch

    if model == "q4_1":
        llm = LLM(make_q4_1_model(tmp_path / "wide", seed=5, **WIDE))
        assert all(isinstance(layer, NativeDecoderLayer) for layer in llm.model.model.layers)
    else:
        llm = _windowed_int4(tmp_path / "mistral", window=4)
    assert is_batch_invariant(llm.model)
    runner = ModelRunner(llm.model, llm.engine.runner.cache, HiddenStateRequest(final=True))
    prompt, last, parents, tokens = [1, 5, 7, 9, 3], 11, [-1, -1, 0, 0, 1, 2], [20, 21, 22, 23, 24, 25]
    runner.cache.add_slot(), runner.cache.add_slot()
    runner.forward(step(runner.cache, 0, [prompt]), True)
    ids = torch.tensor([[last, *tokens]])
    tree = runner.forward(build_tree_step_batch(0, ids, [parents], runner.cache.lengths[:1]), False).final
    assert tree is not None
    for node in range(len(tokens)):
        path, at = [], node
        while at >= 0:
            path, at = [tokens[at], *path], parents[at]
        runner.cache.truncate(1, 0)
        want = runner.forward(step(runner.cache, 1, [[*prompt, last, *path]]), False).final  # [P, H]
        assert want is not None and torch.equal(tree[1 + node], want[-1]), f"node {node}"
