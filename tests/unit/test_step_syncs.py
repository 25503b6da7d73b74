"""A decode step reads the device at most once: the emitted tokens (with each request's verified draft
count) reach the host in one copy; sampling parameters live in per-slot device tensors with their host
flags (``SamplingState``), and drafts with ids outside the vocabulary become placeholders on the device
instead of being counted on the host.

On a CPU every tensor is a host tensor, so the test counts what would synchronise on an accelerator:
every call that turns a tensor into host values (``tolist``, ``item``, ``cpu``, ``numpy``, ``bool``,
``int``, ``float``, ``index``) while a decode step runs, drafting included. Before the per-slot state a
step made three (the sampling flags, the output, the drafts' valid prefix).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.contract import DraftOutput
from spec_backend.testing import host_reads
from spec_backend.testing.fixtures.draft_checkpoints import (
    write_dflash,
    write_eagle3,
    write_medusa,
    write_mlp_speculator,
)
from spec_backend.tools.tiny import make_tiny_model


def reads_per_decode_step(llm: LLM, params: SamplingParams) -> list[int]:
    """Run ``PROMPTS`` and return the host reads of each decode step."""
    return host_reads.reads_per_decode_step(llm, PROMPTS, params)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("syncs"), "llama")


SPECS: dict[str, Callable[[str, Path], dict[str, Any] | None]] = {
    "plain": lambda t, p: None,
    "ngram": lambda t, p: {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
    },
    "ngram_gpu": lambda t, p: {
        "adaptive_draft_length": False,
        "method": "ngram_gpu",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
    },
    "suffix": lambda t, p: {"adaptive_draft_length": False, "method": "suffix", "num_speculative_tokens": 3},
    "draft_model": lambda t, p: {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": t,
        "num_speculative_tokens": 3,
    },
    "medusa": lambda t, p: {
        "adaptive_draft_length": False,
        "method": "medusa",
        "model": write_medusa(p / "medusa", 32, 128, 3, "vllm"),
        "num_speculative_tokens": 3,
    },
    "mlp_speculator": lambda t, p: {
        "adaptive_draft_length": False,
        "method": "mlp_speculator",
        "model": write_mlp_speculator(p / "mlp", 32, 128, 16, 3, tied=False),
        "num_speculative_tokens": 3,
    },
    "dflash": lambda t, p: {
        "adaptive_draft_length": False,
        "method": "dflash",
        "model": write_dflash(p / "dflash", t, layers=1, target_layer_ids=[0]),
        "num_speculative_tokens": 3,
    },
    "eagle3": lambda t, p: {
        "adaptive_draft_length": False,
        "method": "eagle3",
        "model": write_eagle3(p / "e3", t, "speculators", aux_ids=[0, 1, 2]),
        "num_speculative_tokens": 3,
    },
}
PARAMS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=12),
    "sampled": SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3, max_tokens=12),
}


@pytest.mark.parametrize("params", list(PARAMS))
@pytest.mark.parametrize("method", list(SPECS))
def test_a_decode_step_reads_the_device_once(target: str, tmp_path: Path, method: str, params: str) -> None:
    llm = LLM(
        target, dtype="float64", speculative_config=SPECS[method](target, tmp_path), backend="reference"
    )
    counts = reads_per_decode_step(llm, PARAMS[params])
    assert counts and max(counts) == 1, counts


def test_the_counter_sees_a_read(target: str) -> None:
    """Negative control: a step that reads a tensor back once more is counted."""
    llm = LLM(target, dtype="float64", backend="reference")
    runner: Any = llm.engine.runner
    forward = runner.forward

    def reading(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        out.logits.sum().item()
        return out

    runner.forward = reading
    assert max(reads_per_decode_step(llm, PARAMS["greedy"])) == 2


def test_drafts_outside_the_vocabulary_end_where_they_start(target: str) -> None:
    """A drafter whose drafts turn invalid part-way: the output is plain decoding's, and only the drafts
    before the first invalid id are counted as drafted (they are placeholders on the device)."""
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
    }
    llm = LLM(target, dtype="float64", speculative_config=spec, backend="reference")
    drafter: Any = llm.engine.drafter
    propose, seen = drafter.propose, collections.Counter()

    def invalid_tail(inputs: Any) -> DraftOutput:
        out = propose(inputs)
        ids = out.token_ids.clone()  # [B, K]
        ids[:, 1:] = 10_000  # outside the vocabulary of 128
        for count in out.num_draft_tokens:
            seen["drafted"] += min(count, 1)
        return DraftOutput(ids, out.num_draft_tokens, out.draft_probs, out.errors)

    drafter.propose = invalid_tail
    params = PARAMS["greedy"]
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    plain = LLM(target, dtype="float64", backend="reference").generate(PROMPTS, params)
    assert got == [o.outputs[0].token_ids for o in plain]
    assert llm.metrics.total.num_draft_tokens == seen["drafted"] > 0
