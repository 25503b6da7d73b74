"""Float64 law of token-tree verification (#42): recursive rejection sampling over siblings, exactly.

Glossary:

* *tree* — draft nodes below the root (the last committed token); ``parents[i]`` is node ``i``'s parent
  (``-1``: the root), always an earlier node; a node's *siblings* are ordered by index. The path to a
  node is the context its token was drafted in and the context the target scores its children in.
* *sibling scheme* — how a node's children were drafted from the draft distribution ``q(path)``:

  - ``iid``: each child drawn from ``q`` independently;
  - ``without_replacement``: each child drawn from ``q`` without the tokens of its earlier siblings
    (renormalised);
  - ``point``: deterministic children, the ``m`` most likely tokens of ``q`` in order (EAGLE-2's top-k,
    static trees); each is a point mass.

  ``sibling_q`` gives the distribution child ``i`` was drawn from *given* its earlier siblings.
* *recursive rejection sampling* (``rrs``, lossless for every scheme): at a node, with the target's
  distribution ``r = p(path)``, its children are tried in order: child ``x`` drawn from ``q_i`` is accepted
  with probability ``min(1, r(x) / q_i(x))`` and verification moves into it; on rejection
  ``r <- norm(max(r - q_i, 0))`` and the next sibling is tried. When every child is rejected a token is
  drawn from ``r``; at a leaf, from the target's distribution there (the bonus token). Each try is one
  speculative-sampling step against ``r`` with a draft that is ``q_i``-distributed given everything before
  it, so the emitted token is ``r``-distributed and, by induction, the stream keeps the target's law.

``point_mass`` judges every child as a point mass whatever drew it (accept ``x`` with probability
``r(x)``, else remove ``x`` from ``r``): also lossless — given its token, a child is a point-mass draft —
but it accepts less than ``rrs`` when the children were sampled. Negative controls (lossy rules, which the
tests must tell apart): ``naive_iid`` (every sibling judged against ``q`` itself, as if drawn i.i.d.) and
``no_residual`` (``r`` left unchanged after a rejection).

``emitted_law`` enumerates every tree the scheme can draft (with its probability) and every verification
outcome; ``exact.continued`` / ``exact.target_joint`` then compare it with the target's law.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from spec_backend.testing.exact import Prefix, SeqDist
from spec_backend.testing.spec import F64
from spec_backend.verify_rules import TREE_REGISTRY

SCHEMES = ("iid", "without_replacement", "point")
#: the registry's rules over sibling trees (``verify_rules.TREE_REGISTRY``; its multi-path rules are
#: ``testing.gbv_spec``'s), and greedy (the argmax path)
RULES = (*(rule.name for rule in TREE_REGISTRY if not rule.paths), "greedy")
LOSSLESS_RULES = tuple(rule.name for rule in TREE_REGISTRY if rule.lossless and not rule.paths)

Model = Callable[[Prefix], F64]  # a context -> its next-token distribution [V]


@dataclass(frozen=True)
class TreeShape:
    """The nodes' parents (``-1``: the root); each parent precedes its children."""

    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        bad = [i for i, p in enumerate(self.parents) if not -1 <= p < i]
        if bad:
            raise ValueError(f"tree parents {self.parents}: node(s) {bad} must have a parent in -1..i-1")

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    @property
    def depth(self) -> int:
        depths: list[int] = []
        for p in self.parents:
            depths.append(1 if p < 0 else depths[p] + 1)
        return max(depths, default=0)

    def path(self, tokens: tuple[int, ...], node: int) -> Prefix:
        """The tokens from the root's first child down to ``node`` (empty for the root)."""
        out: list[int] = []
        while node >= 0:
            out.append(tokens[node])
            node = self.parents[node]
        return tuple(reversed(out))


def sibling_q(q: F64, earlier: list[int], scheme: str) -> F64:
    """The distribution a child was drawn from given its ``earlier`` siblings' tokens."""
    if scheme == "iid":
        return q
    if scheme == "point":
        raise ValueError("point-mass siblings have no draft distribution: each is a point mass")
    rest = q.copy()
    rest[earlier] = 0.0
    total = float(rest.sum())
    return rest / total if total > 0 else rest


def drafted_trees(
    shape: TreeShape, draft: Model, scheme: str, context: Prefix = ()
) -> Iterator[tuple[tuple[int, ...], float]]:
    """Every token assignment the scheme drafts for ``shape``, with its probability."""
    if scheme == "point":
        chosen = [0] * len(shape.parents)
        for node in (-1, *range(len(shape.parents))):
            kids = shape.children(node)
            order = np.argsort(-draft(context + shape.path(tuple(chosen), node)), kind="stable")
            for rank, child in enumerate(kids):
                chosen[child] = int(order[rank])
        yield tuple(chosen), 1.0
        return
    vocab = len(draft(context))
    tokens: tuple[int, ...]
    for tokens in itertools.product(range(vocab), repeat=len(shape.parents)):
        mass = 1.0
        for node, token in enumerate(tokens):
            parent = shape.parents[node]
            earlier = [tokens[s] for s in shape.children(parent) if s < node]
            mass *= float(sibling_q(draft(context + shape.path(tokens, parent)), earlier, scheme)[token])
            if mass == 0.0:
                break
        if mass > 0.0:
            yield tokens, mass


def _judged_q(q: F64, earlier: list[int], token: int, scheme: str, rule: str) -> F64:
    """The distribution ``rule`` believes a child was drawn from."""
    if scheme == "point" or rule == "point_mass":
        point: F64 = np.eye(len(q))[token]
        return point
    if rule == "naive_iid":
        return q
    return sibling_q(q, earlier, scheme)


def _residual(r: F64, qi: F64) -> F64:
    rest = np.maximum(r - qi, 0.0)
    total = float(rest.sum())
    return rest / total if total > 0 else r


@dataclass(frozen=True)
class _Tree:
    shape: TreeShape
    tokens: tuple[int, ...]
    context: Prefix
    target: Model
    draft: Model
    scheme: str
    rule: str


def _verify(t: _Tree, node: int, emitted: Prefix, mass: float, out: SeqDist) -> None:
    """Add to ``out`` the law of what verification emits from ``node`` on (``emitted`` so far)."""
    r = t.target(t.context + emitted)
    kids = t.shape.children(node)
    if t.rule == "greedy":
        best = int(np.argmax(r))
        match = [c for c in kids if t.tokens[c] == best]
        if match:
            _verify(t, match[0], (*emitted, best), mass, out)
        else:
            out[(*emitted, best)] = out.get((*emitted, best), 0.0) + mass
        return
    q = t.draft(t.context + emitted)
    for i, child in enumerate(kids):
        token = t.tokens[child]
        qi = _judged_q(q, [t.tokens[s] for s in kids[:i]], token, t.scheme, t.rule)
        accept = min(1.0, float(r[token]) / float(qi[token])) if qi[token] > 0 else 0.0
        if accept > 0.0:
            _verify(t, child, (*emitted, token), mass * accept, out)
        mass *= 1.0 - accept
        if mass == 0.0:
            return
        r = r if t.rule == "no_residual" else _residual(r, qi)
    for final in np.flatnonzero(r):
        seq = (*emitted, int(final))
        out[seq] = out.get(seq, 0.0) + mass * float(r[final])


def emitted_law(
    shape: TreeShape, target: Model, draft: Model, scheme: str, rule: str, context: Prefix = ()
) -> SeqDist:
    """Exact law of the tokens one tree step emits (accepted path + the final token), over every drafted
    tree (module docstring)."""
    if scheme not in SCHEMES or rule not in RULES:
        raise ValueError(f"scheme must be one of {SCHEMES} and rule one of {RULES}, got {scheme!r}, {rule!r}")
    out: SeqDist = {}
    for tokens, mass in drafted_trees(shape, draft, scheme, context):
        _verify(_Tree(shape, tokens, context, target, draft, scheme, rule), -1, (), mass, out)
    return out


def expected_emitted(law: SeqDist) -> float:
    """Tokens a step emits on average (accepted drafts + 1)."""
    return sum(mass * len(seq) for seq, mass in law.items())


__all__ = [
    "LOSSLESS_RULES",
    "RULES",
    "SCHEMES",
    "TreeShape",
    "drafted_trees",
    "emitted_law",
    "expected_emitted",
    "sibling_q",
]
