"""Exact (float64) output laws of one speculative step on small vocabularies, with toy autoregressive models.

What "lossless" means for a variable-length step: the step emits ``y = (x_1..x_τ, z)`` (1 to K+1 tokens).
Continue ``y`` autoregressively with the TARGET until it has ``L`` tokens; the step is lossless iff this
continued stream has the target's joint law ``p(z_1..z_L)`` for every ``L``. Later speculative steps are
themselves lossless continuations, so by induction the whole generated stream is target-distributed.
Marginalisation cannot increase total variation, so ``L = K+1`` is the strongest single check (every
emitted token is covered); ``L = 1`` (the first emitted token) is the headline number.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from spec_backend.testing.spec import F64, RuleParams, block_step

Prefix = tuple[int, ...]
SeqDist = dict[Prefix, float]


class ToyModel:
    """A context-dependent toy LM: ``model(prefix) -> probs [V]`` (float64, memoised, deterministic).

    ``kind="random"``: softmax of N(0, scale²) logits drawn from a generator keyed by (seed, prefix);
    ``zero_frac`` of the tokens (never all) get probability exactly 0. ``kind="iid"``: the fixed ``probs``
    in every context. ``kind="mixture"``: ``(1 − weight)·base(prefix) + weight·other(prefix)``.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        seed: int = 0,
        scale: float = 1.5,
        zero_frac: float = 0.0,
        probs: list[float] | None = None,
        base: ToyModel | None = None,
        other: ToyModel | None = None,
        weight: float = 0.0,
        top_k: int = 0,
    ) -> None:
        self.vocab_size = vocab_size
        self.seed, self.scale, self.zero_frac = seed, scale, zero_frac
        self.fixed = None if probs is None else np.asarray(probs, dtype=np.float64) / float(sum(probs))
        self.base, self.other, self.weight, self.top_k = base, other, weight, top_k
        self._cache: dict[Prefix, F64] = {}

    def __call__(self, prefix: Prefix) -> F64:
        cached = self._cache.get(prefix)
        if cached is None:
            cached = self._make(prefix)
            self._cache[prefix] = cached
        return cached

    def _make(self, prefix: Prefix) -> F64:
        if self.fixed is not None:
            return self.fixed
        if self.base is not None and self.top_k > 0:
            probs = self.base(prefix).copy()
            probs[np.argsort(-probs, kind="stable")[self.top_k :]] = 0.0
            return np.asarray(probs / probs.sum(), dtype=np.float64)
        if self.base is not None and self.other is not None:
            return (1.0 - self.weight) * self.base(prefix) + self.weight * self.other(prefix)
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        logits = rng.normal(0.0, self.scale, self.vocab_size)
        probs = np.exp(logits - logits.max())
        zero = rng.random(self.vocab_size) < self.zero_frac
        zero[int(np.argmax(probs))] = False
        probs[zero] = 0.0
        return np.asarray(probs / probs.sum(), dtype=np.float64)


def greedy_of(model: ToyModel) -> Callable[[Prefix], int]:
    """A deterministic (point-mass) drafter: the argmax of ``model`` in each context."""
    return lambda prefix: int(np.argmax(model(prefix)))


@dataclass
class Case:
    """One verification scenario. ``draft`` samples from a toy model, or is a point mass (``greedy``).

    A point-mass case is run with ``draft_probs=None`` unless ``onehot_probs=True``, which passes the point
    masses explicitly as one-hot ``draft_probs`` (both must behave identically).

    Sampling parameters: the sampler receives logits ``temperature·log raw(prefix)`` with the request's
    ``temperature`` and ``top_k``, so its processed target is ``top_k(raw)`` = ``target``; entropy verify
    measures the entropy of the raw logits, ``softmax(temperature·log raw)``. Without ``raw`` the logits
    are ``log target`` at temperature 1.
    """

    name: str
    target: ToyModel
    k: int
    draft: ToyModel | None = None
    greedy: Callable[[Prefix], int] | None = None
    onehot_probs: bool = False
    params: RuleParams = field(default_factory=RuleParams)
    raw: ToyModel | None = None
    temperature: float = 1.0
    top_k: int = 0

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def point_mass(self) -> bool:
        return self.greedy is not None

    def draft_dist(self, prefix: Prefix) -> F64:
        """q(· | prefix) [V]."""
        if self.greedy is not None:
            onehot = np.zeros(self.vocab_size, dtype=np.float64)
            onehot[self.greedy(prefix)] = 1.0
            return onehot
        assert self.draft is not None
        return self.draft(prefix)

    def blocks(self) -> Iterator[tuple[Prefix, float]]:
        """Every draft block ``x_1..x_K`` with its probability Q(x) > 0 under the drafter."""
        for drafts in itertools.product(range(self.vocab_size), repeat=self.k):
            prob = 1.0
            for i, x in enumerate(drafts):
                prob *= float(self.draft_dist(drafts[:i])[x])
                if prob == 0.0:
                    break
            if prob > 0.0:
                yield drafts, prob

    def logits(self, prefix: Prefix) -> F64:
        """The logits row the sampler receives for ``prefix`` [V] (−inf where the raw law is 0)."""
        source = self.target if self.raw is None else self.raw
        with np.errstate(divide="ignore"):
            return np.asarray(self.temperature * np.log(source(prefix)), dtype=np.float64)

    def entropy_dist(self, prefix: Prefix) -> F64:
        """softmax(logits): the law whose entropy sets entropy verify's threshold [V]."""
        row = self.logits(prefix)
        row = np.exp(row - row.max())
        return np.asarray(row / row.sum(), dtype=np.float64)

    def rows(self, drafts: Prefix) -> tuple[F64, F64]:
        """Target rows p [K+1, V] and draft rows q [K, V] for one draft block."""
        p = np.stack([self.target(drafts[:i]) for i in range(self.k + 1)])
        q = np.stack([self.draft_dist(drafts[:i]) for i in range(self.k)]) if self.k else np.zeros((0, 1))
        return p, q


def emitted_distribution(case: Case, rule: str) -> SeqDist:
    """Exact law of the tokens one step emits (accepted drafts + recovered/bonus), over all draft blocks."""
    out: SeqDist = {}
    for drafts, q_prob in case.blocks():
        p, q = case.rows(drafts)
        ent = None
        if rule.endswith("entropy") and case.k:
            ent = np.stack([case.entropy_dist(drafts[:i]) for i in range(case.k)])  # [K, V]
        law = block_step(rule, p, q, drafts, case.params, entropy_p=ent)
        for tau in range(case.k + 1):
            mass = q_prob * float(law.accept_probs[tau])
            if mass == 0.0:
                continue
            for token in np.flatnonzero(law.final_dists[tau]):
                seq = (*drafts[:tau], int(token))
                out[seq] = out.get(seq, 0.0) + mass * float(law.final_dists[tau][token])
    return out


def continued(dist: SeqDist, target: ToyModel, length: int) -> SeqDist:
    """Continue every emitted sequence with the target up to ``length`` tokens, then cut to ``length``."""
    out: SeqDist = {}
    stack = list(dist.items())
    while stack:
        seq, mass = stack.pop()
        if len(seq) >= length:
            out[seq[:length]] = out.get(seq[:length], 0.0) + mass
            continue
        for token, prob in enumerate(target(seq)):
            if prob > 0.0:
                stack.append(((*seq, token), mass * float(prob)))
    return out


def target_joint(target: ToyModel, length: int) -> SeqDist:
    """The target's joint law of its first ``length`` tokens."""
    return continued({(): 1.0}, target, length)


def total_variation(a: SeqDist, b: SeqDist) -> float:
    """½ Σ |a − b| over the union of supports."""
    return 0.5 * sum(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b))


def deviation(case: Case, rule: str, length: int | None = None) -> float:
    """TV between the continued emitted stream and the target, on the first ``length`` tokens (K+1)."""
    length = case.k + 1 if length is None else length
    emitted = emitted_distribution(case, rule)
    return total_variation(continued(emitted, case.target, length), target_joint(case.target, length))


def expected_accepted(case: Case, rule: str) -> float:
    """E[accepted draft tokens per step]; tokens per step is this + 1."""
    return sum(mass * (len(seq) - 1) for seq, mass in emitted_distribution(case, rule).items())


__all__ = [
    "Case",
    "Prefix",
    "SeqDist",
    "ToyModel",
    "continued",
    "deviation",
    "emitted_distribution",
    "expected_accepted",
    "greedy_of",
    "target_joint",
    "total_variation",
]
