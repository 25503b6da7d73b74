"""Suffix decoding: per-request and global suffix trees, drafting rules, FIFO eviction, memory bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suffix_ref import ReferenceSuffixProposer
from suffix_ref_tree import ReferenceSuffixTree

from spec_backend.proposers import SuffixProposer
from spec_backend.proposers.suffix_tree import M32, SuffixTree, child_hash


def path_count(tree: SuffixTree, tokens: list[int]) -> int:
    node = 0
    for t in tokens:
        node = child_hash(node, t)
    return tree.count(node)


def occurs(seq: list[int], window: list[int]) -> bool:
    return any(seq[s : s + len(window)] == window for s in range(len(seq) - len(window) + 1))


def test_tree_counts_and_best_child() -> None:
    tree = SuffixTree(3)
    tree.insert([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert path_count(tree, [1, 2]) == 3
    assert path_count(tree, [1, 2, 3]) == 2
    assert path_count(tree, [1, 2, 4]) == 1
    assert path_count(tree, [2, 3, 1, 2]) == 0  # deeper than max_depth
    assert tree.best_child(child_hash(child_hash(0, 1), 2)) == 3
    assert tree.best_child(child_hash(0, 4)) == 1
    assert tree.best_child(child_hash(0, 9)) is None
    assert tree.num_nodes == len(tree.nodes) and tree.memory_bytes > 0


def test_hand_made_drafts() -> None:
    s = SuffixProposer(8)
    s.add_request("a", [1, 2, 3, 4, 5, 1, 2, 3])
    assert s.propose(["a"]) == [[4, 5, 1]]  # match [1, 2, 3]: spec factor 1 allows 3 tokens
    s.update("a", [4, 5])
    assert s.propose(["a"]) == [[1, 2, 3, 4, 5]]
    assert s.propose(["a"], max_tokens=[2]) == [[1, 2]]
    assert s.propose(["a"], max_tokens=[0]) == [[]]
    s.add_request("empty", [])
    assert s.propose(["empty"]) == [[]]
    s.update("empty", [7])
    assert s.propose(["empty"]) == [[]]


def draft_for(proposer: SuffixProposer, prompt: list[int]) -> list[int]:
    proposer.add_request("t", prompt)
    draft = proposer.propose(["t"])[0]
    proposer.remove_request("t")
    return draft


# after [1, 2]: 3 twice and 4 once; after [1, 2, 3]: 6 once, then 8 once (the more recent wins the tie)
BRANCHY = [5, 1, 2, 3, 6, 1, 2, 4, 7, 1, 2, 3, 8, 1, 2]


def test_frequency_probability_threshold_and_spec_factor() -> None:
    assert draft_for(SuffixProposer(4, max_cached_requests=0), BRANCHY) == [3, 8]  # p = 2/3, then 1/2
    assert draft_for(SuffixProposer(4, min_token_prob=0.5, max_cached_requests=0), BRANCHY) == [3]
    assert draft_for(SuffixProposer(4, min_token_prob=0.9, max_cached_requests=0), BRANCHY) == []
    assert draft_for(SuffixProposer(4, max_spec_factor=0.5, max_cached_requests=0), BRANCHY) == [3]
    shallow = SuffixProposer(8, max_tree_depth=3, max_spec_factor=4.0, max_cached_requests=0)
    # depth 3: match [5, 6] leaves room for 1 token, match [6] for 2 (path [6, 7, 8]), which scores higher
    assert draft_for(shallow, [5, 6, 7, 8, 5, 6]) == [7, 8]
    # a longer matching context beats a shorter one's frequencies
    assert draft_for(
        SuffixProposer(4, max_cached_requests=0), [1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9, 1, 2]
    ) == [
        4,
        9,
        1,
        2,
    ]


def test_global_tree_drafts_from_previous_responses() -> None:
    s = SuffixProposer(4, max_cached_requests=2)
    s.add_request("a", [0])
    s.update("a", [7, 8, 9, 10])
    s.remove_request("a")
    assert s.num_cached_responses == 1
    s.add_request("b", [5, 7, 8])
    assert s.propose(["b"]) == [[9, 10]]
    off = SuffixProposer(4, max_cached_requests=0)
    off.add_request("a", [0])
    off.update("a", [7, 8, 9, 10])
    off.remove_request("a")
    assert off.num_cached_responses == 0 and off.global_tree.num_nodes == 0


def test_eviction_restores_an_empty_tree() -> None:
    s = SuffixProposer(4, max_tree_depth=5, max_cached_requests=1)
    for i, response in enumerate(([1, 2, 3, 1, 2], [4, 4, 4], [9])):
        s.add_request(str(i), [0])
        s.update(str(i), response)
        s.remove_request(str(i))
    fresh = SuffixTree(5, removable=True)
    fresh.insert([9])
    assert s.global_tree.nodes == fresh.nodes
    assert s.global_tree.kids == fresh.kids


def test_validation() -> None:
    with pytest.raises(ValueError, match="suffix_decoding_max_tree_depth=0 must be >= 1"):
        SuffixProposer(2, max_tree_depth=0)
    with pytest.raises(ValueError, match="suffix_decoding_max_cached_requests=-1 must be >= 0"):
        SuffixProposer(2, max_cached_requests=-1)
    with pytest.raises(ValueError, match=r"suffix_decoding_max_spec_factor=-1\.0 must be >= 0"):
        SuffixProposer(2, max_spec_factor=-1.0)
    with pytest.raises(RuntimeError, match="removable=True"):
        SuffixTree(2).remove([1])


small = st.lists(st.integers(0, 3), max_size=30)


@settings(max_examples=80, deadline=None)
@given(prompt=small, output=small, depth=st.integers(1, 6), chunk=st.integers(1, 4))
def test_incremental_updates_equal_a_bulk_build(
    prompt: list[int], output: list[int], depth: int, chunk: int
) -> None:
    """update() token by token builds exactly the tree (counts and best children) of one bulk insert."""
    s = SuffixProposer(4, max_tree_depth=depth)
    s.add_request("r", prompt)
    for i in range(0, len(output), chunk):
        s.update("r", output[i : i + chunk])
    bulk = SuffixTree(depth)
    bulk.insert(prompt + output)
    assert s._reqs["r"].tree.nodes == bulk.nodes


@settings(max_examples=80, deadline=None)
@given(
    requests=st.lists(st.tuples(small, small), min_size=1, max_size=6),
    k=st.integers(1, 6),
    depth=st.integers(2, 8),
    cached=st.integers(0, 3),
    factor=st.sampled_from([0.5, 1.0, 3.0]),
    min_prob=st.sampled_from([0.0, 0.1, 0.6]),
)
def test_drafts_exist_in_history_and_cache_stays_bounded(
    requests: list[tuple[list[int], list[int]]],
    k: int,
    depth: int,
    cached: int,
    factor: float,
    min_prob: float,
) -> None:
    s = SuffixProposer(
        k, max_tree_depth=depth, max_cached_requests=cached, max_spec_factor=factor, min_token_prob=min_prob
    )
    responses: list[list[int]] = []
    for r, (prompt, output) in enumerate(requests):
        rid = f"r{r}"
        s.add_request(rid, prompt)
        history = list(prompt)
        for tok in [*output, None]:
            draft = s.propose([rid])[0]
            assert len(draft) <= k
            if draft:  # the last context token followed by the draft occurs in the history or the cache
                window = [history[-1], *draft]
                assert occurs(history, window) or any(occurs(resp, window) for resp in responses[-cached:])
            if tok is not None:
                s.update(rid, [tok])
                history.append(tok)
        s.remove_request(rid)
        if output and cached:
            responses.append(output)
        kept = responses[-cached:] if cached else []
        assert s.num_cached_responses == len(kept)
        assert s.global_tree.num_nodes <= depth * sum(len(x) for x in kept)
        fresh = SuffixTree(depth, removable=True)
        for resp in kept:
            fresh.insert(resp)
        # counts and best-child counts (the max over children) match a tree built from the kept responses
        ours = {h: (v & M32, v >> 64) for h, v in s.global_tree.nodes.items()}
        assert ours == {h: (v & M32, v >> 64) for h, v in fresh.nodes.items()}
        for h, v in s.global_tree.nodes.items():  # the recorded best child exists with that count
            best = s.global_tree.best_child(h)
            assert (best is None) == (v >> 64 == 0)
            if best is not None:
                assert s.global_tree.count(child_hash(h, best)) == v >> 64
    assert s.num_nodes >= s.global_tree.num_nodes and s.memory_bytes > 0


# ------------------------------------------------------------------ differential: compiled vs reference
def check_same_trees(s: SuffixProposer, ref: ReferenceSuffixProposer) -> None:
    assert s.global_tree.nodes == ref.global_tree.nodes
    assert s.global_tree.kids == ref.global_tree.kids
    assert s.global_tree.num_nodes == ref.global_tree.num_nodes
    for rid, req in s._reqs.items():
        assert req.tree.nodes == ref._reqs[rid].tree.nodes
        assert req.active[: req.alen].tolist() == ref._reqs[rid].active


@settings(max_examples=120, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.lists(st.integers(0, 4), max_size=40), st.lists(st.integers(0, 4), max_size=40)),
        min_size=1,
        max_size=5,
    ),
    k=st.integers(1, 8),
    depth=st.integers(1, 9),
    cached=st.integers(0, 3),
    factor=st.sampled_from([0.5, 1.0, 2.5]),
    min_prob=st.sampled_from([0.0, 0.1, 0.4]),
    chunk=st.integers(1, 5),
    overlap=st.integers(1, 3),
)
def test_compiled_matches_reference(
    requests: list[tuple[list[int], list[int]]],
    k: int,
    depth: int,
    cached: int,
    factor: float,
    min_prob: float,
    chunk: int,
    overlap: int,
) -> None:
    """Same drafts, counts, best children, child lists and suffix hashes as the pure-Python original,
    with requests interleaved (``overlap`` running at once), chunked updates, caps and FIFO eviction."""
    args = dict(
        max_tree_depth=depth, max_cached_requests=cached, max_spec_factor=factor, min_token_prob=min_prob
    )
    s, ref = SuffixProposer(k, **args), ReferenceSuffixProposer(k, **args)  # type: ignore[arg-type]
    running: list[tuple[str, list[int]]] = []
    for r, (prompt, output) in enumerate(requests):
        for p in (s, ref):
            p.add_request(f"r{r}", prompt)
        running.append((f"r{r}", list(output)))
        while running and (len(running) >= overlap or r == len(requests) - 1):
            ids = [rid for rid, _ in running]
            caps = [(len(rest) + i) % (k + 2) for i, (_, rest) in enumerate(running)]
            assert s.propose(ids) == ref.propose(ids)
            assert s.propose(ids, caps) == ref.propose(ids, caps)
            rid, rest = running[0]
            if not rest:
                for p in (s, ref):
                    p.remove_request(rid)
                running.pop(0)
                check_same_trees(s, ref)
                continue
            for p in (s, ref):
                p.update(rid, rest[:chunk])
            del rest[:chunk]
            running.append(running.pop(0))
    check_same_trees(s, ref)


def test_compiled_matches_reference_on_code_like_sequences() -> None:
    """Long, repetitive sequences (big tables, regrowth, eviction of long responses): same drafts."""
    rng = np.random.default_rng(0)
    s, ref = SuffixProposer(8, max_cached_requests=2), ReferenceSuffixProposer(8, max_cached_requests=2)
    lines = [rng.integers(0, 50, int(rng.integers(3, 12))).tolist() for _ in range(40)]
    for _ in range(4):
        seq = [t for i in rng.integers(0, len(lines), 120) for t in lines[i]]
        cut = len(seq) // 2
        for p in (s, ref):
            p.add_request("x", seq[:cut])
        pos = cut
        while pos < len(seq):
            draft = s.propose(["x"])[0]
            assert draft == ref.propose(["x"])[0]
            n = 0
            while n < len(draft) and pos + n < len(seq) and draft[n] == seq[pos + n]:
                n += 1
            for p in (s, ref):
                p.update("x", seq[pos : pos + n + 1])
            pos += n + 1
        check_same_trees(s, ref)
        for p in (s, ref):
            p.remove_request("x")
        check_same_trees(s, ref)
    assert s.memory_bytes < ref.memory_bytes


@settings(max_examples=150, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=25), min_size=1, max_size=10),
    depth=st.integers(1, 6),
    keep=st.integers(1, 4),
)
def test_removable_tree_matches_reference(seqs: list[list[int]], depth: int, keep: int) -> None:
    """FIFO insert/remove of the global tree: same counts, best children and child lists (in order)."""
    tree, ref = SuffixTree(depth, removable=True), ReferenceSuffixTree(depth, removable=True)
    for i, seq in enumerate(seqs):
        for t in (tree, ref):
            t.insert(seq)
            if i >= keep:
                t.remove(seqs[i - keep])
        assert tree.nodes == ref.nodes
        assert tree.kids == ref.kids
    for seq in seqs[max(0, len(seqs) - keep) :]:
        tree.remove(seq)
    assert tree.num_nodes == 0 and tree.kids == {}
