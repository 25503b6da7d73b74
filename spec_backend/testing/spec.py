"""Float64 specification of every verification rule, for ONE draft block.

Each rule is written as plainly as possible from its definition (not from any kernel), so that the
conformance suite can enumerate it exactly:

* ``standard``: accept ``x_i`` with probability ``min(1, p_i(x_i)/q_i(x_i))`` until the first rejection;
  on rejection at ``i`` emit a token from ``norm(max(p_i − q_i, 0))``; after K acceptances a bonus token
  from ``p_{K+1}``.
* ``block-lossless``: Sun et al. 2024 (arXiv 2403.10444, Alg. 2). ``b_0 = 1``,
  ``b_i = min(1, b_{i−1}·p_i(x_i)/q_i(x_i))``,
  ``r_i = Σ_v max(0, b_i·p_{i+1}(v) − q_{i+1}(v))``, ``h_i = r_i / (r_i + 1 − b_i)`` for ``i < K``,
  ``h_K = b_K``; ``τ`` = the LAST ``i`` with ``η_i ≤ h_i`` (``h_0 = 1``); emit ``x_1..x_τ`` then the bonus
  (``τ = K``) or a token from ``norm(max(0, b_τ·p_{τ+1} − q_{τ+1}))``.
* ``block-cumulative`` (vllm-ascend's block verification kernel, lossy): ``π_0 = 1``,
  ``π_i = min(1, π_{i−1}·ρ_i)``; position i *passes* iff ``q_i(x_i) > 0`` and ``π_i ≥ t_i·Π_{j≤i} u_j``
  (``t_i = 1`` without entropy verify); ``τ`` = the LAST passing position (0 if none), and every draft up to
  it is accepted; then the token-level residual ``norm(max(p_{τ+1} − q_{τ+1}, 0))`` or the bonus.
  vllm-ascend runs it only when the batch's longest draft block has K ≥ 3 (``RuleParams.batch_max_k``);
  otherwise the batch is verified by the token-level rule of ``entropy`` (with ``t_i = 1`` when entropy
  verify is off).
* ``entropy`` (vllm-ascend, lossy): ``t_i = min(exp(−α·H_i), θ)``, ``H_i = −Σ_v p(v)·ln(p(v) + 1e−10)`` of
  the raw logits' softmax; accept ``x_i`` iff ``q_i(x_i) > 0`` and ``ρ_i ≥ t_i·u_i``, i.e. with probability
  ``min(1, ρ_i/t_i)`` (0 when ``q_i(x_i) = 0``), until the first rejection; token-level residual as in
  ``standard``.
* ``block-lossless+entropy`` (lossy): lossless block verification with ``b_i = min(1, b_{i−1}·ρ_i/t_i)``;
  ``block-cumulative+entropy``: ``block-cumulative`` with the entropy thresholds ``t_i`` (the current
  position's only).
* ``synthetic`` (benchmarking): one uniform per request, ``P(τ ≥ i) = rates[i−1]``, then a token from
  the target row ``p_{τ+1}``.

The acceptance inequalities are strict or not without consequence for these laws (ties have probability 0);
the sampler uses vllm-ascend's ``≥`` in its compatibility rules.
``ρ_i = p_i(x_i)/q_i(x_i)`` (``+inf`` when ``q_i(x_i) = 0 < p_i(x_i)``; ``0`` when ``p_i(x_i) = 0``).

The cumulative rule's acceptance-length law involves products of uniforms; it is computed through the
equivalent Erlang random walk ``W_i = −Σ ln u_j`` with nested Gauss–Legendre quadrature of analytic
integrands (error far below 1e-12 for the block sizes used here), and the ``τ = K`` tail in closed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from spec_backend.verify_rules import CUMULATIVE_MIN_SPEC_LEN, REGISTRY, ModeName, VerifyRule, rule_named

#: a rule's name: its one name in ``spec_backend.verify_rules`` (the sampler's ``mode_name``)
Rule = ModeName
#: every rule with a float64 spec (``VerifyRule.spec``), in the registry's order
RULES: tuple[Rule, ...] = tuple(r.name for r in REGISTRY if r.spec)
#: Rules whose emitted stream has the target's joint distribution.
LOSSLESS_RULES: frozenset[str] = frozenset(r.name for r in REGISTRY if r.spec and r.lossless)

F64 = NDArray[np.float64]
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(28)


@dataclass(frozen=True)
class RuleParams:
    """Parameters of the lossy rules: ``theta`` = posterior_threshold θ, ``alpha`` = posterior_alpha α,
    ``rates`` = synthetic acceptance rates (entry i: P(first i+1 drafts accepted))."""

    theta: float = 0.95
    alpha: float = 0.4
    rates: tuple[float, ...] = ()
    #: longest draft block of the verified batch (the cumulative rule's K >= 3 switch); None: this block's K
    batch_max_k: int | None = None


@dataclass(frozen=True)
class BlockOutcome:
    """Law of one verification step for a fixed draft block.

    ``accept_probs [K+1]``: P(τ = i) for i = 0..K. ``final_dists [K+1, V]``: law of the token emitted
    after the accepted prefix, given τ = i (the residual for i < K, the bonus distribution for i = K).
    """

    accept_probs: F64
    final_dists: F64


def _normalise(v: F64, fallback: F64) -> F64:
    total = float(v.sum())
    if total <= 0.0:  # only reachable on zero-probability events; any valid distribution will do
        return fallback
    return v / total


def ratios(p: F64, q: F64, drafts: tuple[int, ...]) -> F64:
    """``ρ_i = p_i(x_i)/q_i(x_i)`` for i = 1..K. p: [K+1, V], q: [K, V] -> [K]."""
    out = np.empty(len(drafts), dtype=np.float64)
    for i, x in enumerate(drafts):
        pi, qi = float(p[i, x]), float(q[i, x])
        out[i] = 0.0 if pi == 0.0 else (math.inf if qi == 0.0 else pi / qi)
    return out


def _token_residuals(p: F64, q: F64) -> F64:
    """Final-token laws for the token-level rules: rows 0..K−1 residuals, row K the bonus. -> [K+1, V]."""
    k = q.shape[0]
    rows = [_normalise(np.maximum(p[i] - q[i], 0.0), p[i]) for i in range(k)]
    rows.append(p[k])
    return np.stack(rows)


def _sequential(accept: F64) -> F64:
    """P(τ = i) when position i is accepted independently w.p. ``accept[i]`` until the first rejection."""
    k = accept.shape[0]
    out = np.zeros(k + 1, dtype=np.float64)
    alive = 1.0
    for i in range(k):
        out[i] = alive * (1.0 - accept[i])
        alive *= accept[i]
    out[k] = alive
    return out


def standard_outcome(p: F64, q: F64, drafts: tuple[int, ...]) -> BlockOutcome:
    """Token-by-token verification (Leviathan et al. / Chen et al.)."""
    accept = np.minimum(1.0, ratios(p, q, drafts))
    return BlockOutcome(_sequential(accept), _token_residuals(p, q))


def entropy_outcome(
    p: F64, q: F64, drafts: tuple[int, ...], params: RuleParams, entropy_p: F64 | None = None
) -> BlockOutcome:
    """vllm-ascend's entropy verify: accept iff q(x) > 0 and ρ ≥ min(exp(−α·H), θ)·u (lossy).

    ``H`` is the entropy of ``entropy_p`` [K, V] (the raw logits' softmax; default: the target rows).
    """
    return token_compat_outcome(p, q, drafts, entropy_thresholds(p[: len(drafts)], params, entropy_p))


def token_compat_outcome(p: F64, q: F64, drafts: tuple[int, ...], thresholds: F64) -> BlockOutcome:
    """vllm-ascend's token-level rule: accept x_i iff q_i(x_i) > 0 and ρ_i ≥ t_i·u_i, until a rejection."""
    q_x = np.array([q[i, x] for i, x in enumerate(drafts)], dtype=np.float64)  # [K]
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(q_x > 0.0, np.minimum(1.0, ratios(p, q, drafts) / thresholds), 0.0)
    return BlockOutcome(_sequential(accept), _token_residuals(p, q))


def block_outcome(p: F64, q: F64, drafts: tuple[int, ...], thresholds: F64 | None = None) -> BlockOutcome:
    """Lossless block verification (Sun et al. 2024, Alg. 2); with entropy ``thresholds`` [K] the ratios
    become ρ/τ (lossy)."""
    k = len(drafts)
    rho = ratios(p, q, drafts)
    if thresholds is not None:
        rho = rho / thresholds
    b = np.ones(k + 1, dtype=np.float64)  # b[i] = b_i, b_0 = 1
    for i in range(k):
        b[i + 1] = min(1.0, b[i] * rho[i]) if b[i] > 0.0 else 0.0
    h = np.ones(k + 1, dtype=np.float64)
    finals = []
    for i in range(k):
        weighted = np.maximum(b[i] * p[i] - q[i], 0.0)  # row i holds p_{i+1}, q_{i+1}
        r = float(weighted.sum())
        denom = r + 1.0 - b[i]
        h[i] = 1.0 if denom <= 0.0 else r / denom  # r = 0 and b = 1: p = q here, continuation is certain
        finals.append(_normalise(weighted, p[i]))
    h[0] = 1.0
    h[k] = b[k]
    finals.append(p[k])
    accept_probs = np.zeros(k + 1, dtype=np.float64)
    for i in range(k + 1):  # τ = i: η_i ≤ h_i and η_j > h_j for all j > i
        accept_probs[i] = h[i] * float(np.prod(1.0 - h[i + 1 :]))
    return BlockOutcome(accept_probs, np.stack(finals))


def _erlang_tail(n: int, t: float) -> float:
    """P(Gamma(n, 1) ≥ t) for integer n ≥ 1 (closed form)."""
    if t <= 0.0:
        return 1.0
    term, total = 1.0, 1.0
    for m in range(1, n):
        term *= t / m
        total += term
    return math.exp(-t) * total


def _stay_below(i: int, w: F64, t: F64, k: int) -> F64:
    """g_i(w) = P(W_j < t_j for all j in (i, k] | W_i = w), W the Exp(1) random walk, t non-decreasing.

    w: [M] -> [M]. The integrand is analytic on each integration range, so Gauss–Legendre is exact to
    rounding.
    """
    if i == k:
        return np.ones_like(w)
    out = np.zeros_like(w)
    live = w < t[i + 1]
    if not live.any():
        return out
    start = w[live]  # [M']
    length = t[i + 1] - start  # [M']
    steps = 0.5 * length[:, None] * (_GL_NODES[None, :] + 1.0)  # [M', n]
    weights = 0.5 * length[:, None] * _GL_WEIGHTS[None, :]  # [M', n]
    inner = _stay_below(i + 1, (start[:, None] + steps).ravel(), t, k).reshape(steps.shape)
    out[live] = (weights * np.exp(-steps) * inner).sum(axis=1)
    return out


def cumulative_accept_probs(bounds: F64) -> F64:
    """P(τ = i) for τ = max{i : Π_{j≤i} u_j ≤ c_i} (0 when no position passes). ``bounds`` c [K] -> [K+1].

    ``c_i = π_i / t_i`` for a position that may pass and ``0`` for one that may not (``q_i(x_i) = 0``).
    With W_i = −Σ ln u_j (an Erlang(i) walk) and t'_i = −ln c_i the event is ``W_i ≥ t'_i``; since W
    increases, "no j > i passes" is "W_j < min_{l ≥ j} t'_l", a non-decreasing barrier.
    """
    k = bounds.shape[0]
    out = np.zeros(k + 1, dtype=np.float64)
    passing = np.flatnonzero(bounds > 0.0)
    kk = int(passing[-1]) + 1 if passing.size else 0  # positions after the last possible pass never pass
    with np.errstate(divide="ignore"):
        t = np.concatenate([[0.0], -np.log(bounds[:kk])])  # t'_0..t'_kk (+inf where c = 0)
    barrier = np.minimum.accumulate(t[::-1])[::-1]  # suffix minima: non-decreasing
    barrier = np.maximum(barrier, 0.0)  # W ≥ 0 anyway
    out[0] = float(_stay_below(0, np.zeros(1), barrier, kk)[0])
    for i in range(1, kk):
        lo, hi = max(t[i], 0.0), barrier[i + 1]
        if hi <= lo:
            continue
        nodes = lo + 0.5 * (hi - lo) * (_GL_NODES + 1.0)  # [n]
        density = nodes ** (i - 1) * np.exp(-nodes) / math.factorial(i - 1)  # Erlang(i) density
        out[i] = float((0.5 * (hi - lo) * _GL_WEIGHTS * density * _stay_below(i, nodes, barrier, kk)).sum())
    if kk >= 1:
        out[kk] = _erlang_tail(kk, float(t[kk]))
    return out


def entropy_thresholds(p: F64, params: RuleParams, entropy_p: F64 | None = None) -> F64:
    """τ_i = min(exp(−α·H_i), θ), H_i = −Σ p·ln(p + 1e−10) of ``entropy_p`` rows (default ``p``). -> [K]."""
    src = p if entropy_p is None else entropy_p
    entropy = -(src * np.log(src + 1e-10)).sum(axis=1)  # vllm-ascend's ε inside the log
    return np.asarray(np.minimum(np.exp(-params.alpha * entropy), params.theta), dtype=np.float64)


def cumulative_outcome(
    p: F64, q: F64, drafts: tuple[int, ...], thresholds: F64 | None = None, batch_max_k: int | None = None
) -> BlockOutcome:
    """vllm-ascend's cumulative block rule (lossy); ``thresholds`` [K]: with entropy verify.

    A batch whose longest block is shorter than 3 (``batch_max_k``, default this block's K) is verified
    token by token, as vllm-ascend does.
    """
    k = len(drafts)
    taus = np.ones(k, dtype=np.float64) if thresholds is None else thresholds
    if (k if batch_max_k is None else batch_max_k) < CUMULATIVE_MIN_SPEC_LEN:
        return token_compat_outcome(p, q, drafts, taus)
    rho = ratios(p, q, drafts)
    pi, bounds = 1.0, np.zeros(k, dtype=np.float64)
    for i, x in enumerate(drafts):
        pi = min(1.0, pi * rho[i]) if pi > 0.0 else 0.0
        bounds[i] = pi / taus[i] if q[i, x] > 0.0 else 0.0
    return BlockOutcome(cumulative_accept_probs(bounds), _token_residuals(p, q))


def synthetic_outcome(p: F64, drafts: tuple[int, ...], rates: tuple[float, ...]) -> BlockOutcome:
    """Synthetic mode: P(τ ≥ i) = rates[i−1] (one uniform per request); then a token from p_{τ+1}."""
    k = len(drafts)
    alive = np.concatenate([[1.0], np.asarray(rates[:k], dtype=np.float64), [0.0]])  # P(τ ≥ i), i = 0..K+1
    return BlockOutcome(alive[:-1] - alive[1:], p.copy())


def spec_entry(rule: str) -> VerifyRule:
    """The registry entry of a rule with a float64 spec; ``ValueError`` naming the rule and those rules."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")
    return rule_named(rule)


def block_step(
    rule: str, p: F64, q: F64, drafts: tuple[int, ...], params: RuleParams, entropy_p: F64 | None = None
) -> BlockOutcome:
    """Dispatch: the law of one verification step of ``rule``. p: [K+1, V], q: [K, V].

    The outcome is chosen by the registry entry's selector flags (``spec_backend.verify_rules``): the
    same ``block`` / ``entropy`` fields that pick the sampler's kernel.
    """
    entry = spec_entry(rule)
    if entry.kernel is None:  # synthetic: accept counts from the rates, not from p and q
        return synthetic_outcome(p, drafts, params.rates)
    k = len(drafts)
    thresholds = entropy_thresholds(p[:k], params, entropy_p) if entry.entropy else None  # [K]
    if entry.block == "cumulative":
        return cumulative_outcome(p, q, drafts, thresholds, params.batch_max_k)
    if entry.block == "lossless":
        return block_outcome(p, q, drafts, thresholds)
    if thresholds is not None:  # entropy verify: vllm-ascend's token-level rule
        return token_compat_outcome(p, q, drafts, thresholds)
    return standard_outcome(p, q, drafts)


__all__ = [
    "LOSSLESS_RULES",
    "RULES",
    "BlockOutcome",
    "Rule",
    "RuleParams",
    "block_outcome",
    "block_step",
    "cumulative_accept_probs",
    "cumulative_outcome",
    "entropy_outcome",
    "entropy_thresholds",
    "ratios",
    "spec_entry",
    "standard_outcome",
    "synthetic_outcome",
    "token_compat_outcome",
]
