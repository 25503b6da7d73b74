"""N-gram multi-candidate trees (#42): the continuations of every occurrence of the longest matching
suffix, as a static tree — checked against a brute-force reading of the rule on random histories, the
rank-0 path against the chain's draft, and in the engine: greedy output equals plain decoding, and a
context whose latest continuation is wrong lets the tree's second sibling be accepted where the chain
is rejected."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, one_thread  # noqa: F401 - one_thread is autouse

from spec_backend.config.token_tree import parse_token_tree
from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.ngram import NgramProposer
from spec_backend.proposers.tree_build import static_shape
from spec_backend.testing.fixtures.dspark_checkpoints import bigram_table, make_bigram_target

TREE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 0)]"


def _brute_force(tokens: list[int], n_min: int, n_max: int, tree: str) -> list[tuple[int, ...]]:
    """Each present node's token path, in the tree's order: the longest suffix with an earlier
    occurrence, then per node the distinct tokens after its path among those occurrences, latest first."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        starts = [s for s in range(length - n - 1, -1, -1) if tokens[s : s + n] == tokens[length - n :]]
        if starts:
            break
    else:
        return []
    found: dict[tuple[int, ...], tuple[int, ...]] = {(): ()}
    for node in sorted(parse_token_tree(tree), key=lambda t: (len(t), t)):
        if node[:-1] not in found:
            continue
        path, candidates = found[node[:-1]], []
        for c in (s + n for s in starts):
            follows = tokens[c : c + len(path)] == list(path) and c + len(path) < length
            if follows and tokens[c + len(path)] not in candidates:
                candidates.append(tokens[c + len(path)])
        if node[-1] < len(candidates):
            found[node] = (*path, candidates[node[-1]])
    return [p for p in found.values() if p]


def _paths(parents: tuple[int, ...], tokens: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for parent, token in zip(parents, tokens, strict=True):
        out.append((*(out[parent] if parent >= 0 else ()), token))
    return out


@pytest.mark.parametrize("vocab", [2, 3, 5])
def test_the_tree_is_the_rule_and_its_first_path_is_the_chain(vocab: int) -> None:
    rnd = random.Random(vocab)
    parents, ranks = static_shape(parse_token_tree(TREE))
    for trial in range(300):
        history = [rnd.randrange(vocab) for _ in range(rnd.randrange(2, 40))]
        proposer = NgramProposer(3, 1, 3)
        proposer.add_request("r", history[: len(history) // 2])
        proposer.update("r", history[len(history) // 2 :])  # the index's incremental path as well
        shape, tokens = proposer.propose_tree("r", parents, ranks)
        assert _paths(shape, tokens) == _brute_force(history, 1, 3, TREE), (trial, history)
        chain = proposer.propose(["r"])[0]
        first = [p for p in _paths(shape, tokens) if len(p) == len(chain)]
        assert chain == list(first[0] if first else ()), (trial, history)  # rank 0 at every level


def test_nodes_past_the_candidates_are_absent() -> None:
    proposer = NgramProposer(3, 1, 2)
    proposer.add_request("r", [7, 1, 7, 2, 7])  # 7 is followed by 2, then (earlier) by 1
    shape, tokens = proposer.propose_tree("r", *static_shape(parse_token_tree(TREE)))
    assert _paths(shape, tokens) == [(2,), (1,), (2, 7), (1, 7), (1, 7, 2)]  # no third candidate,
    assert shape == (-1, -1, 0, 1, 3)  # nothing after 2 7 (the end of the context)
    proposer.add_request("none", [1, 2, 3])
    assert proposer.propose_tree("none", *static_shape(parse_token_tree(TREE))) == ((), [])


def _spec(tree: bool) -> dict[str, object]:
    spec: dict[str, object] = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 2,
    }
    return {**spec, "prompt_lookup_min": 1, **({"speculative_token_tree": TREE} if tree else {})}


def test_a_batch_with_trees_gives_the_plain_greedy_output(target_dir: str, expected: list[list[int]]) -> None:
    llm = LLM(target_dir, dtype="float64", speculative_config=_spec(True))
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    total = llm.metrics.total
    assert total.num_accepted_tokens > 0  # periodic prompts: one continuation, so chain-shaped subtrees
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()


def _ambiguous_prompt(f: list[int]) -> list[int]:
    """``a f(a) f²(a) f³(a) u a w u b`` with ``f(b) = a``: after the target's first token (``a``) the
    latest continuation of ``a`` is the wrong ``w``, an earlier one the target's walk."""
    for a in range(len(f)):
        walk = [a, f[a], f[f[a]], f[f[f[a]]]]
        others = [t for t in range(len(f)) if t not in walk]
        b = next((t for t in others if f[t] == a), None)
        if b is None or len(set(walk)) < 4 or len(others) < 3:
            continue
        u, w = [t for t in others if t != b][:2]
        return [*walk, u, a, w, u, b]
    raise AssertionError("no token with a preimage off its own walk")


def test_greedy_output_equals_plain_and_the_second_continuation_is_caught(tmp_path: Path) -> None:
    """A bigram target after each token ``x`` picks ``f(x)``; the context shows ``f(a)`` after ``a`` early
    and a wrong token after it late, so the chain (the latest occurrence) is rejected at ``a``, the
    tree's second sibling accepted."""
    bigram = make_bigram_target(tmp_path / "bigram", vocab=32)
    prompt = _ambiguous_prompt(bigram_table(bigram).argmax(dim=-1).tolist())
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = LLM(bigram, dtype="float64").generate([prompt], params)[0].outputs[0].token_ids
    runs = {}
    for name in ("chain", "tree"):
        llm = LLM(bigram, dtype="float64", speculative_config=_spec(name == "tree"))
        assert llm.generate([prompt], params)[0].outputs[0].token_ids == plain
        runs[name] = llm.metrics.total
    assert runs["tree"].num_accepted_tokens > runs["chain"].num_accepted_tokens, (
        runs["tree"].log_line(),
        runs["chain"].log_line(),
    )
