"""Float32 decoder layers replayed from C++ (``cpu/replayed_layer``): which layers are replaced and which are
left alone, engine steps bit for bit those of transformers' layers (log-probabilities, tokens, seeded
samples, the KV cache) over ragged batches, verify steps and both product forms, every engine step through
the op, and the layer's own forward for every other caller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import PROMPTS, fixed_ngram, one_thread, require_native_kernels  # noqa: F401 - autouse

from spec_backend.cpu.few_rows import ROWS_ENV
from spec_backend.cpu.native_layer import NATIVE_LAYERS_ENV
from spec_backend.cpu.replayed_layer import ReplayedDecoderLayer, install_replayed_layers
from spec_backend.engine import LLM, SamplingParams
from spec_backend.tools.tiny import make_tiny_model

#: grouped-query attention (4 query heads over 2 kv heads of dim 32)
GQA = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
GREEDY_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=4)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, ignore_eos=True, seed=11, logprobs=2)


@pytest.fixture(autouse=True)
def _kernels() -> None:
    require_native_kernels()


def _mistral(path: Path) -> str:
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=128, num_hidden_layers=2, sliding_window=None, **GQA)
    MistralForCausalLM(config).save_pretrained(path)
    return str(path)


def _load(folder: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_supported_layers_are_replaced_keeping_parameters_and_class(tmp_path: Path) -> None:
    model = _load(make_tiny_model(tmp_path / "gqa", **GQA))
    keys, first = list(model.state_dict()), model.model.layers[0]
    assert install_replayed_layers(model) == 2
    layer = model.model.layers[0]
    assert isinstance(layer, ReplayedDecoderLayer) and type(layer).__name__ == "ReplayedLlamaDecoderLayer"
    assert isinstance(layer, type(first))  # what transformers finds by class finds it
    assert list(model.state_dict()) == keys  # the same children under the same names
    assert layer.self_attn is first.self_attn and layer.mlp.down_proj.weight is first.mlp.down_proj.weight
    assert install_replayed_layers(_load(_mistral(tmp_path / "mistral"))) == 2


def test_other_layers_are_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Biases, an architecture outside the registry, a sliding window, another dtype, the switch off."""
    assert install_replayed_layers(_load(make_tiny_model(tmp_path / "bias", attention_bias=True))) == 0
    assert install_replayed_layers(_load(make_tiny_model(tmp_path / "qwen2", "qwen2"))) == 0
    from transformers import MistralConfig, MistralForCausalLM

    windowed = MistralForCausalLM(MistralConfig(vocab_size=64, num_hidden_layers=1, sliding_window=4, **GQA))
    assert install_replayed_layers(windowed) == 0
    assert install_replayed_layers(_load(make_tiny_model(tmp_path / "f64")).double()) == 0
    monkeypatch.setenv(NATIVE_LAYERS_ENV, "0")
    assert install_replayed_layers(_load(make_tiny_model(tmp_path / "off"))) == 0


def _count_replays(llm: LLM) -> list[int]:
    """Wrap each replayed layer's op so its calls are counted (one counter for the model)."""
    calls = [0]
    for layer in llm.model.model.layers:
        assert isinstance(layer, ReplayedDecoderLayer)
        op = layer._replay

        def counted(*args: Any, _op: Any = op) -> torch.Tensor:
            calls[0] += 1
            return _op(*args)

        layer._replay = counted
    return calls


def _run(llm: LLM, params: SamplingParams) -> list[tuple[list[int], Any]]:
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("products", ["linear", "tall"])
@pytest.mark.parametrize("arch", ["llama-gqa", "llama-mha", "mistral"])
def test_engine_steps_equal_transformers_layers_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str, products: str
) -> None:
    """Four ragged prompts (3..19 tokens) batched, verify steps of up to 4 rows beside single rows, greedy
    with log-probabilities and seeded top-p sampling: the replayed engine's tokens and log-probabilities
    equal those of the same engine on transformers' layers, as floats, and every decode step ran the op
    (``products``: the projections' tall-skinny form at every row count, or ``F.linear``)."""
    monkeypatch.setenv(ROWS_ENV, products)
    folder = {
        "llama-gqa": lambda: make_tiny_model(tmp_path / arch, **GQA),
        "llama-mha": lambda: make_tiny_model(tmp_path / arch, **{**GQA, "num_key_value_heads": 4}),
        "mistral": lambda: _mistral(tmp_path / arch),
    }[arch]()
    spec = fixed_ngram(3, 3)
    monkeypatch.setenv(NATIVE_LAYERS_ENV, "0")
    layers = LLM(folder, speculative_config=spec)
    assert not isinstance(layers.model.model.layers[0], ReplayedDecoderLayer)
    expected = [_run(layers, GREEDY_LOGPROBS), _run(layers, SEEDED)]
    monkeypatch.setenv(NATIVE_LAYERS_ENV, "1")
    replayed = LLM(folder, speculative_config=spec)
    calls = _count_replays(replayed)
    steps = replayed.engine.num_steps
    assert [_run(replayed, GREEDY_LOGPROBS), _run(replayed, SEEDED)] == expected
    assert replayed.metrics.total.num_accepted_tokens > 0  # verify steps of several rows ran
    assert calls[0] >= 2 * (replayed.engine.num_steps - steps)  # every step, both layers, through the op


def test_cache_contents_equal_transformers_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the same requests every layer's KV cache holds the same keys and values bit for bit, over each
    slot's written positions (a single request: the slice write; a batch: the indexed write)."""
    folder = make_tiny_model(tmp_path / "gqa", **GQA)
    caches = []
    for native in ("0", "1"):
        monkeypatch.setenv(NATIVE_LAYERS_ENV, native)
        llm = LLM(folder, speculative_config=fixed_ngram(3, 3), max_model_len=64)
        llm.generate(PROMPTS[:1], GREEDY_LOGPROBS)
        llm.generate(PROMPTS, GREEDY_LOGPROBS)
        cache = llm.engine.runner.cache
        written = list(cache._zeroed)  # per slot: the positions written or zeroed (the rest is unset memory)
        assert all(n > 0 for n in written[: len(PROMPTS)])
        caches.append(
            [
                (k[s, :, :n], v[s, :, :n])
                for k, v in (layer.kv() for layer in cache.layers)
                for s, n in enumerate(written)
            ]
        )
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*caches, strict=True))


def test_every_other_caller_runs_the_layers_own_forward(tmp_path: Path) -> None:
    """Without an engine step (transformers' own forward and cache) the replaced model's logits are the
    original's bit for bit: the layer's forward runs, not the op."""
    folder = make_tiny_model(tmp_path / "gqa", **GQA)
    model, replaced = _load(folder), _load(folder)
    assert install_replayed_layers(replaced) == 2
    for layer in replaced.model.layers:
        layer._replay = None  # any call of the op would fail
    ids = torch.tensor([PROMPTS[2]])
    with torch.inference_mode():
        assert torch.equal(replaced(input_ids=ids).logits, model(input_ids=ids).logits)
        out = replaced.generate(ids, max_new_tokens=5, do_sample=False)
        assert torch.equal(out, model.generate(ids, max_new_tokens=5, do_sample=False))


def test_a_hook_inside_the_layer_runs_the_layers_own_forward(tmp_path: Path) -> None:
    """A forward hook on a module whose call the op would make in its place (here each layer's q
    projection) fires at every engine step: the layers' own forwards run, and the outputs stay the same."""
    folder = make_tiny_model(tmp_path / "gqa", **GQA)
    replayed = LLM(folder, speculative_config=fixed_ngram(3, 3))
    expected = _run(replayed, GREEDY_LOGPROBS)
    calls, fired = _count_replays(replayed), []
    handles = [
        layer.self_attn.q_proj.register_forward_hook(lambda *a: fired.append(1))
        for layer in replayed.model.model.layers
    ]
    steps = replayed.engine.num_steps
    assert _run(replayed, GREEDY_LOGPROBS) == expected
    assert calls[0] == 0 and len(fired) > 2 * (replayed.engine.num_steps - steps)  # prefills too
    for handle in handles:
        handle.remove()
    _run(replayed, GREEDY_LOGPROBS)
    assert calls[0] > 0  # without the hooks, the op again
