"""Drafting ahead's parts on their own (``engine/spec_ahead.py``): the proposers' ``propose_ahead``
(``ngram_gpu``'s device histories; Medusa and MLPSpeculator from a flight's rows), the device-side cut
of draft budgets near ``max_tokens`` (``within_budgets``), and a request without a bound on
``max_tokens`` (its end stored per slot)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from engine_fixtures import one_thread  # noqa: F401 - autouse
from test_spec_ahead import K, _llm
from test_spec_ahead_drafters import _spec, write_heads

from spec_backend.engine import SamplingParams
from spec_backend.proposers.contract import Drafter, FlightTokens
from spec_backend.proposers.host_drafter import HostDrafter
from spec_backend.proposers.ngram import NgramProposer
from spec_backend.proposers.ngram_gpu import NgramGpuProposer
from spec_backend.sampling.metadata import PLACEHOLDER_TOKEN_ID
from spec_backend.tools.tiny import make_tiny_model


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("spec-ahead-parts"), "llama")


@pytest.fixture(scope="module")
def heads(target: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_heads(target, tmp_path_factory.mktemp("heads"))


def test_ngram_gpu_drafts_ahead_as_after_an_update() -> None:
    """``propose_ahead`` over tokens still on the device drafts what ``update`` then ``propose_on_device``
    drafts; the update that lands them afterwards writes nothing twice, and the next proposal agrees."""
    prompts = {"a": [1, 2, 3, 1, 2, 3, 1, 2], "b": [5, 6, 7, 5, 6], "c": [9, 9, 4]}
    new = {"a": [3, 1], "b": [7], "c": [9, 9, 4]}
    ahead, plain = NgramGpuProposer(3, 1, 3), NgramGpuProposer(3, 1, 3)
    for proposer in (ahead, plain):
        for rid, prompt in prompts.items():
            proposer.add_request(rid, prompt)
    ids = list(prompts)
    emitted = torch.full((3, 4), PLACEHOLDER_TOKEN_ID, dtype=torch.int64)  # [B, W]
    for b, rid in enumerate(ids):
        emitted[b, : len(new[rid])] = torch.tensor(new[rid])
    counts = torch.tensor([len(new[r]) for r in ids])
    got = ahead.propose_ahead(ids, emitted, counts, [3, 2, 3])
    for rid in ids:
        plain.update(rid, new[rid])
    want = plain.propose_on_device(ids, [3, 2, 3])
    assert torch.equal(got[1], want[1]) and got[1].tolist() == [3, 2, 3]
    for g, w, c in zip(got[0].tolist(), want[0].tolist(), got[1].tolist(), strict=True):
        assert g[:c] == w[:c]
    for rid in ids:  # the landing: counted, not queued again
        ahead.update(rid, new[rid])
    assert not ahead._pending and not any(ahead._ahead.values())
    for proposer in (ahead, plain):
        proposer.update("a", [3])
    assert ahead.propose(ids) == plain.propose(ids)


def test_only_drafters_that_draft_on_the_device_draft_ahead() -> None:
    """A host proposer behind ``HostDrafter`` does not draft ahead, and asking one that cannot says so."""
    device = torch.device("cpu")
    assert HostDrafter(NgramGpuProposer(2, 1, 2), device).drafts_ahead
    host = HostDrafter(NgramProposer(2, 1, 2), device)
    assert not host.drafts_ahead
    with pytest.raises(NotImplementedError, match="NgramProposer drafts on the host"):
        empty = torch.zeros(0, dtype=torch.int64)
        host.propose_ahead([], FlightTokens(empty.view(0, 1), empty, empty, empty), [])
    assert Drafter.drafts_ahead is False


@dataclass
class _Request:
    request_id: str
    output_token_ids: list[int]
    prompt_token_ids: list[int] = field(default_factory=lambda: [1])
    seed: int = 0
    temperature: float = 0.0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@pytest.mark.parametrize("drafter", ["medusa", "mlp_speculator"])
def test_head_drafters_draft_ahead_from_the_bonus_tokens_row(
    target: str, heads: dict[str, str], drafter: str
) -> None:
    """A flight of three requests that accepted 0, 2 and 1 drafts: ``propose_ahead`` drafts what
    ``propose`` drafts from the same step landed (each request's hidden state at its bonus token's row,
    and the bonus token), for Medusa and MLPSpeculator."""
    from spec_backend.engine import LLM
    from spec_backend.proposers.contract import AcceptedTokens, DraftInputs
    from spec_backend.step import TargetOutput, build_step_batch

    llm = LLM(target, dtype="float64", speculative_config=_spec(drafter, "", heads))
    head: Any = llm.engine.drafter
    assert head.drafts_ahead
    q, counts = K + 1, [1, 3, 2]
    gen = torch.Generator().manual_seed(0)
    final = torch.randn(3, q, 32, generator=gen, dtype=torch.float64)  # [B, q, H]
    emitted = torch.randint(0, 128, (3, q), generator=gen)  # [B, q]
    for b, c in enumerate(counts):
        emitted[b, c:] = PLACEHOLDER_TOKEN_ID
    before = torch.tensor([4, 9, 6])
    flight = FlightTokens(emitted, torch.tensor(counts), before, emitted[:, 0], final=final)
    ahead = head.propose_ahead([], flight, [K] * 3)  # [B, K]
    requests = [
        _Request(str(b), [7] * (int(before[b]) - 1) + emitted[b, :c].tolist()) for b, c in enumerate(counts)
    ]
    accepted = tuple(c - 1 for c in counts)
    inputs = DraftInputs(
        batch=build_step_batch(0, emitted.clamp(min=0), [q] * 3, [int(t) - 1 for t in before], [K] * 3),
        target=TargetOutput(logits=torch.zeros(3 * q, 128), final=final.reshape(3 * q, 32)),
        accepted=AcceptedTokens(
            tuple(r.output_token_ids[-c:] for r, c in zip(requests, counts, strict=True)), accepted, False
        ),
        requests=requests,
        budgets=(K, K, K),
    )
    assert ahead.tolist() == head.propose(inputs).token_ids.tolist()


def test_a_request_without_a_bound_on_max_tokens_is_admitted(target: str) -> None:
    """``max_tokens`` has no upper bound: a request asking for 2**63 - 2 ends at ``max_model_len`` and the
    one beside it as usual. Failed before (review): its end overflowed the slot's int64 on admission,
    which failed every request of the batch and left it unfinished."""
    llm = _llm(target, True, max_model_len=64)
    huge, usual = (SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (2**63 - 2, 20))
    outs = llm.generate([[1, 2, 3], [4, 5, 6]], [huge, usual])
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "length"]
    assert [len(o.outputs[0].token_ids) for o in outs] == [64 - 3, 20]


def test_within_budgets_cuts_each_requests_drafts_as_the_engine_budget_does() -> None:
    """A step verifying ``b`` drafts emits up to ``b + 1`` tokens: with ``ends - after`` tokens left a
    request keeps ``min(K, left - 1)`` drafts (``EngineCore._budget``), placeholders after them."""
    from spec_backend.engine.spec_ahead import within_budgets

    drafts = torch.arange(1, 6 * K + 1).view(6, K)  # [6, K]
    after = torch.tensor([10, 10, 10, 10, 10, 10])
    ends = torch.tensor([9, 10, 11, 12, 13, 40])  # left: -1, 0, 1, 2, 3, 30
    got = within_budgets(drafts, ends, after).tolist()
    keep = [0, 0, 0, 1, 2, K]
    for row, kept, original in zip(got, keep, drafts.tolist(), strict=True):
        assert row == original[:kept] + [PLACEHOLDER_TOKEN_ID] * (K - kept)
