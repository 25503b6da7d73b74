"""The runner's lean forward (``runtime/lean_forward``): which models take it, engine steps bit for bit those
of the model's own forward (log-probabilities, seeded samples, the hidden states an EAGLE-3 head reads),
on the reference and the cpu backend, and the model's forward wherever a hook sits on a skipped one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import PROMPTS, fixed_ngram, one_thread  # noqa: F401 - autouse

from spec_backend.engine import LLM, SamplingParams
from spec_backend.runtime.lean_forward import LeanForward, lean_forward
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3
from spec_backend.tools.tiny import make_tiny_model

GQA = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
GREEDY_LOGPROBS = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=3)
SEEDED = SamplingParams(temperature=0.9, top_k=20, max_tokens=20, ignore_eos=True, seed=5, logprobs=1)


def _mistral(path: Path) -> str:
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(1)
    MistralForCausalLM(MistralConfig(vocab_size=128, num_hidden_layers=2, **GQA)).save_pretrained(path)
    return str(path)


def _outputs(llm: LLM) -> list[Any]:
    return [
        [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(PROMPTS, params)]
        for params in (GREEDY_LOGPROBS, SEEDED)
    ]


def _pair(folder: str, spec: dict[str, Any] | None, backend: str) -> tuple[LLM, LLM]:
    """Two engines on ``folder``: the model's own forward, and the lean one."""
    own, lean = (
        LLM(folder, speculative_config=spec, backend=backend),
        LLM(folder, speculative_config=spec, backend=backend),
    )
    assert isinstance(own.engine.runner.lean, LeanForward) and isinstance(
        lean.engine.runner.lean, LeanForward
    )
    own.engine.runner.lean = None
    return own, lean


def test_only_registered_models_take_it(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    llama = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "llama", **GQA))
    assert isinstance(lean_forward(llama, True), LeanForward)
    assert isinstance(
        lean_forward(AutoModelForCausalLM.from_pretrained(_mistral(tmp_path / "m")), True), LeanForward
    )
    assert (
        lean_forward(AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "q", "qwen2")), True)
        is None
    )
    assert lean_forward(llama.model, True) is None  # a decoder alone is no causal LM


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_engine_steps_equal_the_models_forward_bit_for_bit(tmp_path: Path, arch: str, backend: str) -> None:
    """Ragged prompts batched with verify steps of up to 4 rows, greedy with log-probabilities and seeded
    top-k sampling: tokens and log-probabilities (floats) equal the model's own forward's."""
    if backend == "cpu":
        from engine_fixtures import require_native_kernels

        require_native_kernels()
    folder = make_tiny_model(tmp_path / arch, **GQA) if arch == "llama" else _mistral(tmp_path / arch)
    own, lean = _pair(folder, fixed_ngram(3, 3), backend)
    assert _outputs(lean) == _outputs(own)
    assert lean.metrics.total.num_accepted_tokens > 0


def test_hidden_states_a_drafter_reads_are_the_same(tmp_path: Path) -> None:
    """An EAGLE-3 head reads the residual streams of layers (0, 1, 2) through the capture's hooks on the
    layers: its drafts, hence the accepted counts, and the outputs equal the model's own forward's."""
    target = make_tiny_model(tmp_path / "target", num_hidden_layers=3, seed=2)
    head = write_eagle3(tmp_path / "e3", target, "speculators", aux_ids=[0, 1, 2])
    spec = {"adaptive_draft_length": False, "method": "eagle3", "model": head, "num_speculative_tokens": 3}
    own, lean = _pair(target, spec, "reference")
    assert _outputs(lean) == _outputs(own)
    assert lean.metrics.total.num_draft_tokens == own.metrics.total.num_draft_tokens > 0
    assert lean.metrics.total.num_accepted_tokens == own.metrics.total.num_accepted_tokens


def test_a_hook_on_a_skipped_forward_runs_the_models_forward(tmp_path: Path) -> None:
    folder = make_tiny_model(tmp_path / "llama", **GQA)
    own, lean = _pair(folder, None, "reference")
    calls: list[int] = []
    handle = lean.model.model.register_forward_hook(lambda *args: calls.append(1))
    assert lean.engine.runner.lean is not None and lean.engine.runner.lean.hooked()
    assert _outputs(lean) == _outputs(own)
    assert len(calls) > lean.engine.num_steps > 0  # every decode step, and the prefills
    handle.remove()
    assert not lean.engine.runner.lean.hooked()
