"""Shared pieces of the engine tests: ragged prompts the drafters find matches in, one intra-op thread."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from spec_backend.backends.base import CapturePolicy, GraphFn, GraphRunner
from spec_backend.backends.graph_common import PaddedGraphRunner, SimulatedGraphDriver
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.engine import LLM, SamplingParams

# repetitive prompts of different lengths (12, 3, 19, 5), so the drafters find matches
PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6],
    [40, 41, 42],
    [11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13],
    [90, 3, 90, 3, 90],
]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest (and least disturbed by other processes) on one intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def fixed_ngram(k: int, lookup_max: int, lookup_min: int = 1) -> dict[str, Any]:
    """The n-gram drafter's ``speculative_config`` drafting ``k`` every step (``adaptive_draft_length``
    off): tests of the verify path need every step verified, whatever the machine's timing."""
    return {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_max": lookup_max,
        "prompt_lookup_min": lookup_min,
        "adaptive_draft_length": False,
    }


def record_drafts(llm: LLM, tree: bool = False) -> list[list[int]]:
    """Wrap ``llm``'s drafter so each step's draft ids of the batch's first request are recorded (its
    tree's nodes with ``tree``)."""
    seen: list[list[int]] = []
    drafter: Any = llm.engine.drafter
    name = "propose_tree" if tree else "propose"
    propose = getattr(drafter, name)

    def spy(*args: Any) -> Any:
        out = propose(*args)
        seen.append(out.token_ids[0].tolist())
        return out

    setattr(drafter, name, spy)
    return seen


def draft_history(
    llm: LLM, prompt: list[int], max_tokens: int
) -> tuple[list[int], list[tuple[int, list[int]]]]:
    """Greedy generation of ``prompt`` alone: (prompt + output tokens, and per step the number of tokens
    committed when the drafter proposed and the drafts it proposed within its budget)."""
    drafter: Any = llm.engine.drafter
    propose, seen = drafter.propose, []

    def spy(inputs: Any) -> Any:
        out = propose(inputs)
        seen.append((inputs.requests[0].num_tokens, out.token_ids[0, : out.num_draft_tokens[0]].tolist()))
        return out

    drafter.propose = spy
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens))[0].outputs[0]
    return prompt + out.token_ids, seen


def check_rebuilds(
    llm: LLM, oracle: Any, prompts: tuple[list[int], ...] = ([40], PROMPTS[0]), max_tokens: int = 10
) -> None:
    """Every step's drafts equal ``oracle(committed tokens)`` (a rebuild from scratch), for a one-token
    prompt (the first drafts then come from the position-0 row) and a longer one."""
    for prompt in prompts:
        tokens, seen = draft_history(llm, prompt, max_tokens)
        assert len(seen) >= 3
        for n, drafts in seen:
            assert drafts == oracle(tokens[:n])[: len(drafts)], f"drafts after {n} tokens"


def check_greedy_identity(
    target_dir: str, expected: list[list[int]], spec: dict[str, Any], drafter_type: type
) -> LLM:
    """``spec``'s drafter (of ``drafter_type``) drafts, and greedy output is still ``expected``; every
    cache slot is freed afterwards."""
    llm = LLM(target_dir, dtype="float64", speculative_config=spec)
    assert isinstance(llm.engine.drafter, drafter_type)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    assert llm.metrics.total.num_draft_tokens > 0
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()
    return llm


def require_native_kernels() -> None:
    """Skip where no C++ compiler can build ``cpu/native.py``'s kernels; where one exists the build
    must work (a failure there is a defect, not a reason to skip)."""
    import os
    import shutil

    from spec_backend.cpu.native import NATIVE_ENV, native_kernel_error

    if os.environ.get(NATIVE_ENV) == "0":
        pytest.skip(f"the native kernels are turned off ({NATIVE_ENV}=0)")
    error = native_kernel_error()
    if error is not None and shutil.which("g++") is None:
        pytest.skip(f"no C++ compiler to build the native kernels: {error}")
    assert error is None, error


def check_speculation_is_lossless(llm: LLM) -> list[list[int]]:
    """``llm`` (speculation on) drafts and accepts on ``PROMPTS``, and its greedy output equals its plain
    output, batched and one prompt at a time; returns that output. Leaves speculation off."""
    speculative = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert llm.metrics.total.num_accepted_tokens > 0
    llm.set_speculation(False)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == speculative
    assert [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS] == speculative  # alone
    return speculative


class CapturingReference(ReferenceBackend):
    """The reference backend with graph capture on over the strict simulated driver (a host read inside a
    captured callable raises, as a device graph refuses or freezes it): captured verify steps feed every
    request K+1 tokens (placeholders past its drafts), padded to the capture size, and read whole cache
    slots. ``runners`` counts their replays."""

    name = "simulated-graphs"

    def __init__(self) -> None:
        self.runners: list[PaddedGraphRunner] = []

    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        return CapturePolicy(max_capture_size=16, graph_budget=None, enabled=True)

    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        runner = PaddedGraphRunner(fn, capture_sizes, SimulatedGraphDriver(strict=True), progress=False)
        self.runners.append(runner)
        return runner
