"""Greedy multi-path block verification (GBV; ``testing.gbv_spec``, ``sampling.gbv_ops``): enumerated
exactly on small vocabularies it keeps the target's law for 1..4 i.i.d. draft paths, the selected path's
law is the skewed draft, more paths emit more for a draft far from the target and less for a draft equal
to it; the naive rule (the selected path verified with the draft's
own law) changes the law. The torch op's outcomes on fixed tries match the exact law by Pearson χ²
(noise floor p >= 1e-5), the same op told one path where there are two fails it (negative control), and
the batched op equals the per-request reference token for token on random batches."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from spec_backend.sampling.gbv_reference import gbv_reference
from spec_backend.sampling.torch_ops import TorchSamplerOps
from spec_backend.sampling.tree_ops import NO_NODE
from spec_backend.testing import gbv_spec
from spec_backend.testing.exact import ToyModel, continued, target_joint, total_variation
from spec_backend.testing.montecarlo import chi_square
from spec_backend.verify_rules import TREE_REGISTRY

V = 3


def _models(seed: int) -> tuple[ToyModel, ToyModel]:
    return ToyModel(V, seed=seed, zero_frac=0.2), ToyModel(V, seed=seed + 50, scale=2.0)


def _deviation(target: ToyModel, draft: ToyModel, paths: int, length: int, rule: str) -> float:
    law = gbv_spec.emitted_law(target, draft, paths, length, rule)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    return total_variation(continued(law, target, length + 1), target_joint(target, length + 1))


@pytest.mark.parametrize("paths", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gbv_keeps_the_target_law(paths: int, seed: int) -> None:
    target, draft = _models(seed)
    assert _deviation(target, draft, paths, 2, "gbv") < 1e-12


def test_gbv_keeps_the_law_on_a_four_token_vocabulary_and_one_step_paths() -> None:
    target, draft = ToyModel(4, seed=9, zero_frac=0.25), ToyModel(4, seed=59, top_k=2)
    for paths in (2, 4):
        assert _deviation(target, draft, paths, 1, "gbv") < 1e-12


@pytest.mark.parametrize("paths", [2, 3])
def test_the_unskewed_rule_changes_the_law(paths: int) -> None:
    target, draft = _models(1)
    assert _deviation(target, draft, paths, 2, "gbv_unskewed") > 1e-2


def test_the_selected_path_has_the_skewed_law() -> None:
    target, draft = _models(0)
    for paths in (1, 2, 3):
        law = gbv_spec.selected_law(draft, target, paths, 2)
        for path, mass in law.items():
            rows = gbv_spec.skewed_rows(path, target, draft, paths)  # [L, V]
            assert mass == pytest.approx(float(np.prod([rows[d, t] for d, t in enumerate(path)])), abs=1e-14)
        assert sum(law.values()) == pytest.approx(1.0)


def test_more_paths_emit_less_when_the_draft_is_the_target() -> None:
    """The other side (why ``tree_paths`` is a choice, not a default): with ``q = p`` one path is always
    accepted whole, while the greatest of several paths is biased (every ratio is 1, so the order is the
    token ids) and block verification of it accepts less: 3.0 tokens per step, then about 2.49, 2.26."""
    target = ToyModel(V, seed=0)
    emitted = [
        sum(m * len(s) for s, m in gbv_spec.emitted_law(target, target, k, 2).items()) for k in (1, 2, 3)
    ]
    assert emitted[0] == pytest.approx(3.0)
    assert emitted[2] < emitted[1] < emitted[0] - 0.3, emitted


def test_one_path_is_block_verification_and_more_paths_emit_more() -> None:
    """A draft far from the target (another random model): the greatest of several paths leans to the
    tokens the draft underrates, and the step emits more (about 2.13, 2.56, 2.69 tokens)."""
    target, draft = _models(0)
    p, q = target(()), draft(())
    assert np.array_equal(gbv_spec.skew(p, q, 0.0, 1.0, 1), q)
    emitted = [
        sum(m * len(s) for s, m in gbv_spec.emitted_law(target, draft, k, 2).items()) for k in (1, 2, 3)
    ]
    assert emitted[0] < emitted[1] - 0.1 < emitted[2] - 0.2, emitted


def test_the_registry_names_gbv_lossless_and_its_control_lossy() -> None:
    by_name = {r.name: r for r in TREE_REGISTRY if r.paths}
    assert gbv_spec.LOSSLESS_RULES == ("gbv",)
    assert by_name["gbv"].kernel is not None and by_name["gbv"].draft_probs
    assert by_name["gbv_unskewed"].kernel is None and not by_name["gbv_unskewed"].lossless


def _trie(drafted: list[tuple[int, ...]]) -> tuple[list[int], list[int], list[tuple[int, ...]]]:
    """Parents, tokens and node paths of the trie of ``drafted``, level by level."""
    nodes: list[tuple[int, ...]] = []
    for depth in range(1, max(len(p) for p in drafted) + 1):
        for prefix in dict.fromkeys(p[:depth] for p in drafted):
            nodes.append(prefix)
    index = {n: i for i, n in enumerate(nodes)}
    return [index.get(n[:-1], -1) for n in nodes], [n[-1] for n in nodes], nodes


def _op_counts(
    drafted: list[tuple[int, ...]], target: ToyModel, draft: ToyModel, paths: int, n: int
) -> Counter[tuple[int, ...]]:
    """What ``gbv_verify`` emits for one trie under ``n`` independent uniforms (a batch of ``n`` copies)."""
    parents, tokens, nodes = _trie(drafted)
    m = len(nodes)
    rows = torch.tensor(np.stack([target(())] + [target(node) for node in nodes]))  # [M + 1, V]
    q = torch.tensor(np.stack([draft(node[:-1]) for node in nodes]))  # [M, V]
    gen = torch.Generator().manual_seed(7)
    path, final = TorchSamplerOps().gbv_verify(
        torch.tensor([parents] * n), torch.tensor([tokens] * n), rows.repeat(n, 1), None,
        torch.arange(n) * (m + 1), torch.zeros(n, dtype=torch.bool),
        torch.rand((n, m + 1), generator=gen, dtype=torch.float64), q.expand(n, -1, -1), paths=paths,
    )  # fmt: skip
    out: Counter[tuple[int, ...]] = Counter()
    for row, last in zip(path.tolist(), final.tolist(), strict=True):
        out[(*(tokens[i] for i in row if i >= 0), last)] += 1
    return out


@pytest.mark.parametrize(
    "drafted", [[(0, 1), (2, 0)], [(1, 2), (1, 0), (2, 2)], [(0, 0), (0, 0)]], ids=["two", "three", "same"]
)
def test_the_torch_op_emits_the_exact_law_of_each_trie(drafted: list[tuple[int, ...]]) -> None:
    target, draft = _models(0)
    paths = len(drafted)
    counts = _op_counts(drafted, target, draft, paths, 6000)
    fit = chi_square(counts, gbv_spec.trie_law(drafted, target, draft, paths))
    assert fit.passed, fit


def test_the_op_told_one_path_of_two_is_caught() -> None:
    """Negative control: the trie of two paths verified as if one path had been drawn (the unskewed
    rule) emits another law, which the χ² test against GBV's rejects."""
    target, draft = _models(2)
    drafted = [(1, 0), (2, 0)]
    want = gbv_spec.trie_law(drafted, target, draft, 2)
    assert total_variation(want, gbv_spec.trie_law(drafted, target, draft, 2, "gbv_unskewed")) > 0.2
    assert not chi_square(_op_counts(drafted, target, draft, 1, 6000), want).passed


def test_greedy_requests_follow_the_argmax_down_the_trie() -> None:
    target, _ = _models(2)
    parents, tokens, nodes = _trie([(0, 1), (2, 0), (2, 2)])
    rows = torch.tensor(np.stack([target(())] + [target(node) for node in nodes])).float()  # [M + 1, V]
    path, final = TorchSamplerOps().gbv_verify(
        torch.tensor([parents]), torch.tensor([tokens]), rows, rows.argmax(dim=-1), torch.tensor([0]),
        torch.ones(1, dtype=torch.bool), torch.zeros((1, len(nodes) + 1), dtype=torch.float64), None, paths=3,
    )  # fmt: skip
    emitted = [tokens[i] for i in path[0].tolist() if i >= 0] + [int(final[0])]
    greedy: list[int] = []
    while len(greedy) < len(emitted):
        greedy.append(int(np.argmax(target(tuple(greedy)))))
    assert emitted == greedy


def _random_tries(gen: torch.Generator, batch: int, paths: int, depth: int, vocab: int) -> tuple[Any, ...]:
    """A batch of tries of random i.i.d.-looking paths (padded to the widest), random target rows and
    draft rows, some requests greedy, some with fewer levels."""
    layouts, token_rows = [], []
    for _ in range(batch):
        levels = int(torch.randint(0, depth + 1, (1,), generator=gen))
        drafted = [tuple(torch.randint(0, vocab, (levels,), generator=gen).tolist()) for _ in range(paths)]
        parents, tokens, _ = _trie(drafted) if levels else ([], [], [])
        layouts.append(parents)
        token_rows.append(tokens)
    m = max(max(len(p) for p in layouts), 1)
    parents = torch.tensor([p + [NO_NODE] * (m - len(p)) for p in layouts])  # [B, M]
    tokens = torch.tensor([t + [0] * (m - len(t)) for t in token_rows])  # [B, M]
    logits = torch.randn((batch * (m + 1), vocab), generator=gen, dtype=torch.float64) * 2
    logits[torch.rand(logits.shape, generator=gen) < 0.2] = -float("inf")  # zero-probability tokens
    probs = torch.softmax(logits, dim=-1).float()  # [N, V]
    q = torch.softmax(torch.randn((batch, m, vocab), generator=gen, dtype=torch.float64) * 2, dim=-1)
    greedy = torch.rand(batch, generator=gen) < 0.3
    uniforms = torch.rand((batch, m + 1), generator=gen, dtype=torch.float64)
    starts = torch.arange(batch) * (m + 1)
    return parents, tokens, probs, probs.argmax(dim=-1), starts, greedy, uniforms, q.float()


@pytest.mark.parametrize("paths", [1, 2, 3, 5])
def test_the_batched_op_equals_the_per_request_reference(paths: int) -> None:
    gen = torch.Generator().manual_seed(paths)
    for _ in range(20):
        args = _random_tries(gen, 6, paths, 3, 7)
        want = gbv_reference(*args, paths=paths)
        got = TorchSamplerOps().gbv_verify(*args, paths=paths)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (got, want)


def test_a_batch_without_drafts_emits_the_targets_next_token() -> None:
    """Every request past its drafts (the last step of a request: budget 0): the final token is the
    root row's argmax (greedy) or its inverse-CDF draw, as the reference gives."""
    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn((4, 5), generator=gen), dim=-1)  # [N = B·(M + 1), V]
    args = (
        torch.full((2, 1), NO_NODE), torch.zeros((2, 1), dtype=torch.int64), probs, probs.argmax(dim=-1),
        torch.tensor([0, 2]), torch.tensor([True, False]),
        torch.rand((2, 2), generator=gen, dtype=torch.float64), None,
    )  # fmt: skip
    got = TorchSamplerOps().gbv_verify(*args, paths=2)
    assert torch.equal(got[0], torch.full((2, 1), -1)) and got[1][0] == probs[0].argmax()
    assert torch.equal(got[1], gbv_reference(*args, paths=2)[1])
