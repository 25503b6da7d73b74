"""Token trees drafted by a separate draft model (#42): a static ``speculative_token_tree`` and EAGLE-2's
dynamic tree, each level fed under tree attention in the draft model's own cache. Every node's children
are the draft model's top tokens after that node's path (checked against a plain forward of the draft
model over context + path), greedy output equals plain decoding, the target as its own draft accepts
every level, and a PARD draft model is refused a tree by name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - one_thread is an autouse fixture

from spec_backend.engine import LLM, SamplingParams
from spec_backend.engine.tree_step import DynamicTree, TreePlan
from spec_backend.proposers.draft_model import DraftModelDrafter
from spec_backend.proposers.tree_build import dynamic_tree, fill_static
from spec_backend.testing.fixtures.dspark_checkpoints import (
    bigram_table,
    make_bigram_target,
    write_table_draft,
)
from spec_backend.tools.tiny import make_tiny_model

TREE = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"  # 6 nodes, 3 deep
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("target"), "llama", seed=0)


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Another architecture and seed with the target's vocabulary."""
    return make_tiny_model(tmp_path_factory.mktemp("draft"), "qwen2", seed=5)


@pytest.fixture(scope="module")
def plain(target: str) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in LLM(target, dtype="float64").generate(PROMPTS, GREEDY)]


def _spec(draft: str, **tree: Any) -> dict[str, Any]:
    return {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": draft,
        "num_speculative_tokens": 3,
        **tree,
    }


def _record(drafter: DraftModelDrafter, name: str) -> list[tuple[list[list[int]], Any]]:
    """Wrap ``drafter.<name>`` to record each call's request contexts and its output."""
    calls: list[tuple[list[list[int]], Any]] = []
    method = getattr(drafter, name)

    def recorded(inputs: Any, *args: Any) -> Any:
        contexts = [list(r.prompt_token_ids) + list(r.output_token_ids) for r in inputs.requests]
        out = method(inputs, *args)
        calls.append((contexts, out))
        return out

    setattr(drafter, name, recorded)
    return calls


def _dist_at(model: Any, context: list[int]) -> Any:
    """The draft model's next-token distribution after ``context + path``, by a plain forward."""

    def dist(_: int, path: tuple[int, ...]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([context + list(path)])).logits[0, -1]  # [V]
        return torch.softmax(logits.double(), dim=-1)

    return dist


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_greedy_output_with_a_draft_model_tree_equals_plain_decoding(
    target: str, draft: str, plain: list[list[int]], tree: str
) -> None:
    shape = {"speculative_token_tree": TREE} if tree == "static" else {"tree_top_k": 2, "tree_nodes": 6}
    llm = LLM(target, dtype="float64", speculative_config=_spec(draft, **shape), max_num_seqs=2)
    assert isinstance(llm.engine.tree, TreePlan if tree == "static" else DynamicTree)
    assert isinstance(llm.engine.drafter, DraftModelDrafter)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    total = llm.metrics.total
    assert total.num_draft_tokens > 3 * total.num_drafts  # more nodes verified per step than a chain's K
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_each_node_is_a_top_token_of_the_draft_model_after_its_path(
    target: str, draft: str, tree: str
) -> None:
    """The tree drafted in the engine (batched, tree attention over the draft cache, levels re-fed)
    equals the host reference over plain forwards of the draft model on context + path, every step."""
    from transformers import AutoModelForCausalLM

    shape = {"speculative_token_tree": TREE} if tree == "static" else {"tree_top_k": 2, "tree_nodes": 6}
    llm = LLM(target, dtype="float64", speculative_config=_spec(draft, **shape))
    drafter: Any = llm.engine.drafter
    calls = _record(drafter, "propose_tree" if tree == "static" else "propose_dynamic_tree")
    llm.generate(PROMPTS[:3], SamplingParams(temperature=0.0, max_tokens=10))
    model = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float64).eval()
    plan = llm.engine.tree
    parents, ranks = (plan.parents, plan.ranks) if isinstance(plan, TreePlan) else ((), ())
    assert len(calls) >= 3
    pathless = 0  # negative control: children taken after the context alone, whatever the path
    for contexts, out in calls:
        for b, context in enumerate(contexts):
            dist = _dist_at(model, context)
            want = fill_static(parents, ranks, dist) if tree == "static" else dynamic_tree(dist, 3, 2, 6)
            got_parents = out.tree_parents[b] if out.tree_parents is not None else parents
            assert (tuple(got_parents), out.token_ids[b].tolist()) == (want.parents, list(want.tokens))
            first = _dist_at(model, context)(-1, ())
            blind = fill_static(parents, ranks, lambda *_, d=first: d) if tree == "static" else None
            pathless += blind is not None and list(blind.tokens) != list(want.tokens)
    assert tree == "dynamic" or pathless > 0


def test_the_target_as_its_own_draft_accepts_every_level(target: str, plain: list[list[int]]) -> None:
    """13 tokens: the prefill's, then three steps of 3 accepted drafts and a bonus (no step's budget
    cut by ``max_tokens``)."""
    llm = LLM(target, dtype="float64", speculative_config=_spec(target, speculative_token_tree=TREE))
    params = SamplingParams(temperature=0.0, max_tokens=13)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == [p[:13] for p in plain]
    total = llm.metrics.total
    assert total.num_drafts == 3 * len(PROMPTS)
    assert total.num_accepted_tokens == 3 * total.num_drafts  # the rank-0 path, every step


def test_seeded_sampling_with_sampled_siblings_is_reproducible(target: str, draft: str) -> None:
    spec = _spec(draft, speculative_token_tree=TREE, rejection_sample_method="probabilistic")
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=12) for s in range(4)]
    llm = LLM(target, dtype="float64", speculative_config=spec)
    first = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    again = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[::-1], params[::-1])][::-1]
    assert first == again  # seeds, not batch order, decide the tokens
    assert llm.metrics.total.num_draft_tokens > 3 * llm.metrics.total.num_drafts


def test_a_pard_draft_model_is_refused_a_tree(target: str, tmp_path: Path) -> None:
    pard = make_tiny_model(tmp_path / "pard", "llama", seed=3, pard_token=7)
    spec = _spec(pard, speculative_token_tree=TREE, parallel_drafting=True)
    with pytest.raises(ValueError, match=r"parallel_drafting=True drafts a chain in one forward; it cannot"):
        LLM(target, speculative_config=spec)


def test_a_draft_model_tree_emits_more_than_a_chain_of_as_many_nodes(tmp_path: Path) -> None:
    """Greedy, a constructed draft model right after most tokens and second-best after every other one
    (the bigram target's table with its two best tokens swapped there): the 6-node tree (depth 3)
    catches the second choices, the 6-token chain stops at them. Both equal plain decoding."""
    bigram = make_bigram_target(tmp_path / "bigram")
    table = bigram_table(bigram)  # [V, V]
    for prev in range(0, table.shape[0], 2):
        top = torch.topk(table[prev], 2).indices
        table[prev, top] = table[prev, top.flip(0)]
    draft = write_table_draft(tmp_path / "draft", table)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(bigram, dtype="float64").generate(PROMPTS, params)]
    lengths = []
    for k, shape in ((3, {"speculative_token_tree": TREE}), (6, {})):
        spec = {**_spec(draft, **shape), "num_speculative_tokens": k}
        llm = LLM(bigram, dtype="float64", speculative_config=spec)
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == plain
        lengths.append(llm.metrics.total)
    tree, chain = lengths
    assert tree.mean_acceptance_length > chain.mean_acceptance_length + 0.3, (
        tree.log_line(),
        chain.log_line(),
    )
