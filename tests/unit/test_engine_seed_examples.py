"""vLLM's offline examples (the seed documents' n-gram and suffix ones) run with spec_backend in place
of vllm. Only the model name changes: the hub model becomes a tiny local model with a tokenizer."""

from __future__ import annotations

import pytest

from spec_backend import LLM, SamplingParams
from spec_backend.engine.tiny import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("seed") / "tiny", vocab_size=256, with_tokenizer=True)


def _run_example(llm: LLM) -> None:
    prompts = ["The future of AI is"]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
    outputs = llm.generate(prompts, sampling_params)
    for output in outputs:
        assert output.prompt == "The future of AI is"
        assert isinstance(output.outputs[0].text, str)
        assert len(output.outputs[0].token_ids) == 16  # SamplingParams' default max_tokens


def test_ngram_offline_example(model_dir: str) -> None:
    llm = LLM(
        model=model_dir,
        tensor_parallel_size=1,
        speculative_config={"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4},
    )
    _run_example(llm)


def test_suffix_offline_example(model_dir: str) -> None:
    llm = LLM(
        model=model_dir,
        tensor_parallel_size=1,
        enforce_eager=True,
        speculative_config={"method": "suffix", "num_speculative_tokens": 15},
    )
    _run_example(llm)


def test_tensor_parallelism_is_refused_clearly(model_dir: str) -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel_size must be 1 .* got 4"):
        LLM(model=model_dir, tensor_parallel_size=4)
