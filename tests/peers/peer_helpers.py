"""Shared by the peer tier (tests/peers): ports of other projects' rejection-sampler tests onto our API.

Concepts the peers have and how they map here:

* **mocked bonus token** (vLLM and vllm-ascend hand the bonus token to the sampler, or mock the sampler
  that draws it): we have no separate bonus sampler; each request's bonus row of the logits is made
  one-hot-like (+100 at the bonus id, -100 elsewhere), so greedy and random sampling both emit that id.
* **target-only logits** (vLLM's tests hold only the T draft rows; the bonus comes from the mock): our
  logits are [T+B, V] with a bonus row after each request's drafts (``with_bonus_rows``).
* **fixed acceptance uniforms** (vLLM's ``_patch_uniform_probs``, vllm-ascend's ``uniform_probs``
  argument): ``FixedUniformBackend``, a reference backend whose sampler ops return the given uniforms
  through the Backend contract (no monkeypatching).
* **target probabilities given directly**: logits = log(p) with -inf where p = 0, at temperature 1.
* **a feature we do not offer**: a strict xfail whose body calls ``missing``, naming what is absent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NoReturn

import torch

from spec_backend.backends.reference import ReferenceBackend
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling.ops import SamplerOps
from spec_backend.sampling.torch_ops import TorchSamplerOps

#: logits of the peers' "argmax" rows (vLLM's create_logits_tensor): the chosen id and every other id
HIGH, LOW = 100.0, -100.0
#: vllm-ascend's ε inside the entropy's logarithm
ENTROPY_EPS = 1e-10


class FixedUniformOps(TorchSamplerOps):
    """The torch sampler ops with the acceptance uniforms replaced by fixed values.

    ``uniforms`` is called once per step: with one entry per draft token (flat draft order) for
    acceptance, or one per request in synthetic mode; the number of values must match, as vLLM's
    patched ``generate_uniform_probs`` asserts.
    """

    name = "torch-fixed-uniforms"

    def __init__(self, values: Sequence[float]) -> None:
        self.values = [float(v) for v in values]

    def uniforms(
        self, seeds: torch.Tensor, positions: torch.Tensor, counters: torch.Tensor, stream: int
    ) -> torch.Tensor:
        if seeds.shape[0] != len(self.values):
            raise AssertionError(f"the sampler asked for {seeds.shape[0]} uniforms, {len(self.values)} given")
        return torch.tensor(self.values, dtype=torch.float64, device=seeds.device)


class FixedUniformBackend(ReferenceBackend):
    """The reference backend, whose acceptance uniforms are ``values``."""

    name = "reference-fixed-uniforms"

    def __init__(self, values: Sequence[float]) -> None:
        super().__init__()
        self.values = list(values)

    def sampler_ops(self) -> SamplerOps:
        ops: SamplerOps = FixedUniformOps(self.values)
        return ops


def missing(what: str) -> NoReturn:
    """Body of a strict xfail port: the peer tests something our API does not have."""
    raise NotImplementedError(what)


def one_hot_logits(token: int, vocab: int) -> torch.Tensor:  # [V]
    """A row whose greedy and sampled token is ``token`` (the others have probability e^-200 = 0)."""
    row = torch.full((vocab,), LOW)
    row[token] = HIGH
    return row


def with_bonus_rows(target_rows: torch.Tensor, counts: Sequence[int], bonus: Sequence[int]) -> torch.Tensor:
    """Our layout [T+B, V] from the peers' draft rows [T, V]: request b's rows, then its bonus row."""
    vocab, out, start = target_rows.shape[1], [], 0
    for k, token in zip(counts, bonus, strict=True):
        out += [target_rows[start : start + k], one_hot_logits(token, vocab)[None, :]]
        start += k
    assert start == target_rows.shape[0], "counts do not cover the target rows"
    return torch.cat(out)


def argmax_logits(
    targets: Sequence[Sequence[int]], vocab: int = 100, override: int | None = None
) -> torch.Tensor:
    """vLLM's ``create_logits_tensor`` on our layout: each request's list is its argmax tokens, the last
    one being the bonus. Draft rows: +100 at the token, -100 elsewhere, and ``override`` set to 99 in
    every draft row (the token picked after a rejection); bonus rows: ``one_hot_logits``."""
    rows = [one_hot_logits(t, vocab) for req in targets for t in req[:-1]]
    drafts = torch.stack(rows) if rows else torch.empty(0, vocab)
    if override is not None:
        drafts[:, override] = 99.0
    return with_bonus_rows(drafts, [len(req) - 1 for req in targets], [req[-1] for req in targets])


def log_probs(probs: torch.Tensor) -> torch.Tensor:
    """Logits whose softmax is ``probs`` (rows summing to 1): log p, with -inf where p = 0."""
    return torch.where(probs > 0, torch.log(probs), torch.full_like(probs, float("-inf")))


def embed(rows: Sequence[Sequence[float]], vocab: int) -> torch.Tensor:  # [R, vocab]
    """Probability rows of a small peer vocabulary, padded with zero-probability ids up to ``vocab``."""
    out = torch.zeros(len(rows), vocab, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def verify(
    sampler: RejectionSampler,
    drafts: Sequence[Sequence[int]],
    logits: torch.Tensor,
    temperature: Sequence[float],
    draft_probs: torch.Tensor | None = None,
    *,
    top_k: Sequence[int] | None = None,
    top_p: Sequence[float] | None = None,
    seeds: Sequence[int | None] | None = None,
) -> torch.Tensor:  # [B, max_K + 1] int32
    """One sampler call on per-request draft lists (temperature 0 = greedy; a seed None = unseeded)."""
    metadata = SpecDecodeMetadata.from_draft_tokens([list(d) for d in drafts])
    sampling = SamplingMetadata.from_lists(list(temperature), top_k=top_k, top_p=top_p, seeds=seeds)
    return sampler(metadata, draft_probs, logits, sampling)


def peer_entropy(probs: Sequence[float]) -> float:
    """vllm-ascend's entropy of a row as its kernels compute it: -Σ p·ln(p + 1e-10), row taken as given."""
    return -sum(p * math.log(p + ENTROPY_EPS) for p in probs)


def bisect(f: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (to float64 precision)."""
    if not f(lo) <= target <= f(hi):
        raise ValueError(f"target {target} outside [{f(lo)}, {f(hi)}]")
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2


__all__ = [
    "HIGH",
    "LOW",
    "FixedUniformBackend",
    "FixedUniformOps",
    "argmax_logits",
    "bisect",
    "embed",
    "log_probs",
    "missing",
    "one_hot_logits",
    "peer_entropy",
    "verify",
    "with_bonus_rows",
]
