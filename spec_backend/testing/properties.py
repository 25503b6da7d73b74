"""Deterministic behavioural checks through the PUBLIC sampler API (no statistics involved).

Every function takes a sampler (anything with the ``RejectionSampler`` call signature) and a device and
returns a ``CheckResult``: greedy exactness, top-k = 1 equals greedy, seeded determinism, batch-order
and batch-composition independence, variable K and output layout, and the edge cases p(x) = 0,
q(x) = 0, zero residual mass (p = q), K = 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spec_backend.sampling import PLACEHOLDER_TOKEN_ID, SamplingMetadata, SpecDecodeMetadata
from spec_backend.testing.report import CheckResult

Batch = tuple[SpecDecodeMetadata, torch.Tensor | None, torch.Tensor, SamplingMetadata]


def random_batch(
    ks: Sequence[int],
    vocab: int,
    *,
    seed: int,
    device: torch.device | str = "cpu",
    temperature: Sequence[float] | None = None,
    top_k: Sequence[int] | None = None,
    with_probs: bool = True,
    match_frac: float = 0.6,
) -> tuple[list[list[int]], torch.Tensor | None, torch.Tensor, SamplingMetadata]:
    """Random logits [T+B, V] and draft probs [T, V]; a draft is its row's argmax w.p. ``match_frac``."""
    gen = torch.Generator().manual_seed(seed)
    rows = sum(ks) + len(ks)
    logits = torch.randn(rows, vocab, generator=gen, dtype=torch.float32) * 3.0  # [T+B, V]
    drafts: list[list[int]] = []
    row = 0
    for k in ks:
        cur = []
        for _ in range(k):
            best = int(torch.argmax(logits[row]))
            other = int(torch.randint(0, vocab, (1,), generator=gen))
            cur.append(best if float(torch.rand(1, generator=gen)) < match_frac else other)
            row += 1
        drafts.append(cur)
        row += 1
    probs = torch.softmax(torch.randn(sum(ks), vocab, generator=gen) * 2.0, dim=-1) if with_probs else None
    n = len(ks)
    sampling = SamplingMetadata.from_lists(
        list(temperature) if temperature is not None else [1.0] * n,
        top_k=list(top_k) if top_k is not None else [0] * n,
        seeds=[seed * 1000 + i for i in range(n)],
        positions=[17 * i + 5 for i in range(n)],
        device=device,
    )
    dev = torch.device(device)
    return drafts, None if probs is None else probs.to(dev), logits.to(dev), sampling


def _call(
    sampler: Any,
    drafts: list[list[int]],
    probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling: SamplingMetadata,
) -> torch.Tensor:
    meta = SpecDecodeMetadata.from_draft_tokens(drafts, device=logits.device)
    return torch.as_tensor(sampler(meta, probs, logits, sampling)).cpu()


def greedy_reference(drafts: list[list[int]], logits: torch.Tensor) -> list[list[int]]:
    """Argmax decoding: accept while draft == argmax of its row, then that row's argmax."""
    best = torch.argmax(logits.cpu(), dim=-1).tolist()
    out, row = [], 0
    for d in drafts:
        emitted = []
        for i, x in enumerate(d):
            if x != best[row + i]:
                break
            emitted.append(x)
        emitted.append(best[row + len(emitted)])
        out.append(emitted)
        row += len(d) + 1
    return out


def rows_of(out: torch.Tensor) -> list[list[int]]:
    """Emitted tokens per row (everything before the first placeholder)."""
    rows = []
    for row in out.tolist():
        n = row.index(PLACEHOLDER_TOKEN_ID) if PLACEHOLDER_TOKEN_ID in row else len(row)
        rows.append(row[:n])
    return rows


def check_greedy_exact(sampler: Any, device: torch.device | str = "cpu", name: str = "") -> CheckResult:
    """Temperature 0: bit-exact argmax decoding (draft probs ignored), also in a mixed batch."""
    ks = [0, 1, 2, 3, 5, 8, 1, 4] * 4
    problems = []
    for with_probs in (False, True):
        temps = [0.0] * len(ks) if with_probs else [0.0 if i % 2 == 0 else 1.0 for i in range(len(ks))]
        drafts, probs, logits, sampling = random_batch(
            ks, 301, seed=7 + with_probs, device=device, temperature=temps, with_probs=with_probs
        )
        got = rows_of(_call(sampler, drafts, probs, logits, sampling))
        want = greedy_reference(drafts, logits)
        bad = [i for i, t in enumerate(temps) if t == 0.0 and got[i] != want[i]]
        if bad:
            i = bad[0]
            problems.append(f"request {i} (K={ks[i]}): got {got[i]}, argmax decoding gives {want[i]}")
    return CheckResult(f"properties/greedy_exact[{name}]", not problems, "; ".join(problems) or "ok")


def check_top_k_one_is_greedy(
    sampler: Any, device: torch.device | str = "cpu", name: str = ""
) -> CheckResult:
    """top_k = 1 at temperature 1 with point-mass drafts leaves the target a point mass: same as greedy."""
    ks = [0, 1, 3, 6, 2] * 6
    drafts, _, logits, sampling = random_batch(
        ks, 97, seed=11, device=device, top_k=[1] * len(ks), with_probs=False
    )
    got = rows_of(_call(sampler, drafts, None, logits, sampling))
    want = greedy_reference(drafts, logits)
    bad = [i for i in range(len(ks)) if got[i] != want[i]]
    detail = "ok" if not bad else f"request {bad[0]}: got {got[bad[0]]}, expected {want[bad[0]]}"
    return CheckResult(f"properties/top_k1_is_greedy[{name}]", not bad, detail)


def check_layout(sampler: Any, device: torch.device | str = "cpu", name: str = "") -> CheckResult:
    """Variable K: shape [B, max K + 1] int32, 1..K_b+1 tokens per row, ids in range, padding only after."""
    ks = [0, 3, 1, 7, 0, 2, 5, 1] * 8
    drafts, probs, logits, sampling = random_batch(ks, 50, seed=3, device=device)
    out = _call(sampler, drafts, probs, logits, sampling)
    problems = []
    if tuple(out.shape) != (len(ks), max(ks) + 1) or out.dtype != torch.int32:
        problems.append(f"output {tuple(out.shape)} {out.dtype}, expected ({len(ks)}, {max(ks) + 1}) int32")
    for b, row in enumerate(out.tolist()):
        emitted = rows_of(torch.tensor([row]))[0]
        if not 1 <= len(emitted) <= ks[b] + 1 or any(not 0 <= t < 50 for t in emitted):
            problems.append(f"row {b} (K={ks[b]}): {row}")
        elif any(t != PLACEHOLDER_TOKEN_ID for t in row[len(emitted) :]):
            problems.append(f"row {b}: token after padding: {row}")
        elif emitted[:-1] != drafts[b][: len(emitted) - 1]:
            problems.append(f"row {b}: accepted tokens {emitted[:-1]} are not a prefix of drafts {drafts[b]}")
    return CheckResult(f"properties/layout_variable_k[{name}]", not problems, "; ".join(problems[:3]) or "ok")


def check_determinism(sampler: Any, device: torch.device | str = "cpu", name: str = "") -> CheckResult:
    """Same seeds and positions: identical output; other seeds / positions: different outputs."""
    ks = [4, 2, 6, 3] * 16
    drafts, probs, logits, sampling = random_batch(ks, 40, seed=5, device=device, match_frac=0.3)
    first = _call(sampler, drafts, probs, logits, sampling)
    second = _call(sampler, drafts, probs, logits, sampling)
    assert sampling.seeds is not None and sampling.positions is not None
    reseeded = SamplingMetadata(
        sampling.temperature, sampling.top_k, sampling.top_p, sampling.seeds + 1_000_003, sampling.positions
    )
    moved = SamplingMetadata(
        sampling.temperature, sampling.top_k, sampling.top_p, sampling.seeds, sampling.positions + 1
    )
    third = _call(sampler, drafts, probs, logits, reseeded)
    fourth = _call(sampler, drafts, probs, logits, moved)
    problems = []
    if not torch.equal(first, second):
        problems.append("two identical seeded calls differ")
    if torch.equal(first, third):
        problems.append("changing every seed changed nothing (seeds ignored?)")
    if torch.equal(first, fourth):
        problems.append("changing every position changed nothing (positions ignored?)")
    return CheckResult(f"properties/seeded_determinism[{name}]", not problems, "; ".join(problems) or "ok")


def check_batch_independence(sampler: Any, device: torch.device | str = "cpu", name: str = "") -> CheckResult:
    """A seeded request's output depends on neither its place in the batch nor the other requests."""
    ks = [3, 0, 5, 1, 2, 4] * 6
    drafts, probs, logits, sampling = random_batch(ks, 60, seed=9, device=device, match_frac=0.4)
    base = rows_of(_call(sampler, drafts, probs, logits, sampling))
    assert probs is not None and sampling.seeds is not None and sampling.positions is not None
    perm = torch.randperm(len(ks), generator=torch.Generator().manual_seed(1)).tolist()
    starts, row, dstarts, drow = [], 0, [], 0
    for k in ks:
        starts.append(row)
        dstarts.append(drow)
        row += k + 1
        drow += k
    p_logits = torch.cat([logits[starts[b] : starts[b] + ks[b] + 1] for b in perm])
    p_probs = torch.cat([probs[dstarts[b] : dstarts[b] + ks[b]] for b in perm])
    idx = torch.tensor(perm, device=sampling.temperature.device)
    p_sampling = SamplingMetadata(
        sampling.temperature[idx],
        sampling.top_k[idx],
        sampling.top_p[idx],
        sampling.seeds[idx],
        sampling.positions[idx],
    )
    permuted = rows_of(_call(sampler, [drafts[b] for b in perm], p_probs, p_logits, p_sampling))
    problems = [
        f"request {b} moved to slot {i}: {base[b]} -> {permuted[i]}"
        for i, b in enumerate(perm)
        if permuted[i] != base[b]
    ]
    for b in (0, 2, 5):  # each alone in a batch of one
        alone = rows_of(
            _call(
                sampler,
                [drafts[b]],
                probs[dstarts[b] : dstarts[b] + ks[b]],
                logits[starts[b] : starts[b] + ks[b] + 1],
                SamplingMetadata(
                    sampling.temperature[b : b + 1],
                    sampling.top_k[b : b + 1],
                    sampling.top_p[b : b + 1],
                    sampling.seeds[b : b + 1],
                    sampling.positions[b : b + 1],
                ),
            )
        )[0]
        if alone != base[b]:
            problems.append(f"request {b} alone: {alone}, in the batch: {base[b]}")
    return CheckResult(
        f"properties/batch_independence[{name}]", not problems, "; ".join(problems[:3]) or "ok"
    )


def check_edge_cases(sampler: Any, device: torch.device | str = "cpu", name: str = "") -> CheckResult:
    """p(x) = 0 drafts are never accepted; q(x) = 0 drafts give valid tokens; p = q accepts everything;
    K = 0 everywhere gives one token per request; tokens the target forbids are never emitted."""
    n, vocab, dev = 512, 6, torch.device(device)
    problems: list[str] = []
    logits = torch.log(torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4, 0.0]))  # p(0) = p(5) = 0
    rows = logits.repeat(3 * n, 1).to(dev)  # K = 2: [3n, V]
    sampling = SamplingMetadata.from_lists([1.0] * n, seeds=list(range(n)), positions=[3] * n, device=dev)
    # (a) draft with p(x) = 0, both as a point mass and with draft probs.
    q = torch.full((2 * n, vocab), 1.0 / vocab, device=dev)
    for probs in (None, q):
        out = _call(sampler, [[0, 3]] * n, probs, rows, sampling)
        if (out[:, 0] == 0).any() or (out == 5).any():
            problems.append(
                f"a draft / token with p = 0 was emitted (draft_probs={'none' if probs is None else 'q'})"
            )
    # (b) drafted token with q(x) = 0 < p(x): must still yield valid, allowed tokens.
    q0 = q.clone()
    q0[:, 4] = 0.0
    q0 = q0 / q0.sum(dim=1, keepdim=True)
    out = _call(sampler, [[4, 4]] * n, q0, rows, sampling)
    emitted = rows_of(out)
    if any(len(e) == 0 or any(t in (0, 5) or not 0 <= t < vocab for t in e) for e in emitted):
        problems.append("q(x) = 0 drafts produced an invalid or forbidden token")
    # (c) zero residual: draft probs equal to the target: every draft accepted, bonus from p.
    p = torch.softmax(rows[:1], dim=-1).repeat(2 * n, 1)
    out = _call(sampler, [[3, 1]] * n, p, rows, sampling)
    if (out == PLACEHOLDER_TOKEN_ID).any() or (out[:, :2] != torch.tensor([3, 1])).any():
        problems.append("p == q did not accept every draft")
    # (d) K = 0 for every request: [B, 1] and tokens from the target's support only.
    out = _call(sampler, [[]] * n, None, rows[:n], sampling)
    if tuple(out.shape) != (n, 1) or ((out == 0) | (out == 5) | (out < 0)).any():
        problems.append(f"K = 0 batch gave shape {tuple(out.shape)} or forbidden tokens")
    return CheckResult(f"properties/edge_cases[{name}]", not problems, "; ".join(problems) or "ok")


PROPERTY_CHECKS = (
    check_greedy_exact,
    check_top_k_one_is_greedy,
    check_layout,
    check_determinism,
    check_batch_independence,
    check_edge_cases,
)

__all__ = [
    "PROPERTY_CHECKS",
    "check_batch_independence",
    "check_determinism",
    "check_edge_cases",
    "check_greedy_exact",
    "check_layout",
    "check_top_k_one_is_greedy",
    "greedy_reference",
    "random_batch",
    "rows_of",
]
