"""I.i.d. draft paths verified by greedy multi-path block verification in the engine (#42,
``tree_paths``): greedy output equals plain decoding on every drafter that grows them, seeded sampled
output does not depend on the batch, each trie node carries the draft distribution its path gives (a draft
model's plain forward over context + path, under the request's temperature), and what cannot run is
refused by name. The law: ``tests/statistical/test_engine_tree_law.py``; the rule: ``test_gbv.py``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, one_thread  # noqa: F401 - one_thread is autouse

from spec_backend.engine import LLM, SamplingParams, tree_step
from spec_backend.engine.tree_step import DraftPaths
from spec_backend.proposers.draft_paths import grow_paths
from spec_backend.proposers.tree_build import depths_of
from spec_backend.testing.fixtures import draft_checkpoints as w
from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark
from spec_backend.tools.tiny import make_tiny_model

TREE = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("deep"), "llama", num_hidden_layers=6, seed=5)


def _spec(method: str, target: str, tmp: Path, **extra: Any) -> dict[str, Any]:
    heads = {
        "dspark": lambda: write_dspark(tmp / "h", target, markov="rnn", block_size=4),
        "dflash": lambda: w.write_dflash(tmp / "h", target),
        "eagle": lambda: w.write_eagle1(tmp / "h", target, bias=True),
        "eagle3": lambda: w.write_eagle3(tmp / "h", target, "speculators", aux_ids=[0, 2, 4]),
        "draft_model": lambda: make_tiny_model(tmp / "h", "qwen2", seed=5),
    }
    return {
        "method": method,
        "model": heads[method](),
        "num_speculative_tokens": 3,
        "tree_paths": 3,
        "rejection_sample_method": "probabilistic",
        **extra,
    }


@pytest.mark.parametrize("method", ["dflash", "dspark", "draft_model", "eagle", "eagle3"])
def test_greedy_output_with_draft_paths_equals_plain_decoding(
    target: str, tmp_path: Path, method: str
) -> None:
    plain = [o.outputs[0].token_ids for o in LLM(target, dtype="float64").generate(PROMPTS, GREEDY)]
    llm = LLM(target, dtype="float64", speculative_config=_spec(method, target, tmp_path))
    assert llm.engine.tree == DraftPaths(3, 3)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()


def test_seeded_sampling_with_draft_paths_does_not_depend_on_the_batch(target: str, tmp_path: Path) -> None:
    llm = LLM(target, dtype="float64", speculative_config=_spec("eagle", target, tmp_path))
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=s, max_tokens=12) for s in range(4)]
    first = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    again = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[::-1], params[::-1])][::-1]
    alone = [llm.generate([p], [q])[0].outputs[0].token_ids for p, q in zip(PROMPTS, params, strict=True)]
    assert first == again == alone
    total = llm.metrics.total
    assert total.num_draft_tokens > 3 * total.num_drafts  # the paths differ: more nodes than one chain


def test_each_node_carries_the_draft_law_after_its_path(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trie's paths are 3 deep, at most 3 nodes a level, each node's ``draft_probs`` row the draft
    model's softmax after context + the node's parent path at the request's temperature, and its token
    drawn where that row has mass."""
    from transformers import AutoModelForCausalLM

    spec = _spec("draft_model", target, tmp_path)
    llm = LLM(target, dtype="float64", speculative_config=spec)
    calls: list[tuple[list[list[int]], Any]] = []

    def recorded(grower: Any, depth: int, paths: int, requests: Any) -> Any:
        out = grow_paths(grower, depth, paths, requests)
        calls.append(([list(r.prompt_token_ids) + list(r.output_token_ids) for r in requests], out))
        return out

    monkeypatch.setattr(tree_step, "grow_paths", recorded)
    params = [SamplingParams(temperature=0.7, seed=s, max_tokens=6) for s in range(3)]
    llm.generate(PROMPTS[:3], params)
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float64).eval()
    assert calls
    for contexts, out in calls:
        assert out.draft_probs is not None
        for b, context in enumerate(contexts):
            parents, tokens = out.tree_parents[b], out.token_ids[b].tolist()
            depths = depths_of(parents)
            assert max(depths) == 3 and all(depths.count(d) <= 3 for d in (1, 2, 3))
            for i, parent in enumerate(parents):
                path, node = [], parent
                while node >= 0:
                    path.insert(0, tokens[node])
                    node = parents[node]
                with torch.no_grad():
                    logits = model(torch.tensor([context + path])).logits[0, -1]  # [V]
                want = torch.softmax(logits / 0.7, dim=-1)
                got = out.draft_probs[b, i].double()
                torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
                assert got[tokens[i]] > 0


def test_what_draft_paths_cannot_do_is_refused(target: str, tmp_path: Path) -> None:
    spec = _spec("eagle", target, tmp_path)
    with pytest.raises(ValueError, match=r"reads the distribution each path was drawn from: .* got 'strict'"):
        LLM(target, speculative_config={**spec, "rejection_sample_method": "strict"})
    with pytest.raises(ValueError, match=r"tree_paths=3 drafts i.i.d. paths; tree_top_k/tree_nodes grow"):
        LLM(target, speculative_config={**spec, "tree_top_k": 2, "tree_nodes": 4})
    with pytest.raises(ValueError, match=r"tree_paths=3 drafts i.i.d. paths; speculative_token_tree="):
        LLM(target, speculative_config={**spec, "speculative_token_tree": "[(0,), (1,), (0, 0), (0, 0, 0)]"})
    with pytest.raises(ValueError, match=r"tree_paths=3 draws i.i.d. paths .* got method='ngram'"):
        LLM(target, speculative_config={**spec, "method": "ngram", "model": None, "prompt_lookup_max": 2})
    for bad in (1, 9):
        with pytest.raises(ValueError, match=r"tree_paths"):
            LLM(target, speculative_config={**spec, "tree_paths": bad})
    pard = make_tiny_model(tmp_path / "pard", "llama", seed=3, pard_token=7)
    with pytest.raises(ValueError, match=r"parallel_drafting=True drafts a chain in one forward; it cannot"):
        LLM(
            target,
            speculative_config={**spec, "method": "draft_model", "model": pard, "parallel_drafting": True},
        )


@pytest.mark.parametrize("shape", ["paths", "sampled siblings"])
def test_greedy_and_sampled_requests_admitted_at_different_steps(
    target: str, tmp_path: Path, shape: str
) -> None:
    """A greedy request admitted while sampled ones decode (its prefill drafts carry no probabilities,
    theirs do) runs in the same decode batch: each output equals the request run alone (a regression:
    the step raised for the whole batch)."""
    extra = {"tree_paths": None, "speculative_token_tree": TREE} if shape == "sampled siblings" else {}
    llm = LLM(
        target, dtype="float64", speculative_config=_spec("eagle", target, tmp_path, **extra), max_num_seqs=2
    )
    params = [
        SamplingParams(temperature=1.0, seed=1, max_tokens=14),
        SamplingParams(temperature=0.0, max_tokens=6),
        SamplingParams(temperature=0.0, max_tokens=10),
    ]
    together = llm.generate(PROMPTS[:3], params)
    assert all(o.outputs[0].finish_reason == "length" for o in together), [
        o.outputs[0].error for o in together
    ]
    alone = [llm.generate([p], [q])[0].outputs[0].token_ids for p, q in zip(PROMPTS[:3], params, strict=True)]
    assert [o.outputs[0].token_ids for o in together] == alone
