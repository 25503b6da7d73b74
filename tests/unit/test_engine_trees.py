"""Token trees in the engine (#42): a branching ``speculative_token_tree`` drafted by DSpark, DFlash,
EAGLE, EAGLE-3, MTP and Medusa, verified node by node and compacted to its accepted path — greedy output
equals plain decoding, a head that predicts the target accepts every level, and what trees cannot do yet
is refused by name."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, one_thread  # noqa: F401 - one_thread is autouse

from spec_backend.engine import LLM, SamplingParams, StructuredOutputsParams
from spec_backend.engine.tree_step import DynamicTree
from spec_backend.proposers.tree_build import dynamic_tree
from spec_backend.testing.fixtures import draft_checkpoints as w
from spec_backend.testing.fixtures.dspark_checkpoints import (
    make_bigram_target,
    write_dspark,
    write_exact_dspark,
)
from spec_backend.tools.tiny import make_tiny_model

TREE = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"  # 6 nodes, 3 deep


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("deep"), "llama", num_hidden_layers=6, seed=5)


def _head(method: str, target: str, tmp: Path) -> str:
    if method == "dspark":
        return write_dspark(tmp / "h", target, markov="rnn", block_size=4)
    if method == "dflash":
        return w.write_dflash(tmp / "h", target)
    if method == "eagle":
        return w.write_eagle1(tmp / "h", target, bias=True)
    if method == "eagle3":
        return w.write_eagle3(tmp / "h", target, "speculators", aux_ids=[0, 2, 4])
    return w.write_medusa(tmp / "h", 32, 128, 3, "vllm")


@pytest.mark.parametrize("method", ["dspark", "dflash", "eagle", "eagle3", "medusa"])
def test_greedy_output_with_a_tree_equals_plain_decoding(target: str, tmp_path: Path, method: str) -> None:
    plain = [o.outputs[0].token_ids for o in LLM(target, dtype="float64").generate(PROMPTS, GREEDY)]
    spec = {
        "adaptive_draft_length": False,
        "method": method,
        "model": _head(method, target, tmp_path),
        "num_speculative_tokens": 3,
    }
    llm = LLM(target, dtype="float64", speculative_config={**spec, "speculative_token_tree": TREE})
    assert llm.engine.tree is not None and llm.engine.captured is None
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    total = llm.metrics.total
    assert total.num_draft_tokens > 3 * total.num_drafts  # more nodes verified per step than a chain's K
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()


def _swap_top_two(head: str, every: int) -> None:
    """Make the head's first choice wrong after every ``every``-th token: the Markov table's two best
    next tokens swapped (its second choice is then the target's first)."""
    path = os.path.join(head, "model.safetensors")
    tensors = load_file(path)
    w2 = tensors["markov_head.markov_w2.weight"]  # [V, V]: column j = the logits after token j
    for prev in range(0, w2.shape[1], every):
        top = torch.topk(w2[:, prev], 2).indices
        w2[top[0], prev], w2[top[1], prev] = w2[top[1], prev].clone(), w2[top[0], prev].clone()
    save_file(tensors, path)


def test_a_tree_emits_more_than_a_chain_of_as_many_nodes(tmp_path: Path) -> None:
    """Greedy, a constructed head right after most tokens and second-best after every other one: the
    6-node tree (depth 3) catches the second choices, the 6-token chain stops at them."""
    bigram = make_bigram_target(tmp_path / "bigram")
    head = write_exact_dspark(tmp_path / "exact", bigram, block_size=6)
    _swap_top_two(head, every=2)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    tree = LLM(
        bigram,
        dtype="float64",
        speculative_config={"model": head, "num_speculative_tokens": 3, "speculative_token_tree": TREE},
    )
    tree.generate(PROMPTS, params)
    chain = LLM(bigram, dtype="float64", speculative_config={"model": head, "num_speculative_tokens": 6})
    chain.generate(PROMPTS, params)
    t, c = tree.metrics.total, chain.metrics.total
    assert t.mean_acceptance_length > c.mean_acceptance_length + 0.3, (t.log_line(), c.log_line())


def test_what_trees_cannot_do_yet_is_refused(target: str, tmp_path: Path) -> None:
    head = write_dspark(tmp_path / "h", target, block_size=4)
    spec = {"model": head, "num_speculative_tokens": 3, "speculative_token_tree": TREE}
    with pytest.raises(ValueError, match=r"this one is 3 deep; method='suffix'"):
        LLM(target, speculative_config={**spec, "model": None, "method": "suffix"})
    with pytest.raises(ValueError, match=r"this one is 3 deep; method='dspark'"):
        LLM(target, speculative_config={**spec, "num_speculative_tokens": 4})
    with pytest.raises(ValueError, match="with a branching speculative_token_tree every node is verified"):
        LLM(target, speculative_config={**spec, "confidence_verification": "throughput"})
    with pytest.raises(ValueError, match=r"rejection_sample_method='block' .* cannot apply to it"):
        LLM(target, speculative_config={**spec, "rejection_sample_method": "block"})
    worded = make_tiny_model(tmp_path / "worded", "llama", with_tokenizer=True)
    spec = {**spec, "model": write_dspark(tmp_path / "w", worded, block_size=4)}
    llm = LLM(worded, speculative_config=spec)
    out = llm.generate(["abc abc"], _REGEX)[0].outputs[0]
    assert (
        out.finish_reason == "error" and "structured outputs are not supported with a token tree" in out.error
    )


@pytest.mark.parametrize("method", ["dflash", "dspark", "eagle", "eagle3"])
def test_greedy_output_with_a_dynamic_tree_equals_plain_decoding(
    target: str, tmp_path: Path, method: str
) -> None:
    plain = [o.outputs[0].token_ids for o in LLM(target, dtype="float64").generate(PROMPTS, GREEDY)]
    spec = {
        "adaptive_draft_length": False,
        "method": method,
        "model": _head(method, target, tmp_path),
        "num_speculative_tokens": 3,
    }
    llm = LLM(target, dtype="float64", speculative_config={**spec, "tree_top_k": 3, "tree_nodes": 8})
    assert isinstance(llm.engine.tree, DynamicTree) and llm.engine.captured is None
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    total = llm.metrics.total
    assert total.num_draft_tokens > 3 * total.num_drafts  # more nodes verified per step than a chain's K
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()


def _record_blocks_and_trees(llm: LLM) -> tuple[list[Any], list[Any]]:
    """Generate two short greedy requests, recording each step's block (``run_block``) and dynamic tree."""
    drafter: Any = llm.engine.drafter
    run_block, grow, blocks, trees = drafter.run_block, drafter.propose_dynamic_tree, [], []
    drafter.run_block = lambda inputs: blocks.append(run_block(inputs)) or blocks[-1]
    drafter.propose_dynamic_tree = lambda *a: trees.append(grow(*a)) or trees[-1]
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=4))
    return blocks, trees


def test_a_dflash_dynamic_tree_is_eagle2_over_the_block_rows(target: str, tmp_path: Path) -> None:
    """Each node's children come from the block row of its depth: the host EAGLE-2 reference over those
    rows' distributions gives the same tree."""
    spec = {
        "adaptive_draft_length": False,
        "method": "dflash",
        "model": _head("dflash", target, tmp_path),
        "num_speculative_tokens": 3,
    }
    llm = LLM(target, dtype="float64", speculative_config={**spec, "tree_top_k": 2, "tree_nodes": 7})
    drafter: Any = llm.engine.drafter
    blocks, trees = _record_blocks_and_trees(llm)
    rows = blocks[0][0][:, 1:]  # [B, K, H]
    for b in range(2):
        with torch.inference_mode():  # the rows are the engine's inference tensors
            want = dynamic_tree(
                lambda _, path, b=b: torch.softmax(drafter.head.logits(rows[b, len(path)]).double(), -1),
                3, 2, 7,
            )  # fmt: skip
        assert trees[0].tree_parents[b] == want.parents
        assert trees[0].token_ids[b].tolist() == list(want.tokens)


def _markov_chain(
    head: Any, rows: torch.Tensor, anchor: torch.Tensor, markov: bool, _: int, path: tuple[int, ...]
) -> torch.Tensor:  # [V] float64
    """DSpark's chain rule after ``path``: block row ``len(path)`` (``rows [1, K, H]``) plus the Markov
    bias of the path's last token (the ``anchor [1]`` for the root), the state stepped down the path;
    ``markov=False``: the row alone."""
    state = head.markov_head.initial_state(rows[:, 0])  # [1, r]
    previous = anchor
    for row in range(len(path) + 1):
        bias, _, state = head.markov_head.step(previous, rows[:, row], state)
        previous = torch.tensor(path[row : row + 1] or [0])
    logits = head.draft_logits(rows[0, len(path)]) + (bias[0] if markov else 0.0)
    return torch.softmax(head.to_target(logits).double(), -1)


def test_a_dspark_dynamic_tree_is_eagle2_over_the_markov_corrected_rows(target: str, tmp_path: Path) -> None:
    """A node at depth d gives its children block row d plus the Markov bias of its token, the rnn
    state stepped down its path: the host EAGLE-2 reference over that chain rule gives the same tree.
    Negative control: the rule without the path's Markov steps (DFlash's rows alone) gives another."""
    spec = {
        "adaptive_draft_length": False,
        "method": "dspark",
        "model": _head("dspark", target, tmp_path),
        "num_speculative_tokens": 3,
    }
    llm = LLM(target, dtype="float64", speculative_config={**spec, "tree_top_k": 2, "tree_nodes": 7})
    drafter: Any = llm.engine.drafter
    blocks, trees = _record_blocks_and_trees(llm)
    head, first = drafter.head, drafter.dspark.first_row
    differs = 0
    for (out, block_ids), tree in zip(blocks, trees, strict=True):
        hidden = out[:, first : first + 3]  # [B, K, H]
        for b in range(out.shape[0]):
            rows, anchor = hidden[b : b + 1], block_ids[b : b + 1, 0]  # [1, K, H], [1]
            with torch.inference_mode():  # the block is the engine's inference tensors
                want = dynamic_tree(partial(_markov_chain, head, rows, anchor, True), 3, 2, 7)
                blind = dynamic_tree(partial(_markov_chain, head, rows, anchor, False), 3, 2, 7)
            assert tree.tree_parents[b] == want.parents
            assert tree.token_ids[b].tolist() == list(want.tokens)
            differs += (blind.parents, blind.tokens) != (want.parents, want.tokens)
    assert differs > 0


def test_dynamic_tree_options_are_checked(target: str, tmp_path: Path) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "eagle",
        "model": _head("eagle", target, tmp_path),
        "num_speculative_tokens": 3,
    }
    with pytest.raises(
        ValueError, match=r"needs both tree_top_k and tree_nodes, got tree_top_k=2 and tree_nodes=None"
    ):
        LLM(target, speculative_config={**spec, "tree_top_k": 2})
    with pytest.raises(ValueError, match=r"tree_nodes must be in \[num_speculative_tokens, 10\] .* got 11"):
        LLM(target, speculative_config={**spec, "tree_top_k": 2, "tree_nodes": 11})
    with pytest.raises(ValueError, match=r"speculative_token_tree=.* is a static one: give one or the other"):
        LLM(
            target,
            speculative_config={**spec, "tree_top_k": 2, "tree_nodes": 4, "speculative_token_tree": TREE},
        )
    medusa = {
        "adaptive_draft_length": False,
        "method": "medusa",
        "model": _head("medusa", target, tmp_path / "m"),
        "num_speculative_tokens": 3,
    }
    with pytest.raises(ValueError, match=r"grow a dynamic token tree .* got method='medusa'"):
        LLM(target, speculative_config={**medusa, "tree_top_k": 2, "tree_nodes": 4})
    with pytest.raises(ValueError, match=r"a dynamic token tree \(tree_top_k/tree_nodes\) is verified by"):
        LLM(
            target,
            speculative_config={**spec, "tree_top_k": 2, "tree_nodes": 4, "rejection_sample_method": "block"},
        )
    sampled = {**spec, "tree_top_k": 2, "tree_nodes": 4, "rejection_sample_method": "probabilistic"}
    with pytest.raises(ValueError, match=r"which siblings exist would depend on their tokens"):
        LLM(target, speculative_config=sampled)


def test_mtp_trees_need_one_layer_and_equal_plain_decoding(tmp_path: Path) -> None:
    from test_drafter_mtp import write_glm_with_mtp

    glm = write_glm_with_mtp(tmp_path / "glm", nextn=1, seed=2)
    plain = [o.outputs[0].token_ids for o in LLM(glm, dtype="float64").generate(PROMPTS, GREEDY)]
    spec = {"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 3}
    for tree in ({"speculative_token_tree": TREE}, {"tree_top_k": 2, "tree_nodes": 6}):
        llm = LLM(glm, dtype="float64", speculative_config={**spec, **tree})
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    two = write_glm_with_mtp(tmp_path / "two", nextn=2)
    shallow = {**spec, "num_speculative_tokens": 2, "tree_top_k": 2, "tree_nodes": 4}
    with pytest.raises(ValueError, match=r"needs one MTP layer; .* would use 2 \(num_speculative_tokens=2"):
        LLM(two, speculative_config=shallow)


def test_parallel_drafting_cannot_draft_a_tree(target: str, tmp_path: Path) -> None:
    head = w.write_eagle3(tmp_path / "p", target, "peagle", aux_ids=[0, 2, 4])
    spec = {
        "adaptive_draft_length": False,
        "method": "eagle3",
        "model": head,
        "num_speculative_tokens": 3,
        "parallel_drafting": True,
    }
    with pytest.raises(
        ValueError,
        match=r"parallel_drafting=True drafts a chain in one forward; it cannot draft a token tree",
    ):
        LLM(target, speculative_config={**spec, "speculative_token_tree": TREE})


_REGEX = SamplingParams(
    temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(regex=r"[a-c]{2,5}")
)


def test_a_refused_request_does_not_fail_its_batch(tmp_path: Path) -> None:
    """A tree step that raises for one request retries each request alone, each with its own tree."""
    worded = make_tiny_model(tmp_path / "worded", "llama", with_tokenizer=True)
    spec = {"model": write_dspark(tmp_path / "h", worded, block_size=4), "num_speculative_tokens": 3}
    params = SamplingParams(temperature=0.0, max_tokens=12)
    plain = LLM(worded, dtype="float64").generate(["abc abc abc"], params)[0].outputs[0].token_ids
    llm = LLM(worded, dtype="float64", speculative_config={**spec, "speculative_token_tree": TREE})
    good, refused = llm.generate(["abc abc abc", "ab ab"], [params, _REGEX])
    assert refused.outputs[0].finish_reason == "error"
    assert good.outputs[0].finish_reason != "error", good.outputs[0].error
    assert good.outputs[0].token_ids == plain


PROCESSED = [
    SamplingParams(temperature=0.0, max_tokens=14, repetition_penalty=1.8),
    SamplingParams(temperature=0.0, max_tokens=14, presence_penalty=1.5, frequency_penalty=0.7),
    SamplingParams(temperature=0.0, max_tokens=14, logit_bias={3: 4.0, 9: -8.0}, min_p=0.2),
    SamplingParams(temperature=0.0, max_tokens=14, min_tokens=10, repetition_penalty=1.3),
]


def test_processed_logits_with_a_tree_are_the_plain_ones(tmp_path: Path) -> None:
    """Penalties, logit bias, min_p and min_tokens act on every tree row with its node's path as
    history: greedy output equals plain decoding's with the same parameters. A head that predicts the
    raw target (a bigram table) gets deep nodes accepted, so rows below the root decide."""
    bigram = make_bigram_target(tmp_path / "bigram")
    head = write_exact_dspark(tmp_path / "exact", bigram, block_size=4)
    plain = [o.outputs[0].token_ids for o in LLM(bigram, dtype="float64").generate(PROMPTS, PROCESSED)]
    spec = {"model": head, "num_speculative_tokens": 3, "speculative_token_tree": TREE}
    llm = LLM(bigram, dtype="float64", speculative_config=spec)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PROCESSED)] == plain
    assert llm.metrics.total.num_accepted_tokens > llm.metrics.total.num_drafts  # deep rows were read
    unprocessed = [o.outputs[0].token_ids for o in LLM(bigram, dtype="float64").generate(PROMPTS, GREEDY)]
    assert plain != unprocessed  # the parameters change the output: the check has power


def test_logprobs_with_a_tree_are_the_plain_ones(target: str, tmp_path: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=2)
    plain = LLM(target, dtype="float64").generate(PROMPTS, params)
    spec = {
        "model": _head("dspark", target, tmp_path),
        "num_speculative_tokens": 3,
        "speculative_token_tree": TREE,
    }
    tree = LLM(target, dtype="float64", speculative_config=spec).generate(PROMPTS, params)
    for a, b in zip(plain, tree, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        want, got = a.outputs[0].logprobs, b.outputs[0].logprobs
        assert want is not None and got is not None and len(want) == len(got) == 10
        for w_step, g_step in zip(want, got, strict=True):
            assert w_step.keys() == g_step.keys()
            assert all(abs(w_step[t].logprob - g_step[t].logprob) < 1e-9 for t in w_step)
