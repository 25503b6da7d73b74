"""Float64 law of greedy multi-path block verification (GBV; Thomas & Pal, arXiv 2602.16961), exactly.

Glossary:

* *paths* — ``K`` draft paths of length ``L``, each drawn from the draft ``q`` independently of the
  others (i.i.d.), merged into a trie (paths that share a prefix share its nodes); the target scores
  every trie node in one forward.
* *order* — at a context ``c``, tokens ranked by ``ρ_c(v) = p(v|c) / q(v|c)`` ascending (``q = 0``:
  ``+inf``, ``p = q = 0``: 0), ties by token id; two paths compare at their first differing token under the
  order of the context before it (lexicographically). The *selected path* is the greatest of the ``K``:
  from the root, the drafted child ranked highest, then the same below it.
* *skewed draft* ``q^Γ`` — the law of the selected path, autoregressively: with ``x_c`` the draft mass of
  prefix ``c`` (``x_root = 1``), ``A_c`` the draft mass of the paths ranked below every path through ``c``
  (``A_root = 0``) and ``F_c`` the inclusive cumulative sum of ``q(·|c)`` in the order,
  ``q^Γ(v|c) = [(A + x·F(v))^K − (A + x·(F(v) − q(v)))^K] / [(A + x)^K − A^K]``;
  stepping into ``t``: ``A ← A + x·(F(t) − q(t))``, ``x ← x·q(t)``. ``K = 1`` gives ``q``.
* *verification* — block verification (Sun et al., ``spec.block_outcome``) of the selected path against
  ``p`` with ``q^Γ`` as its draft law: lossless because the selected path is exactly ``q^Γ``-distributed
  and nothing else reaches the verifier. Only a prefix of the selected path can be accepted; the other
  paths act through the selection.

``emitted_law`` enumerates every ``K``-tuple of paths (with its probability) and every outcome of the
rule; ``rule="gbv_unskewed"`` (a negative control, lossy) verifies the selected path with ``q`` itself,
as if it had been drawn alone.
"""

from __future__ import annotations

import itertools

import numpy as np

from spec_backend.testing.exact import Prefix, SeqDist
from spec_backend.testing.spec import F64, block_outcome
from spec_backend.testing.tree_spec import Model
from spec_backend.verify_rules import TREE_REGISTRY

#: the registry's rules over i.i.d. paths (``TreeRule.paths``)
RULES = tuple(rule.name for rule in TREE_REGISTRY if rule.paths)
LOSSLESS_RULES = tuple(rule.name for rule in TREE_REGISTRY if rule.paths and rule.lossless)


def order_key(p: F64, q: F64) -> F64:
    """``ρ = p/q`` per token (``+inf`` where only ``q`` is 0, 0 where both are): the order's key, ties by
    token id."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.where(p > 0, np.inf, 0.0))
    out: F64 = rho.astype(np.float64)
    return out


def ranks(p: F64, q: F64) -> F64:
    """Each token's rank in the order (0 = lowest)."""
    order = np.argsort(order_key(p, q), kind="stable")
    rank = np.empty(len(order), dtype=np.float64)
    rank[order] = np.arange(len(order), dtype=np.float64)
    return rank


def skew(p: F64, q: F64, above: float, mass: float, paths: int) -> F64:
    """``q^Γ(·|c)`` at a context with ``A = above`` and ``x = mass`` (module docstring), computed as
    ``q(v) · Σ_i a^i b^(K−1−i)`` over ``a, b`` scaled by ``A + x`` and normalised (the difference of powers
    divided by ``a − b = x·q(v)``; the common factor cancels)."""
    order = np.argsort(order_key(p, q), kind="stable")
    cdf = np.empty_like(q)
    cdf[order] = np.cumsum(q[order])
    scale = above + mass
    hi, lo = (above + mass * cdf) / scale, (above + mass * (cdf - q)) / scale  # [V] in [0, 1]
    series = sum(hi**i * lo ** (paths - 1 - i) for i in range(paths))
    weight = q * series
    total = float(weight.sum())
    out: F64 = weight / total if total > 0 else q
    return out


def select(trie: list[Prefix], p_at: Model, q_at: Model) -> Prefix:
    """The greatest of the drafted paths (module docstring), as the walk from the root finds it."""
    chosen: Prefix = ()
    depth = max(len(path) for path in trie)
    for _ in range(depth):
        kids = {path[len(chosen)] for path in trie if path[: len(chosen)] == chosen}
        rank = ranks(p_at(chosen), q_at(chosen))
        chosen = (*chosen, max(kids, key=lambda v: rank[v]))
    return chosen


def skewed_rows(chosen: Prefix, p_at: Model, q_at: Model, paths: int) -> F64:
    """``q^Γ`` at every prefix of the selected path: ``[L, V]``."""
    above, mass, rows = 0.0, 1.0, []
    for d, token in enumerate(chosen):
        p, q = p_at(chosen[:d]), q_at(chosen[:d])
        rows.append(skew(p, q, above, mass, paths))
        order = np.argsort(order_key(p, q), kind="stable")
        below = float(q[order[: int(np.flatnonzero(order == token)[0])]].sum())
        above, mass = above + mass * below, mass * float(q[token])
    return np.stack(rows)


def emitted_law(
    target: Model, draft: Model, paths: int, length: int, rule: str = "gbv", context: Prefix = ()
) -> SeqDist:
    """Exact law of the tokens one GBV step emits (accepted prefix of the selected path + the final
    token), over every ``paths``-tuple of i.i.d. draft paths of ``length`` tokens."""
    if rule not in RULES or paths < 1 or length < 1:
        raise ValueError(
            f"rule must be one of {RULES}, paths and length >= 1; got {rule!r}, {paths}, {length}"
        )
    vocab = len(draft(context))

    def p_at(prefix: Prefix) -> F64:
        return target(context + prefix)

    def q_at(prefix: Prefix) -> F64:
        return draft(context + prefix)

    singles: list[tuple[Prefix, float]] = []
    for path in itertools.product(range(vocab), repeat=length):
        mass = float(np.prod([q_at(path[:d])[t] for d, t in enumerate(path)]))
        if mass > 0:
            singles.append((path, mass))
    out: SeqDist = {}
    for combo in itertools.product(singles, repeat=paths):
        mass = float(np.prod([m for _, m in combo]))
        for seq, weight in trie_law([path for path, _ in combo], p_at, q_at, paths, rule).items():
            out[seq] = out.get(seq, 0.0) + mass * weight
    return out


def trie_law(drafted: list[Prefix], p_at: Model, q_at: Model, paths: int, rule: str = "gbv") -> SeqDist:
    """Exact law of what the rule emits for these drafted paths (the uniforms' randomness only)."""
    chosen = select(drafted, p_at, q_at)
    rows = skewed_rows(chosen, p_at, q_at, paths if rule == "gbv" else 1)  # [L, V]
    p = np.stack([p_at(chosen[:d]) for d in range(len(chosen) + 1)])  # [L + 1, V]
    law = block_outcome(p, rows, chosen)
    out: SeqDist = {}
    for tau in range(len(chosen) + 1):
        weight = float(law.accept_probs[tau])
        for token in np.flatnonzero(law.final_dists[tau]) if weight > 0 else ():
            seq = (*chosen[:tau], int(token))
            out[seq] = out.get(seq, 0.0) + weight * float(law.final_dists[tau][token])
    return out


def selected_law(draft: Model, target: Model, paths: int, length: int) -> dict[Prefix, float]:
    """The law of the selected path, by enumeration of the ``paths``-tuples (``q^Γ``'s definition)."""
    vocab = len(draft(()))
    singles = [
        (path, float(np.prod([draft(path[:d])[t] for d, t in enumerate(path)])))
        for path in itertools.product(range(vocab), repeat=length)
    ]
    out: dict[Prefix, float] = {}
    for combo in itertools.product(singles, repeat=paths):
        mass = float(np.prod([m for _, m in combo]))
        if mass > 0:
            chosen = select([path for path, _ in combo], target, draft)
            out[chosen] = out.get(chosen, 0.0) + mass
    return out


__all__ = [
    "LOSSLESS_RULES",
    "RULES",
    "emitted_law",
    "order_key",
    "ranks",
    "select",
    "selected_law",
    "skew",
    "skewed_rows",
    "trie_law",
]
