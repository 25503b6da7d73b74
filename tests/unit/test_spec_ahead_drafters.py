"""Drafting ahead (``engine/spec_ahead.py``) by each drafter that does it, against the synchronous engine:
every verify step's drafts, not only the tokens (a random head's drafts are rarely accepted, so its
acceptance counts cannot tell two drafters apart), and an EAGLE-style head's drafts over the flight's
hidden states (``proposers/eagle_ahead.py``): one that drafts what the target's first layer predicts
(accepted often, not always), and an EAGLE-3 head over auxiliary layers. The parts on their own:
``test_spec_ahead_parts.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse
from test_spec_ahead import (  # noqa: F401 - fixtures (no_fallback: autouse)
    FIXED,
    MIXED,
    K,
    _ahead,
    _draft_model,
    _llm,
    _run,
    first_layer_draft,
    no_fallback,
)

from spec_backend.engine import SamplingParams
from spec_backend.proposers.contract import FlightTokens
from spec_backend.runtime.captured_verify import CapturedVerify
from spec_backend.tools.tiny import make_tiny_model


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("spec-ahead-drafters"), "llama")


@pytest.fixture(scope="module")
def shallow(target: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return first_layer_draft(target, tmp_path_factory.mktemp("shallow-draft"))


def write_first_layer_eagle(path: Path, target_dir: str) -> str:
    """An EAGLE-1 head in its published format that drafts about what the target's first layer predicts:
    ``fc`` takes the token's embedding plus a little of the target's hidden state (whose rows then move
    some drafts), layer 0 (no input norm in EAGLE-1) passes it through (zero output projections), layer 1
    is the target's layer 0; the target's LM head and all-ones final norm give the argmax a one-layer
    target would."""
    from safetensors.torch import load_file, save_file

    with open(os.path.join(target_dir, "config.json"), encoding="utf-8") as f:
        cfg: dict[str, Any] = json.load(f)
    cfg.update({"num_hidden_layers": 2, "bias": False, "architectures": ["LlamaForCausalLM"]})
    hidden, prefix = int(cfg["hidden_size"]), "model.layers.0."
    weights = load_file(os.path.join(target_dir, "model.safetensors"))
    first = {name[len(prefix) :]: t for name, t in weights.items() if name.startswith(prefix)}
    silent = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
    # [H, 2H]: the embedding, and a little of the target's hidden state (so the rows fed matter)
    tensors = {"fc.weight": torch.cat([torch.eye(hidden), 0.01 * torch.eye(hidden)], dim=1)}
    tensors |= {f"layers.1.{name}": t for name, t in first.items()}
    tensors |= {
        f"layers.0.{name}": torch.zeros_like(t) if name in silent else t
        for name, t in first.items()
        if name != "input_layernorm.weight"
    }
    path.mkdir(parents=True, exist_ok=True)
    save_file({name: t.clone().contiguous() for name, t in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def write_heads(target: str, root: Path) -> dict[str, str]:
    """A head checkpoint per method in its published format, for ``target``."""
    from spec_backend.testing.fixtures import draft_checkpoints as w

    return {
        "eagle": write_first_layer_eagle(root / "eagle", target),
        "eagle3": w.write_eagle3(root / "eagle3", target, "speculators", draft_vocab=64, aux_ids=[0, 1, 2]),
        "medusa": w.write_medusa(root / "medusa", 32, 128, K, "vllm"),
        "mlp_speculator": w.write_mlp_speculator(root / "mlp", 32, 128, 16, K, tied=False),
    }


@pytest.fixture(scope="module")
def heads(target: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_heads(target, tmp_path_factory.mktemp("heads"))


def _spec(drafter: str, shallow: str, heads: dict[str, str]) -> dict[str, Any]:
    """``drafter``'s speculative config, K drafts every step."""
    if drafter == "ngram_gpu":
        return FIXED
    if drafter == "draft_model":
        return _draft_model(shallow)
    return {
        "method": drafter,
        "model": heads[drafter],
        "num_speculative_tokens": K,
        "adaptive_draft_length": False,
    }


def _verified(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[torch.Tensor]]:
    """Every verify step's query tokens ``[B, K+1]`` (the first token, then the drafts), per captured
    sampler (one per engine)."""
    seen: dict[int, list[torch.Tensor]] = {}
    launch = CapturedVerify.launch

    def spy(self: CapturedVerify, kind: str, logits: torch.Tensor, tokens: torch.Tensor, *rest: Any) -> Any:
        seen.setdefault(id(self), []).append(tokens.clone())
        return launch(self, kind, logits, tokens, *rest)

    monkeypatch.setattr(CapturedVerify, "launch", spy)
    return seen


def _drafts_by_request(llm: Any, monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, int], list[int]]:
    """Every draft the engine's drafter makes, by request and its tokens then: (request id, tokens) ->
    drafts within the budget (synchronous draft-next, or drafted ahead from a flight's tokens)."""
    drafter, seen = llm.engine.drafter, {}
    propose, propose_ahead = drafter.propose, drafter.propose_ahead

    def spy(inputs: Any) -> Any:
        out = propose(inputs)
        for b, request in enumerate(inputs.requests):
            seen[request.request_id, request.num_tokens] = out.token_ids[
                b, : out.num_draft_tokens[b]
            ].tolist()
        return out

    def spy_ahead(requests: Any, flight: FlightTokens, budgets: Any) -> torch.Tensor:
        drafts = propose_ahead(requests, flight, budgets)
        after = (flight.before + flight.counts).tolist()
        for b, request in enumerate(requests):
            seen[request.request_id, after[b]] = drafts[b, : budgets[b]].tolist()
        return drafts  # type: ignore[no-any-return]

    monkeypatch.setattr(drafter, "propose", spy)
    monkeypatch.setattr(drafter, "propose_ahead", spy_ahead)
    return seen


def _steps(verified: dict[int, list[torch.Tensor]], llm: Any) -> list[list[list[int]]]:
    return [t.tolist() for t in verified[id(llm.engine.captured.verify)]]


@pytest.mark.parametrize(
    "drafter", ["ngram_gpu", "draft_model", "eagle", "eagle3", "medusa", "mlp_speculator"]
)
def test_every_verify_steps_drafts_are_the_synchronous_ones(
    target: str, shallow: str, heads: dict[str, str], drafter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy and sampled requests, four slots: every verify step's drafts, every token and every
    request's draft and acceptance counts equal the synchronous engine's, many steps went ahead, and
    drafts were accepted (but for the random heads, EAGLE-3, Medusa and MLPSpeculator, whose drafts are
    compared step by step all the same; ``test_head_drafters_draft_ahead_from_the_bonus_tokens_row``
    covers accepted counts for the last two)."""
    spec, verified = _spec(drafter, shallow, heads), _verified(monkeypatch)
    sync = _llm(target, False, speculative_config=spec)
    expected = _run(sync, PROMPTS, MIXED)
    llm = _llm(target, True, speculative_config=spec)
    assert _run(llm, PROMPTS, MIXED) == expected
    assert llm.engine.num_steps == sync.engine.num_steps and _ahead(llm) > llm.engine.num_steps // 3
    steps = _steps(verified, sync)
    assert _steps(verified, llm) == steps and len(steps) > 20
    accepted = sync.metrics.total.num_accepted_tokens
    random_head = drafter in ("eagle3", "medusa", "mlp_speculator")  # drafts rarely accepted
    assert llm.metrics.total.num_accepted_tokens == accepted and (accepted > 20 or random_head)


@pytest.mark.parametrize("drafter", ["eagle", "eagle3"])
def test_a_head_follows_moved_slots_and_catches_up_after_speculation_was_off(
    target: str, heads: dict[str, str], drafter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests ending at tokens of their own mid-flight (their slots move), admissions while steps go
    ahead, and speculation off at four requests (``disable_by_batch_size``): the head's catch-up runs at
    every synchronous step, so steps go ahead again once speculation is back on; every draft the
    synchronous engine makes, the engine going ahead makes for the same request at the same tokens."""
    spec = _spec(drafter, "", heads) | {"disable_by_batch_size": 4}
    prompts = [*PROMPTS, [7, 8, 7, 8, 7, 8, 9], [3, 1, 3, 1, 3]]
    greedy = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (90, 14, 41, 30, 9, 80)]
    first = _run(_llm(target, False, max_num_seqs=4, speculative_config=spec), prompts, greedy)
    stops = [
        SamplingParams(
            temperature=0.0, max_tokens=p.max_tokens, stop_token_ids=[t[j]] if len(t) > j + 1 else None
        )
        for (t, *_), p, j in zip(first, greedy, (70, 11, 25, 12, 3, 60), strict=True)
    ]
    sync = _llm(target, False, max_num_seqs=4, speculative_config=spec)
    drafted = _drafts_by_request(sync, monkeypatch)
    expected = _run(sync, prompts, stops)
    llm = _llm(target, True, max_num_seqs=4, speculative_config=spec)
    drafted_ahead = _drafts_by_request(llm, monkeypatch)
    assert _run(llm, prompts, stops) == expected and _ahead(llm) > 10
    assert sum(reason == "stop" for _, reason, *_ in expected) >= 3
    # the same request at the same tokens drafts the same (where both drafted: a request ending at the
    # step in flight leaves, and one waiting is admitted, a step later, so speculation may be on at a
    # batch size where the synchronous engine's was off, and the other way round)
    both = [key for key, drafts in drafted.items() if drafts and drafted_ahead.get(key)]
    assert len(both) > len([d for d in drafted.values() if d]) // 2
    for key in both:
        n = min(len(drafted[key]), len(drafted_ahead[key]))
        assert drafted[key][:n] == drafted_ahead[key][:n], key


@pytest.mark.parametrize("drafter", ["ngram_gpu", "draft_model"])  # drafts accepted enough to be cut
def test_steps_go_ahead_near_max_tokens_with_budgets_cut_on_the_device(
    target: str, shallow: str, heads: dict[str, str], drafter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within 2(K+1) tokens of ``max_tokens`` a request's draft budget depends on the step in flight's
    count: steps still go ahead there (``room_ahead``: unless the step in flight may end the request),
    the budget cut on the device (``within_budgets``: placeholders past it), and every verify step's
    drafts, the tokens and the step count equal the synchronous engine's (no step launched for a
    request already ended). Before, the last 2(K+1) tokens of each request stepped synchronously."""
    from spec_backend.engine import spec_ahead, stepper

    spec, verified = _spec(drafter, shallow, heads), _verified(monkeypatch)
    prompts = [*PROMPTS, [7, 8, 7, 8, 7, 8, 9], [3, 1, 3, 1, 3]]
    lengths = (23, 17, 30, 11, 26, 19)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in lengths]
    sync = _llm(target, False, max_num_seqs=6, speculative_config=spec)
    expected = _run(sync, prompts, params)
    left: list[int] = []  # the fewest tokens left to a request at each verify step launched ahead
    kept: list[int] = []  # every budget cut on the device below K
    launch, cut = stepper.launch_ahead, spec_ahead.within_budgets

    def counted(engine: Any, requests: Any, flight: Any, speculative: bool) -> Any:
        if speculative:
            left.append(min(r.remaining for r in requests))
        return launch(engine, requests, flight, speculative)

    def cut_counted(drafts: torch.Tensor, ends: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        kept.extend(b for b in (ends - after - 1).clamp(min=0).tolist() if b < K)
        return cut(drafts, ends, after)

    monkeypatch.setattr(stepper, "launch_ahead", counted)
    monkeypatch.setattr(spec_ahead, "within_budgets", cut_counted)
    llm = _llm(target, True, max_num_seqs=6, speculative_config=spec)
    assert _run(llm, prompts, params) == expected
    assert llm.engine.num_steps == sync.engine.num_steps
    # a step ahead whose every budget was cut to 0 replays the verify graph with placeholders where the
    # synchronous engine replays its one-token step (whose sampler is another): the steps with drafts
    drafting = [[step for step in _steps(verified, e) if any(d >= 0 for row in step for d in row[1:])]
                for e in (sync, llm)]  # fmt: skip
    assert drafting[1] == drafting[0] and len(drafting[0]) > 5
    assert any(n < 2 * (K + 1) for n in left) and min(left) > K + 1
    assert kept  # budgets were cut on the device (which drafts survive: ``test_within_budgets``)


@pytest.mark.parametrize("drafter", ["eagle", "eagle3"])
def test_a_drained_flight_feeds_the_head_the_rows_of_its_live_requests(
    target: str, heads: dict[str, str], drafter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three slots, five requests, the first ending at a token of its own while its next step flies: that
    flight lands without a successor (an admission waits) after the slots moved, and the synchronous
    draft-next feeds the head each live request's own hidden-state rows (``StepResult`` rows by request,
    ``request_rows``). Failed before (review): it fed slot b's rows of the flight, those of the request
    that sat there at launch, and the moved request drafted otherwise from then on."""
    from spec_backend.engine import spec_ahead

    spec = _spec(drafter, "", heads)
    prompts = [
        [5, 6, 7, 8, 9, 5, 6],
        [40, 41, 42],
        [11, 12, 13, 14, 11, 12],
        [90, 3, 90, 3, 90],
        [7, 8, 7, 8, 9],
    ]
    greedy = [SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True) for _ in prompts]
    first = _run(_llm(target, False, max_num_seqs=3, speculative_config=spec), prompts, greedy)
    stop = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True, stop_token_ids=[first[0][0][15]])
    params = [stop, *greedy[1:]]
    sync = _llm(target, False, max_num_seqs=3, speculative_config=spec)
    drafted = _drafts_by_request(sync, monkeypatch)
    expected = _run(sync, prompts, params)
    rebuilt: list[int] = []
    by_request = spec_ahead.request_rows

    def counted(result: Any, index: Any, cached: Any) -> Any:
        rebuilt.append(len(index))
        return by_request(result, index, cached)

    monkeypatch.setattr(spec_ahead, "request_rows", counted)
    llm = _llm(target, True, max_num_seqs=3, speculative_config=spec)
    drafted_ahead = _drafts_by_request(llm, monkeypatch)
    assert _run(llm, prompts, params) == expected and expected[0][1] == "stop"
    assert rebuilt and _ahead(llm) > 20
    both = [key for key, drafts in drafted.items() if drafts and drafted_ahead.get(key)]
    assert len(both) > len([d for d in drafted.values() if d]) // 2
    # (drafted ahead: K, cut to the budget on the device afterwards; the synchronous ones: the budget)
    assert [drafted[key] for key in both] == [drafted_ahead[key][: len(drafted[key])] for key in both]


def test_a_heads_committed_rows_graph_is_captured_at_the_verify_steps_sizes(
    target: str, heads: dict[str, str]
) -> None:
    """The head's K+1-rows graph is planned as the verify step's capture sizes (the backend's token cap,
    not K+1 times the one-row graph's: review), and a batch whose rows it cannot hold does not go ahead."""
    llm = _llm(target, True, max_num_seqs=8, speculative_config=_spec("eagle3", "", heads))
    drafter: Any = llm.engine.drafter
    step, verify = drafter.step_graph, llm.engine.captured
    assert verify is not None and step.committed_sizes == list(verify.graph.capture_sizes)
    assert max(step.committed_sizes) == 16 and max(step.capture_sizes) == 8  # the simulated cap: 16
    for _ in range(5):
        drafter.cache.add_slot()
    assert not step.goes_ahead(5)  # 5 * (K + 1) rows > 16
    drafter.cache.pop_slot()
    assert step.goes_ahead(4)
