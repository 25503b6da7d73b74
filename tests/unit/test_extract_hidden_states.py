"""``extract_hidden_states``: the vllm-ascend guide's offline example, and the files' exact contents."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from safetensors import safe_open

from spec_backend import LLM, SamplingParams
from spec_backend.tools.tiny import make_tiny_model

LAYERS = 4  # tiny target depth


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ehs") / request.param
    return make_tiny_model(path, request.param, vocab_size=256, with_tokenizer=True, num_hidden_layers=LAYERS)


def _spec(layer_ids: Any, k: int = 1) -> dict[str, Any]:
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": k,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
    }


def _kv(path: str, connector: str = "ExampleHiddenStatesConnector") -> dict[str, Any]:
    return {
        "kv_connector": connector,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": path},
    }


def test_the_guide_example_runs_as_written(model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The seed-003 example, with ``spec_backend`` for ``vllm`` and the tiny model for Qwen3-8B."""
    import tempfile

    def main() -> None:
        with tempfile.TemporaryDirectory() as tmpdirname:
            llm = LLM(
                model=model_dir,
                tensor_parallel_size=1,
                speculative_config={
                    "method": "extract_hidden_states",
                    "num_speculative_tokens": 1,
                    "draft_model_config": {
                        "hf_config": {
                            # Layer indices to extract hidden states from
                            "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
                        }
                    },
                },
                kv_transfer_config={
                    "kv_connector": "ExampleHiddenStatesConnector",
                    "kv_role": "kv_producer",
                    "kv_connector_extra_config": {
                        "shared_storage_path": tmpdirname,
                    },
                },
            )

            prompts = ["Hello, how are you?", "What is machine learning?"]
            sampling_params = SamplingParams(max_tokens=1)
            outputs = llm.generate(prompts, sampling_params)

            for output in outputs:
                print("Prompt:", output.prompt)
                print("Prompt token ids:", output.prompt_token_ids)

                hidden_states_path = output.kv_transfer_params.get("hidden_states_path")
                print("Hidden states saved to:", hidden_states_path)

                with safe_open(hidden_states_path, "pt") as f:
                    token_ids = f.get_tensor("token_ids")
                    hidden_states = f.get_tensor("hidden_states")
                    print("Shape:", hidden_states.shape)
                    assert token_ids.tolist() == output.prompt_token_ids
                    assert tuple(hidden_states.shape) == (len(output.prompt_token_ids), 3, 32)

    main()
    printed = capsys.readouterr().out
    assert printed.count("Shape: torch.Size([") == 2


def _transformers_states(model_dir: str, tokens: list[int]) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """transformers' ``hidden_states`` (index l = input of layer l) and the last layer's pre-norm output."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    kept: dict[str, torch.Tensor] = {}
    model.model.layers[-1].register_forward_hook(
        lambda m, a, out: kept.setdefault("pre", out if isinstance(out, torch.Tensor) else out[0])
    )
    with torch.no_grad():
        out = model(torch.tensor([tokens]), output_hidden_states=True)
    return out.hidden_states, kept["pre"][0]


def test_files_hold_transformers_hidden_states(model_dir: str, tmp_path: Any) -> None:
    ids = [0, 2, LAYERS]  # LAYERS = the last layer's output before the final norm
    llm = LLM(model_dir, speculative_config=_spec(ids), kv_transfer_config=_kv(str(tmp_path)))
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42]]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        path = out.kv_transfer_params["hidden_states_path"]
        assert os.path.dirname(path) == str(tmp_path)
        with safe_open(path, "pt") as f:
            token_ids, hidden = f.get_tensor("token_ids"), f.get_tensor("hidden_states")
        seq = prompt + out.outputs[0].token_ids[:-1]  # every token whose forward ran
        assert token_ids.tolist() == seq and token_ids.dtype == torch.int64
        assert tuple(hidden.shape) == (len(seq), 3, 32)
        states, pre_norm = _transformers_states(model_dir, seq)
        for j, layer in enumerate(ids[:2]):
            torch.testing.assert_close(hidden[:, j], states[layer][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(hidden[:, 2], pre_norm, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(pre_norm, states[LAYERS][0], atol=1e-3)  # control: id L is not post-norm


@pytest.mark.parametrize(
    ("spec", "kv", "message"),
    [
        (_spec([1], k=2), "ok", "requires num_speculative_tokens=1, got 2"),
        (_spec(None), "ok", "needs draft_model_config=.*eagle_aux_hidden_state_layer_ids"),
        (_spec([1, LAYERS + 1]), "ok", r"must be distinct ids in 0\.\.4"),
        (_spec([1]), None, "needs kv_transfer_config="),
        (_spec([1]), "wrong-connector", "kv_connector='ExampleHiddenStatesConnector'"),
        (_spec([1]), "file", "is not a writable directory"),
    ],
)
def test_bad_configuration_fails_before_any_work(
    model_dir: str, tmp_path: Any, spec: dict[str, Any], kv: str | None, message: str
) -> None:
    config = None
    if kv == "ok":
        config = _kv(str(tmp_path))
    elif kv == "wrong-connector":
        config = _kv(str(tmp_path), connector="SharedStorageConnector")
    elif kv == "file":
        blocker = tmp_path / "a-file"
        blocker.write_text("x")
        config = _kv(str(blocker / "sub"))
    with pytest.raises(ValueError, match=message):
        LLM(model_dir, speculative_config=spec, kv_transfer_config=config)


def test_kv_transfer_config_needs_the_method(model_dir: str, tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="kv_transfer_config needs speculative_config"):
        LLM(model_dir, kv_transfer_config=_kv(str(tmp_path)))
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(
        ValueError, match="kv_transfer_config is used only with method='extract_hidden_states'"
    ):
        LLM(model_dir, speculative_config=ngram, kv_transfer_config=_kv(str(tmp_path)))
