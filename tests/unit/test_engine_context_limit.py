"""Speculation at the end of the context: no request ever holds more than ``max_model_len`` tokens.

A step that verifies K drafts emits up to K+1 tokens (the accepted drafts and the bonus token). Near the
end of the context the drafts must be capped so that prompt + output never exceeds ``max_model_len``;
otherwise the bonus token lands one past the limit and the output differs from plain decoding by an
extra token (issue 36, item 1: `draft_model` drafting with itself, K = 5, a 108-token prompt, limit 128:
plain gave 20 tokens, speculation 21). Every method must stop where plain decoding stops, token for
token, with ``finish_reason="length"``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_fixtures import one_thread  # noqa: F401  (module fixture: one intra-op thread)
from test_drafter_mtp import write_glm_with_mtp
from test_engine_graphs import SimulatedGraphBackend, forwards

from spec_backend.engine import LLM, SamplingParams
from spec_backend.testing.fixtures import draft_checkpoints as ckpt
from spec_backend.tools.tiny import make_tiny_model

LIMIT = 128
K = 5
# a cycle the drafters find matches in, cut at lengths that leave 20, 6, 5, 2 and 1 position(s)
PROMPTS = [[5 + (i % 7) for i in range(n)] for n in (108, 122, 123, 126, 127)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)

Spec = Callable[[str, Path], dict[str, Any]]


def _model(method: str, path: str) -> dict[str, Any]:
    return {"adaptive_draft_length": False, "method": method, "model": path, "num_speculative_tokens": K}


SPECS: dict[str, Spec] = {
    "ngram": lambda t, p: {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": K,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 1,
    },
    "ngram_gpu": lambda t, p: {
        "adaptive_draft_length": False,
        "method": "ngram_gpu",
        "num_speculative_tokens": K,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 1,
    },
    "suffix": lambda t, p: {"adaptive_draft_length": False, "method": "suffix", "num_speculative_tokens": K},
    "draft_model(self)": lambda t, p: _model("draft_model", t),
    "draft_model": lambda t, p: _model("draft_model", make_tiny_model(p / "draft", "qwen2", seed=4)),
    "eagle": lambda t, p: _model("eagle", ckpt.write_eagle1(p / "eagle", t, bias=False)),
    "eagle3": lambda t, p: _model(
        "eagle3", ckpt.write_eagle3(p / "eagle3", t, "speculators", aux_ids=[0, 1, 2])
    ),
    "medusa": lambda t, p: _model("medusa", ckpt.write_medusa(p / "medusa", 32, 128, K, "vllm")),
    "mlp_speculator": lambda t, p: _model(
        "mlp_speculator", ckpt.write_mlp_speculator(p / "mlp", 32, 128, 16, K, tied=False)
    ),
    "dflash": lambda t, p: _model(
        "dflash", ckpt.write_dflash(p / "dflash", t, layers=1, target_layer_ids=[0])
    ),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Llama whose context is 128 positions (its own ``max_position_embeddings``)."""
    return make_tiny_model(tmp_path_factory.mktemp("short"), "llama", max_position_embeddings=LIMIT)


@pytest.fixture(scope="module")
def plain(target: str) -> list[list[int]]:
    outputs = LLM(target, dtype="float64").generate(PROMPTS, PARAMS)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [LIMIT - len(p) for p in PROMPTS]
    return [o.outputs[0].token_ids for o in outputs]


def _check_stops_where_plain_stops(llm: LLM, plain: list[list[int]]) -> int:
    """Batched, then each prompt alone: the output equals plain decoding's and fills the context exactly.
    Returns the number of drafts verified."""
    drafted = 0
    for batch in (PROMPTS, *([p] for p in PROMPTS)):
        outputs = llm.generate(batch, PARAMS)
        drafted += llm.metrics.total.num_draft_tokens
        want = plain if len(batch) > 1 else [plain[PROMPTS.index(batch[0])]]
        for prompt, out, expected in zip(batch, outputs, want, strict=True):
            got = out.outputs[0]
            assert len(prompt) + len(got.token_ids) == LIMIT, f"prompt of {len(prompt)} tokens"
            assert got.token_ids == expected and got.finish_reason == "length"
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()
    return drafted


@pytest.mark.parametrize("method", list(SPECS))
def test_speculation_stops_at_max_model_len_like_plain_decoding(
    target: str, plain: list[list[int]], tmp_path: Path, method: str
) -> None:
    llm = LLM(target, dtype="float64", speculative_config=SPECS[method](target, tmp_path))
    assert _check_stops_where_plain_stops(llm, plain) > 0


def test_self_drafting_reaches_the_end_with_every_draft_accepted(
    target: str, plain: list[list[int]], tmp_path: Path
) -> None:
    """The issue's reproduction: a draft identical to the target accepts every draft, so the last steps
    run right up to the limit; the drafts there are capped, never the emitted tokens cut after the fact."""
    llm = LLM(target, dtype="float64", speculative_config=_model("draft_model", target))
    budgets: list[tuple[int, ...]] = []  # per step, committed tokens + budget of each drafting request
    granted: list[int] = []
    propose = llm.engine.drafter.propose  # type: ignore[union-attr]

    def spy(inputs: Any) -> Any:
        granted.extend(inputs.budgets)
        pairs = zip(inputs.requests, inputs.budgets, strict=True)
        budgets.append(tuple(r.num_tokens + b for r, b in pairs if b > 0))
        return propose(inputs)

    llm.engine.drafter.propose = spy  # type: ignore[union-attr,method-assign]
    _check_stops_where_plain_stops(llm, plain)
    # a step emits at most budget + 1 tokens: committed + budget + 1 never passes the limit
    assert max(max(b, default=0) for b in budgets) == LIMIT - 1
    assert max(granted) == K  # away from the end every step drafts K (the cap binds only there)
    total = llm.metrics.total
    assert total.num_accepted_tokens == total.num_draft_tokens  # the draft is the target


def test_max_model_len_below_the_models_limit_caps_speculation_too(tmp_path: Path) -> None:
    """The limit set by ``max_model_len`` (the model allows 512) binds speculation like the model's own."""
    target = make_tiny_model(tmp_path / "long", "llama")
    plain = LLM(target, dtype="float64", max_model_len=LIMIT).generate(PROMPTS, PARAMS)
    llm = LLM(
        target, dtype="float64", max_model_len=LIMIT, speculative_config=SPECS["ngram"](target, tmp_path)
    )
    _check_stops_where_plain_stops(llm, [o.outputs[0].token_ids for o in plain])


def test_mtp_stops_at_max_model_len_like_plain_decoding(tmp_path: Path) -> None:
    glm = write_glm_with_mtp(tmp_path / "glm", nextn=1)
    plain = LLM(glm, dtype="float64", max_model_len=LIMIT).generate(PROMPTS, PARAMS)
    spec = {"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": K}
    llm = LLM(glm, dtype="float64", max_model_len=LIMIT, speculative_config=spec)
    _check_stops_where_plain_stops(llm, [o.outputs[0].token_ids for o in plain])


def test_the_captured_step_stops_at_max_model_len_like_plain_decoding(
    target: str, plain: list[list[int]], tmp_path: Path
) -> None:
    """The captured verify step widens every request to K+1 query tokens (placeholders past its drafts):
    at the end of the context it must neither overflow the cache nor emit past the limit."""
    backend = SimulatedGraphBackend()
    spec = _model("draft_model", target)
    llm = LLM(target, dtype="float64", speculative_config=spec, backend=backend, max_num_seqs=len(PROMPTS))
    assert _check_stops_where_plain_stops(llm, plain) > 0
    plain = llm.engine.captured_plain.graph if llm.engine.captured_plain else None
    steps = forwards(llm, backend)  # the samplers' graphs replay by the batch's kind
    assert all(r.replays > 0 for r in steps if r is not plain)  # the verify (and draft) steps
