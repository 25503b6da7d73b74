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
from spec_backend.tools.tiny import make_tiny_model

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
        speculative_config={
            "adaptive_draft_length": False,
            "method": "ngram",
            "num_speculative_tokens": 5,
            "prompt_lookup_max": 4,
        },
    )
    first = _run_example(llm)
    again = LLM(
        model=model_dir,
        tensor_parallel_size=1,
        speculative_config={
            "adaptive_draft_length": False,
            "method": "ngram",
            "num_speculative_tokens": 5,
            "prompt_lookup_max": 4,
        },
    )
    assert _ids(_run_example(again)) == _ids(first)  # the default seed makes the example reproducible


def test_suffix_offline_example(model_dir: str) -> None:
    llm = LLM(
        model=model_dir,
        tensor_parallel_size=1,
        enforce_eager=True,
        speculative_config={"adaptive_draft_length": False, "method": "suffix", "num_speculative_tokens": 15},
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


def test_eagle_offline_example_of_the_ascend_guide(
    model_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Seed 003's EAGLE example (one device instead of four), with a tiny head in EAGLE-1's format."""
    from spec_backend.testing.fixtures.draft_checkpoints import write_eagle1

    head = write_eagle1(tmp_path_factory.mktemp("eagle") / "EAGLE-tiny", model_dir, bias=True)
    llm = LLM(
        model=model_dir,
        tensor_parallel_size=1,
        distributed_executor_backend="mp",
        enforce_eager=True,
        async_scheduling=True,
        speculative_config={
            "adaptive_draft_length": False,
            "method": "eagle",
            "model": head,
            "draft_tensor_parallel_size": 1,
            "num_speculative_tokens": 2,
        },
    )
    _run_example(llm)
    assert llm.metrics.total.num_draft_tokens > 0


def test_eagle_config_of_the_vllm_guide_infers_the_method(
    model_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Seed 001's EAGLE config; the folder name (``EAGLE-...``) alone selects ``eagle``, as in vLLM."""
    from spec_backend.testing.fixtures.draft_checkpoints import write_eagle1

    head = write_eagle1(tmp_path_factory.mktemp("eagle") / "EAGLE-LLaMA3.1-tiny", model_dir, bias=False)
    llm = LLM(
        model=model_dir, speculative_config={"model": head, "num_speculative_tokens": 3, "max_model_len": 256}
    )
    assert llm.speculative_config is not None and llm.speculative_config.method == "eagle"
    _run_example(llm)


@pytest.mark.parametrize("fmt", ["original", "speculators"])
def test_eagle3_offline_example(model_dir: str, tmp_path_factory: pytest.TempPathFactory, fmt: str) -> None:
    """Seed 003's EAGLE-3 config (``method`` must say eagle3) with a head in each published format."""
    from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3

    head = write_eagle3(
        tmp_path_factory.mktemp("e3") / "draft", model_dir, fmt, draft_vocab=64, aux_ids=[0, 1, 2]
    )
    if fmt == "original":  # the original format names no aux layers: a 2-layer target has no (2, 1, -1)
        with pytest.raises(ValueError, match=r"eagle_aux_hidden_state_layer_ids must be 3 layer ids"):
            LLM(
                model=model_dir,
                speculative_config={
                    "adaptive_draft_length": False,
                    "method": "eagle3",
                    "model": head,
                    "num_speculative_tokens": 3,
                },
            )
        return
    llm = LLM(
        model=model_dir,
        speculative_config={
            "adaptive_draft_length": False,
            "method": "eagle3",
            "model": head,
            "num_speculative_tokens": 3,
        },
    )
    _run_example(llm)
    assert llm.metrics.total.num_draft_tokens > 0


def test_speculators_checkpoint_alone_selects_eagle3_and_k(
    model_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3

    head = write_eagle3(tmp_path_factory.mktemp("e3") / "draft", model_dir, "speculators", aux_ids=[0, 1, 2])
    llm = LLM(model=model_dir, speculative_config={"model": head})
    spec = llm.speculative_config
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("eagle3", 3)
    with pytest.raises(
        ValueError, match=r"method='medusa' does not match the draft checkpoint .* 'eagle3' checkpoint"
    ):
        LLM(
            model=model_dir,
            speculative_config={
                "adaptive_draft_length": False,
                "method": "medusa",
                "model": head,
                "num_speculative_tokens": 2,
            },
        )


def test_mtp_online_example_config(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Seed 003's MTP ``--speculative-config`` (a JSON string) on a GLM-style checkpoint with MTP layers."""
    from test_drafter_mtp import write_glm_with_mtp

    target = write_glm_with_mtp(tmp_path_factory.mktemp("mtp") / "glm", nextn=1)
    llm = LLM(
        model=target,
        seed=1024,
        max_model_len=256,
        max_num_seqs=10,
        speculative_config='{"num_speculative_tokens": 2, "method":"mtp", '
        '"disable_padded_drafter_batch": false}',
    )
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.8, top_p=0.95, max_tokens=MAX_TOKENS))
    assert len(out[0].outputs[0].token_ids) == MAX_TOKENS and out[0].outputs[0].error is None
    assert llm.metrics.total.num_draft_tokens > 0
