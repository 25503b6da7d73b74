"""Bad input fails fast with clear messages; SamplingParams validation."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend.engine import LLM, ModelLoadError, SamplingParams
from spec_backend.runtime.sources import resolve_model
from spec_backend.testing.fixtures.draft_checkpoints import write_mlp_speculator
from spec_backend.tools.tiny import make_tiny_model


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model_dir = make_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", vocab_size=64)
    yield LLM(
        model_dir, max_model_len=32, speculative_config={"method": "ngram", "num_speculative_tokens": 3}
    )
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": "x"}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_sampling_params_validated_on_construction(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_defaults_and_normalisation() -> None:
    p = SamplingParams(stop="###")
    assert p.stop == ["###"] and p.temperature == 1.0 and p.top_k == 0 and p.max_tokens == 16
    assert SamplingParams(temperature=0).greedy


@pytest.mark.parametrize(
    ("prompts", "match"),
    [
        ([[]], "prompt 0 is empty"),
        ([[1, 2], []], "prompt 1 is empty"),
        ([list(range(1, 33))], "max_model_len=32"),
        ([[1, 2, 999]], "outside the vocabulary"),
        (["hello"], "no tokenizer"),
        ([], "at least one prompt"),
        ([[1, "a"]], "token ids"),
    ],
)
def test_bad_prompts_rejected_before_any_work(llm: LLM, prompts: list, match: str) -> None:
    steps = llm.engine.num_steps
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts, SamplingParams(max_tokens=4))
    assert llm.engine.num_steps == steps
    assert not llm.engine.has_unfinished()


def test_params_count_must_match(llm: LLM) -> None:
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        llm.generate([[1], [2], [3]], [SamplingParams(), SamplingParams()])


def test_generation_stops_at_max_model_len(llm: LLM) -> None:
    out = llm.generate([[1, 2, 3, 4] * 7], SamplingParams(temperature=0, max_tokens=50))[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 32


def test_a_batch_cap_raised_past_the_slots_queues_requests(tmp_path: Path) -> None:
    """``engine.max_num_seqs`` raised after start-up above the caches' slots (``bench e2e``'s warm-up did)
    admits only as many requests as there are slots; the rest wait. Before: every request of the step
    ended with an error ("all 1 KV cache slots are in use")."""
    model_dir = make_tiny_model(tmp_path / "tiny", "llama", vocab_size=64)
    llm = LLM(model_dir, max_num_seqs=1, max_model_len=32)
    alone = [llm.generate([p], SamplingParams(temperature=0, max_tokens=6))[0] for p in ([1, 2, 3], [4, 5])]
    llm.engine.max_num_seqs = 2
    both = llm.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0, max_tokens=6))
    assert [o.outputs[0].finish_reason for o in both] == ["length", "length"]
    assert [o.outputs[0].token_ids for o in both] == [o.outputs[0].token_ids for o in alone]


def test_unknown_model_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="unknown model"):
        LLM(str(tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        LLM(str(tmp_path))


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "weird.gguf"
    writer = gguf.GGUFWriter(str(path), arch="notamodel")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"'notamodel'.*not supported"):
        LLM(str(path))
    assert resolve_model(str(path)).gguf_file == "weird.gguf"


def test_bad_configs_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="additional_config is not valid JSON"):
        LLM(str(tmp_path), additional_config="{not json")
    with pytest.raises(ValueError):
        LLM(str(tmp_path), speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM(str(tmp_path), max_num_seqs=0)


def test_every_registered_method_has_a_drafter() -> None:
    from spec_backend.proposers.registry import METHODS, implemented_methods

    assert implemented_methods() == tuple(METHODS)  # nothing in the registry is "not implemented"


def test_public_names_reexported() -> None:
    import spec_backend
    import spec_backend.engine as engine

    assert spec_backend.LLM is engine.LLM and spec_backend.SamplingParams is engine.SamplingParams
    assert {"LLM", "SamplingParams", "RequestOutput"} <= set(engine.__all__)


def test_unimplemented_vllm_arguments_are_named(tmp_path: Path) -> None:
    """A vLLM user's habitual arguments fail with their names, not with Python's bare TypeError."""
    with pytest.raises(
        ValueError,
        match=r"does not implement the vLLM argument\(s\) gpu_memory_utilization, trust_remote_code",
    ):
        LLM(str(tmp_path), gpu_memory_utilization=0.9, trust_remote_code=True)


def test_unimplemented_generate_and_chat_arguments_are_named(llm: LLM) -> None:
    with pytest.raises(
        ValueError, match=r"LLM.generate\(\) does not implement the vLLM argument\(s\) lora_request"
    ):
        llm.generate([[1, 2]], SamplingParams(max_tokens=1), lora_request=None)
    with pytest.raises(
        ValueError, match=r"LLM.chat\(\) does not implement the vLLM argument\(s\) chat_template, tools"
    ):
        llm.chat([{"role": "user", "content": "hi"}], tools=[], chat_template="x")


def test_a_branching_token_tree_is_refused_not_run_as_a_chain(tmp_path: Path) -> None:
    """Issue 42: ``speculative_token_tree`` was validated and then ignored (a 6-node tree verified a
    chain). A tree that branches is refused for methods that draft chains (``mlp_speculator`` here), as
    is a chain of another length than K; the chain of K (what is run) is accepted."""
    target = make_tiny_model(tmp_path / "t", "llama", vocab_size=64)
    head = write_mlp_speculator(tmp_path / "m", 32, 64, 16, 2, tied=False)
    spec = {"method": "mlp_speculator", "model": head, "num_speculative_tokens": 2}
    for tree in ("[(0,), (1,), (0, 0)]", "[(0,)]"):
        with pytest.raises(
            ValueError, match=r"drafts a chain of num_speculative_tokens=2 tokens.*mlp_speculator"
        ):
            LLM(target, speculative_config={**spec, "speculative_token_tree": tree})
    llm = LLM(target, speculative_config={**spec, "speculative_token_tree": "[(0,), (0, 0)]"})
    assert llm.generate([[3, 4, 5]], SamplingParams(temperature=0.0, max_tokens=4))[0].outputs[0].token_ids
