"""The rejection sampler of a captured decode step, itself captured: replayed right after the forward's
graph, so a step's verification costs the device's work and one replay instead of the host's launches of
some thirty to fifty small ops (``RejectionSampler._verify_batch``), with nothing read back in between.

A ``CapturedVerify`` belongs to one ``CapturedDecode`` (``q`` tokens per request: the verify step's K+1,
or plain decoding's 1). Its graphs take, per query token (the graph runner's leading dimension), the
forward's logits row, the query token as fed (its last token, then its drafts, ``PLACEHOLDER_TOKEN_ID``
where it has none) and its request's temperature, seed and RNG counter (repeated over the request's
rows); they return, per token, the token the step emits at that slot and the request's verified draft
count: ``[N, 2]`` int64, whose one copy to the host is the step's one read.

The sampler branches on host facts about the batch (``SamplingFlags``), which a graph freezes, so there
is one graph set per *kind*: ``greedy`` (every request greedy) and ``sampled`` (any temperature, no
top-k or top-p: the mixed batch's path, which equals the all-sampled one's output). A step outside both
(top-k / top-p, draft probabilities, logits processors, structured outputs) verifies eagerly after the
forward's replay, as before (``EngineCore.verify_kind``). The computation is the eager sampler's,
ops and random numbers alike (counter-based, keyed by seed and position), so the tokens are the same.

Glossary: *kind* — which of the sampler's host-side branches a graph set was captured with; *layout* —
the verification metadata of ``B`` requests with ``q - 1`` drafts each (``SpecDecodeMetadata``), built
before capture for every captured size (inside a capture its host-to-device copies would be frozen).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from spec_backend.graphs import GraphCaptureError
from spec_backend.sampling.metadata import SpecDecodeMetadata
from spec_backend.sampling.sampling_metadata import SamplingFlags, SamplingMetadata
from spec_backend.step import valid_drafts

if TYPE_CHECKING:
    from spec_backend.backends.base import Backend, GraphFn, GraphRunner
    from spec_backend.sampling.sampler import RejectionSampler

logger = logging.getLogger("spec_backend.engine")

#: the sampler's host-side branch of each kind (``SamplingFlags``): frozen into its graphs
KIND_FLAGS = {
    "greedy": SamplingFlags(True, False, False, False, True, None),
    "sampled": SamplingFlags(False, False, False, False, True, None),
}


def verify_kind(sampling: SamplingMetadata) -> str | None:
    """The graph kind that verifies a batch sampled so (if it was captured: ``CapturedVerify.runners``);
    ``None``: none (top-k or top-p)."""
    if sampling.apply_top_k or sampling.apply_top_p:
        return None
    return "greedy" if sampling.all_greedy else "sampled"


def verify_kind_of(flags: SamplingFlags) -> str | None:
    """``verify_kind`` from a batch's host flags (``SamplingState.flags``), nothing built on the device."""
    if flags.apply_top_k or flags.apply_top_p:
        return None
    return "greedy" if flags.all_greedy else "sampled"


@dataclass(frozen=True)
class _Layout:
    """``B`` requests with ``q - 1`` drafts each: the verification metadata (``SpecDecodeMetadata``'s
    standard layout, its draft ids replaced each step) and the sampling parameters every request here has
    (no top-k, no top-p)."""

    metadata: SpecDecodeMetadata
    top_k: torch.Tensor  # [B] int64 zeros
    top_p: torch.Tensor  # [B] float32 ones

    @classmethod
    def of(cls, batch: int, k: int, device: torch.device) -> _Layout:
        ids = torch.zeros(batch * k, dtype=torch.int32, device=device)  # [T] replaced each step
        return cls(
            SpecDecodeMetadata.from_layout(ids, [k] * batch, None),
            torch.zeros(batch, dtype=torch.int64, device=device),
            torch.ones(batch, dtype=torch.float32, device=device),
        )


class CapturedVerify:
    """The sampler's graphs for steps of ``q`` tokens per request (see the module docstring)."""

    def __init__(
        self,
        sampler: RejectionSampler,
        backend: Backend,
        q: int,
        capture_sizes: tuple[int, ...],
        vocab: int,
        device: torch.device,
        logits: torch.Tensor | None = None,
    ) -> None:
        if q < 1 or any(size % q for size in capture_sizes):
            raise ValueError(f"capture sizes {list(capture_sizes)} must be multiples of q={q} >= 1")
        self.sampler, self.q, self.k = sampler, q, q - 1
        self.device = device
        self._layouts = {size // q: _Layout.of(size // q, self.k, device) for size in capture_sizes}
        largest = capture_sizes[-1]
        #: [rows >= largest, V] float32: every kind's static logits, shared (``GraphRunner.capture``), and
        #: may be another ``CapturedVerify``'s: a step writes its logits here once, whichever set replays
        self.logits = _logits_buffer(logits, largest, vocab, device)
        example = {
            "logits": self.logits[:largest],  # [N, V]
            "tokens": torch.zeros(largest, dtype=torch.int64, device=device),  # [N]
            "temperature": torch.zeros(largest, dtype=torch.float32, device=device),  # [N]
            "seeds": torch.zeros(largest, dtype=torch.int64, device=device),  # [N]
            "positions": torch.zeros(largest, dtype=torch.int64, device=device),  # [N]
        }
        self.runners: dict[str, GraphRunner] = {}  # the kinds captured (a backend short of graphs: fewer)
        for kind in KIND_FLAGS:
            budget = sampler.group_elements  # a sampled batch past it is verified in groups, on the host
            if kind == "sampled" and budget is not None and largest * vocab > budget:
                logger.info("sampled steps verify eagerly: %d x %d logits exceed the sampler's groups of "
                            "%d elements", largest, vocab, budget)  # fmt: skip
                continue
            if backend.capture_policy().graph_budget == 0:
                logger.warning("the %s backend has no graphs left: %s steps verify eagerly", backend.name,
                               kind)  # fmt: skip
                break
            self.runners[kind] = backend.graph_runner(self._callable(kind), capture_sizes)
            self.runners[kind].capture(example, shared=("logits",))
        logger.info("captured the %d-token-per-request step's sampler (%s) for %s tokens", q,
                    ", ".join(self.runners), list(capture_sizes))  # fmt: skip

    def _callable(self, kind: str) -> GraphFn:
        def verify(
            logits: torch.Tensor,  # [N, V]
            tokens: torch.Tensor,  # [N] int64: each request's last token, then its drafts (-1: none)
            temperature: torch.Tensor,  # [N] float32, each request's repeated over its rows
            seeds: torch.Tensor,  # [N] int64
            positions: torch.Tensor,  # [N] int64: the request's first draft position (its RNG counter)
        ) -> torch.Tensor:  # [N, 2] int64
            return self._verify(KIND_FLAGS[kind], logits, tokens, temperature, seeds, positions)

        return verify

    def _verify(
        self,
        flags: SamplingFlags,
        logits: torch.Tensor,  # [N, V]
        tokens: torch.Tensor,  # [N]
        temperature: torch.Tensor,  # [N]
        seeds: torch.Tensor,  # [N]
        positions: torch.Tensor,  # [N]
    ) -> torch.Tensor:  # [N, 2] int64: the emitted token per slot, the request's verified drafts
        q, k = self.q, self.k
        batch = tokens.shape[0] // q
        layout = self._layouts.get(batch) or _Layout.of(batch, k, tokens.device)  # eager above the largest
        grid = tokens.view(batch, q)  # [B, q]
        # the indices as they are (``replace`` rebuilds nothing that is given: no host copy in the graph)
        metadata = replace(layout.metadata, draft_token_ids=grid[:, 1:].reshape(-1).to(torch.int32))
        sampling = SamplingMetadata.prevalidated(
            temperature[::q], layout.top_k, layout.top_p, seeds[::q], positions[::q], flags
        )
        out = self.sampler(metadata, None, logits, sampling)  # [B, q] int32
        valid = valid_drafts(grid)  # [B]
        return torch.stack([out.to(torch.int64).reshape(-1), valid.repeat_interleave(q)], dim=1)

    @torch.no_grad()
    def launch(
        self,
        kind: str,
        logits: torch.Tensor,  # [N, V] the verify forward's
        tokens: torch.Tensor,  # [B, q] int64 query tokens as fed, placeholders where drafts are missing
        sampling: SamplingMetadata,  # [B] the requests' (``SamplingState.metadata``)
    ) -> torch.Tensor:  # [B, q + 1] int64
        """Each request's emitted tokens (accepted drafts, then the recovered or bonus token) and verified
        draft count from one replay, left on the device and packed as ``Verifier.launch`` packs them:
        per request its emitted tokens (placeholders after them), then the count. A new tensor: the next
        replay does not overwrite it."""
        if sampling.positions is None or sampling.seeds is None:
            raise ValueError("a captured verification needs each request's seed and RNG counter")
        q, n = self.q, logits.shape[0]
        if n <= self.runners[kind].capture_sizes[-1]:  # replayed: the one copy into the shared buffer
            staged = self.logits[:n]  # [N, V] float32
            staged.copy_(logits)
        else:  # eager above the largest size, on the caller's tensors
            staged = logits.float()
        inputs = {
            "logits": staged,
            "tokens": tokens.reshape(-1),
            "temperature": _per_token(sampling.temperature.float(), q),
            "seeds": _per_token(sampling.seeds, q),
            "positions": _per_token(sampling.positions.to(torch.int64), q),
        }
        out = self.runners[kind].run(inputs)
        assert isinstance(out, torch.Tensor)
        grid = out.view(-1, q, 2)  # [B, q, 2]: each row's token, the request's verified drafts
        return torch.cat([grid[:, :, 0], grid[:, :1, 1]], dim=1)  # [B, q + 1]


def _per_token(values: torch.Tensor, q: int) -> torch.Tensor:  # [B] -> [B * q]
    """Each request's value repeated over its ``q`` rows (no op for one row)."""
    return values if q == 1 else values.repeat_interleave(q)


def _logits_buffer(
    given: torch.Tensor | None, largest: int, vocab: int, device: torch.device
) -> torch.Tensor:  # [rows, V] float32
    """The static logits of a ``CapturedVerify``: ``given`` (another's, checked to hold ``largest`` rows
    of ``vocab`` float32 logits on ``device``) or a new one of ``largest`` rows."""
    if given is None:
        return torch.zeros((largest, vocab), dtype=torch.float32, device=device)
    shape_ok = given.dim() == 2 and given.shape[0] >= largest and given.shape[1] == vocab
    if given.dtype != torch.float32 or not shape_ok:
        raise ValueError(
            f"the shared logits buffer must be float32 [>= {largest}, {vocab}], got {given.dtype} "
            f"{list(given.shape)}"
        )
    if not _same_device(given.device, device):
        raise ValueError(f"the shared logits buffer is on {given.device}, the sampler's graphs on {device}")
    return given


def _same_device(tensor_device: torch.device, device: torch.device) -> bool:
    """Whether a tensor's device is ``device``, either naming no index (``Backend.device()`` gives
    ``cuda`` where a tensor made there reports ``cuda:0``, and a CPU tensor made on ``cpu:0`` reports
    ``cpu``: each pair compares unequal in torch)."""
    indices = (tensor_device.index, device.index)
    return tensor_device.type == device.type and (None in indices or indices[0] == indices[1])


def capture_verify(
    sampler: RejectionSampler,
    backend: Backend,
    q: int,
    capture_sizes: tuple[int, ...],
    vocab: int,
    logits: torch.Tensor | None = None,
) -> CapturedVerify | None:
    """A ``CapturedVerify`` beside a captured forward of ``q`` tokens per request, unless the backend does
    not capture its sampler (``Backend.captures_sampler``) or has no graphs left (its steps then verify
    eagerly after the forward's replay). ``logits``: another ``CapturedVerify``'s static logits to share
    (its ``logits``; one step replays one set, so one buffer serves every set). A capture that fails is a
    ``GraphCaptureError`` naming ``enforce_eager=True``, as the forward's."""
    if not backend.captures_sampler:
        return None
    if backend.capture_policy().graph_budget == 0:
        logger.warning("the %s backend has no graphs left: the sampler is not captured", backend.name)
        return None
    try:
        captured = CapturedVerify(sampler, backend, q, capture_sizes, vocab, backend.device(), logits)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        raise GraphCaptureError(
            f"capturing the rejection sampler ({sampler.mode_name}) as graphs on the {backend.name} backend "
            f"failed ({type(exc).__name__}: {exc}); pass enforce_eager=True to run it without graphs"
        ) from exc
    return captured if captured.runners else None  # no kind captured: its buffer is not kept


__all__ = ["KIND_FLAGS", "CapturedVerify", "capture_verify", "verify_kind"]
