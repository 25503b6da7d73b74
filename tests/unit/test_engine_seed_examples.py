"""vLLM's offline examples (the seed documents' n-gram and suffix ones) run with spec_backend in place
of vllm. Only the model name changes: the hub model becomes a tiny local model with a tokenizer.

The examples sample (temperature 0.8) without a seed, so what they produce rests on the engine's default
seed: 0, as in vLLM, which makes the run reproducible. The tiny model has an ``<eos>`` token, so a run
may legitimately stop before ``max_tokens``; the checks below accept exactly the two outcomes vLLM allows.
"""

from __future__ import annotations

import pytest

from spec_backend import LLM, SamplingParams
from spec_backend.engine.params import RequestOutput
from spec_backend.engine.tiny import make_tiny_model

EOS = 1  # make_tiny_model's character tokenizer: "<eos>" = 1
MAX_TOKENS = 16  # SamplingParams' default max_tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("seed") / "tiny", vocab_size=256, with_tokenizer=True)


def _run_example(llm: LLM) -> list[RequestOutput]:
    prompts = ["The future of AI is"]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
    outputs = llm.generate(prompts, sampling_params)
    for output in outputs:
        assert output.prompt == "The future of AI is"
        c = output.outputs[0]
        assert isinstance(c.text, str)
        assert c.error is None
        if c.finish_reason == "length":
            assert len(c.token_ids) == MAX_TOKENS and EOS not in c.token_ids
        else:  # stopped at EOS: the EOS is the last token and nothing follows it
            assert c.finish_reason == "stop" and c.stop_reason is None
            assert 1 <= len(c.token_ids) <= MAX_TOKENS and c.token_ids.index(EOS) == len(c.token_ids) - 1
    return outputs


def _ids(outputs: list[RequestOutput]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_ngram_offline_example(model_dir: str) -> None:
    llm = LLM(
        model=model_dir,
        tensor_parallel_size=1,
        speculative_config={"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4},
    )
    first = _run_example(llm)
    again = LLM(
        model=model_dir,
        tensor_parallel_size=1,
        speculative_config={"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4},
    )
    assert _ids(_run_example(again)) == _ids(first)  # the default seed makes the example reproducible


def test_suffix_offline_example(model_dir: str) -> None:
    llm = LLM(
        model=model_dir,
        tensor_parallel_size=1,
        enforce_eager=True,
        speculative_config={"method": "suffix", "num_speculative_tokens": 15},
    )
    _run_example(llm)


def test_seed_none_draws_fresh_samples(model_dir: str) -> None:
    """Negative control for the reproducibility check above: with ``seed=None`` two engines differ."""
    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    runs = {tuple(_ids(LLM(model_dir, seed=None).generate(["abc"] * 4, params))[0]) for _ in range(3)}
    assert len(runs) > 1  # P(three runs of 16 tokens over ~100 live tokens all equal) is negligible


def test_tensor_parallelism_is_refused_clearly(model_dir: str) -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel_size must be 1 .* got 4"):
        LLM(model=model_dir, tensor_parallel_size=4)
