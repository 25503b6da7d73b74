"""Start-up assembly of the engine: drafter from the method registry, preallocated caches, slot table.

Order: the target is loaded; the drafter is built (draft weights load here); the KV budget is split
into slots over the target's and the drafter's caches (``plan_num_slots``: ``max_num_seqs``, or fewer
when ``kv_cache_memory_bytes`` is set; one full-length request must fit or start-up fails naming the
numbers); every cache is allocated once; the slot table ties them together.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from spec_backend.backends.base import Backend, ModelOptions
from spec_backend.config import SpeculativeConfig
from spec_backend.config.token_tree import branching_tree
from spec_backend.engine.adaptive import AdaptiveDraftLength
from spec_backend.engine.args import check_quantization
from spec_backend.engine.confidence import ConfidenceVerification, build_confidence_verification
from spec_backend.engine.tree_step import TREE_METHODS, DraftPaths, DynamicTree, Plan
from spec_backend.methods import METHODS
from spec_backend.proposers.contract import Drafter, DrafterContext
from spec_backend.proposers.registry import build_drafter, implemented_methods, method_spec
from spec_backend.runtime.captured import maybe_capture
from spec_backend.runtime.captured_verify import capture_verify
from spec_backend.runtime.kv_cache import RaggedKVCache, kv_layout, plan_num_slots
from spec_backend.runtime.loader import load_model
from spec_backend.runtime.runner import ModelRunner
from spec_backend.runtime.slots import SlotTable
from spec_backend.runtime.sources import resolve_model
from spec_backend.step import HiddenStateRequest

if TYPE_CHECKING:
    from spec_backend.engine.core import EngineCore

QUANTIZABLE_FAMILIES = ("draft_model", "eagle")  # whose draft weights go through ``draft_preparation``


def check_embedded_method(config: SpeculativeConfig, kv_transfer_config: dict[str, Any] | None) -> None:
    """Refuse methods the embedded engine has no drafter for, and a connector without its method."""
    spec = method_spec(config.method)
    if not spec.implemented:
        raise ValueError(
            f"speculative method {config.method!r} is not supported by the embedded engine yet; "
            f"use one of {list(implemented_methods())}"
        )
    if config.quantization is not None and spec.family not in QUANTIZABLE_FAMILIES:
        methods = [name for name, m in METHODS.items() if m.implemented and m.family in QUANTIZABLE_FAMILIES]
        raise ValueError(
            f"speculative_config['quantization']={config.quantization!r} applies to the draft weights of "
            f"{', '.join(methods)} on the embedded engine; "
            f"method={config.method!r} runs its draft weights unquantized (leave quantization unset)"
        )
    if kv_transfer_config is not None and spec.family != "record":
        raise ValueError(
            "kv_transfer_config is used only with method='extract_hidden_states', "
            f"got method={config.method!r}"
        )
    _check_chain(config)


def _check_chain(config: SpeculativeConfig) -> None:
    """A ``speculative_token_tree`` is the chain of ``num_speculative_tokens`` tokens, or a tree that
    branches, as deep as ``num_speculative_tokens``, for a method that drafts trees
    (``engine.tree_step.TREE_METHODS``); anything else is refused, never run as something else."""
    tree, k = config.token_tree, config.num_speculative_tokens
    if config.tree_paths is not None and "paths" not in TREE_METHODS.get(config.method or "", ()):
        drafters = [m for m, kinds in TREE_METHODS.items() if "paths" in kinds]
        raise ValueError(
            f"tree_paths={config.tree_paths} draws i.i.d. paths from a drafter's own distributions after "
            f"each token: method in {drafters}, got method={config.method!r}"
        )
    if config.tree_top_k is not None and "dynamic" not in TREE_METHODS.get(config.method or "", ()):
        growers = [m for m, kinds in TREE_METHODS.items() if "dynamic" in kinds]
        raise ValueError(
            f"tree_top_k/tree_nodes grow a dynamic token tree from a head's own draft distributions after "
            f"each node: method in {growers}, got method={config.method!r}"
        )
    if tree is None or k is None or tree == [(0,) * (i + 1) for i in range(k)]:
        return
    depth = max(len(node) for node in tree)
    if branching_tree(tree) is not None and depth == k and config.method in TREE_METHODS:
        return
    raise ValueError(
        f"speculative_token_tree={config.speculative_token_tree!r}: the embedded engine drafts a chain of "
        f"num_speculative_tokens={k} tokens, [(0,), (0, 0), ...], or, with method in {list(TREE_METHODS)}, "
        f"a tree that branches and is num_speculative_tokens deep (this one is {depth} deep; "
        f"method={config.method!r})"
    )


def draft_preparation(backend: Backend, quantization: str | None) -> Callable[[torch.nn.Module], None]:
    """The backend's preparation of loaded draft weights (``Backend.prepare_model``: kernel choices), with
    the weight-only mode ``speculative_config['quantization']`` names. Draft weights only propose tokens
    that the target verifies: quantizing them can change acceptance, never the output."""
    check_quantization(
        quantization, backend.name, backend.supported_quantizations, "speculative_config['quantization']"
    )

    options = ModelOptions(quantization=quantization)

    def prepare(module: torch.nn.Module) -> None:
        backend.prepare_model(module, options)

    return prepare


def draft_loader(
    attn_name: str, target_dtype: torch.dtype, device: torch.device, prepare: Callable[[Any], None]
) -> Callable[[str, torch.dtype | None], torch.nn.Module]:
    """``load_model(path, dtype)`` for drafters: the engine's attention, the backend's preparation."""

    def load(path: str, dtype: torch.dtype | None) -> torch.nn.Module:
        source = resolve_model(os.fspath(path))
        model = load_model(source, attn_name, dtype if dtype is not None else target_dtype, device)
        prepare(model)
        module: torch.nn.Module = model
        return module

    return load


def assemble(
    target: Any,
    ctx: DrafterContext | None,
    max_model_len: int,
    max_num_seqs: int,
    kv_cache_memory_bytes: int | None,
    headroom: int,
    bound_windows: bool = False,
) -> tuple[ModelRunner, SlotTable, Drafter | None]:
    """Build the drafter, size and allocate every cache, and return the target runner and slot table.

    ``headroom``: target cache positions past ``max_model_len`` (K: a captured verify step feeds every
    request K+1 query tokens, placeholders past its drafts included, even at the end of the context).
    ``bound_windows``: the target's sliding-window layers keep window rings (``runtime.window_cache``)."""
    drafter = build_drafter(ctx) if ctx is not None else None
    device = ctx.device if ctx is not None else target.device
    layout = kv_layout(target.config, target.dtype, device, bound_windows=bound_windows)
    target_bytes = layout.bytes_per_slot(max_model_len, headroom)
    draft_bytes = drafter.cache_bytes_per_slot() if drafter is not None else 0
    num_slots = plan_num_slots(target_bytes + draft_bytes, max_model_len, max_num_seqs, kv_cache_memory_bytes)
    cache = RaggedKVCache(layout, max_model_len, num_slots, headroom)
    if drafter is not None:
        drafter.allocate_caches(num_slots)
    hidden = drafter.hidden_states if drafter is not None else HiddenStateRequest()
    runner = ModelRunner(target, cache, hidden)
    slots = SlotTable(cache, drafter.caches() if drafter is not None else ())
    return runner, slots, drafter


def adaptive_wanted(spec: SpeculativeConfig, tree: bool, confidence: bool) -> bool:
    """``adaptive_draft_length`` as set; unset, on for a chain verified against the target. Off unset for
    a token ``tree`` (its cost grows with the nodes of a depth, which the policy does not price), with a
    ``confidence`` rule (which chooses each request's verify length from the same measured step costs)
    and for ``rejection_sample_method='synthetic'`` (a benchmark of a drafter at a fixed acceptance and
    ``K``)."""
    if spec.adaptive_draft_length is not None:
        return spec.adaptive_draft_length
    return not tree and not confidence and spec.rejection_sample_method != "synthetic"


def step_policies(
    spec: SpeculativeConfig | None,
    k: int,
    drafter: Drafter | None,
    tree: Plan | None,
    recurrent: bool,
    rule: str = "standard",
) -> tuple[AdaptiveDraftLength | None, ConfidenceVerification | None]:
    """The engine's draft-length policy (``adaptive_draft_length``) and verify-length rule (a drafter
    with a confidence head: ``confidence_verification``; chains only: a token tree verifies its nodes)."""
    if spec is None:
        return None, None
    if tree is not None and recurrent:
        raise ValueError("token trees need a target of attention layers: this one keeps recurrent state")
    if tree is not None and rule != "standard":
        raise ValueError(
            f"{tree.describe} is verified by recursive rejection sampling over its nodes; "
            f"rejection_sample_method={spec.rejection_sample_method!r} (rule {rule!r}) cannot apply to it: "
            "use 'strict' (top-token nodes) or 'probabilistic' (sampled siblings, a static tree only) "
            "and no lossy rejection_sampler_config"
        )
    if isinstance(tree, DraftPaths) and not spec.uses_draft_probs:
        raise ValueError(
            f"{tree.describe} are verified by greedy multi-path block verification, which reads the "
            f"distribution each path was drawn from: rejection_sample_method='probabilistic' or 'standard', "
            f"got {spec.rejection_sample_method!r}"
        )
    if isinstance(tree, DynamicTree) and spec.uses_draft_probs:
        raise ValueError(
            f"{tree.describe} keeps nodes by their draft probability, so with sampled siblings "
            f"(rejection_sample_method={spec.rejection_sample_method!r}) which siblings exist would depend "
            "on their tokens and verification would be biased: use 'strict' (top-token nodes) or a "
            "static speculative_token_tree"
        )
    reports = drafter is not None and drafter.reports_confidence and tree is None
    if tree is not None and spec.confidence_verification not in (None, "off"):
        raise ValueError(
            f"confidence_verification={spec.confidence_verification!r} chooses how much of a chain to "
            f"verify; with {tree.describe} every node is verified (use 'off' or leave it unset)"
        )
    confidence = build_confidence_verification(
        spec.confidence_verification, spec.confidence_threshold, reports
    )
    wanted = adaptive_wanted(spec, tree is not None, confidence is not None)
    adaptive = AdaptiveDraftLength(k) if wanted else None
    return adaptive, confidence


def capture_steps(engine: EngineCore, backend: Backend, eager: bool) -> None:
    """Capture the engine's decode steps as graphs, unless ``eager`` or the backend does not capture: the
    verify step (K+1 tokens per request; a tree's root and nodes), beside a chain's the one-token step that
    steps without drafts replay, and after each chain forward its sampler (``runtime/captured_verify``)."""
    runner, tree = engine.runner, engine.tree
    q = 1 + tree.max_nodes if tree is not None else engine.k + 1
    engine.captured = maybe_capture(runner, backend, q, engine.max_num_seqs, eager, tree is not None)
    if engine.captured is not None and tree is None and q > 1:
        engine.captured_plain = maybe_capture(runner, backend, 1, engine.max_num_seqs, eager)
        if engine.adaptive is not None:  # a step with any drafts replays the K+1-token graph
            engine.adaptive.fixed_width = True
    chains = [c for c in (engine.captured, engine.captured_plain) if c is not None and tree is None]
    logits = None  # one static logits buffer for every sampler graph set (the widest set's, made first)
    for captured in sorted(chains, key=lambda c: c.graph.capture_sizes[-1], reverse=True):
        sampler, sizes = engine.verifier.sampler, captured.graph.capture_sizes
        captured.verify = capture_verify(sampler, backend, captured.q, sizes, runner.vocab_size, logits)
        logits = captured.verify.logits if captured.verify is not None else logits
        captured.device_lengths = backend.captures_draft_chains  # steps may go ahead over device lengths


__all__ = [
    "QUANTIZABLE_FAMILIES",
    "adaptive_wanted",
    "assemble",
    "capture_steps",
    "check_embedded_method",
    "draft_loader",
    "draft_preparation",
    "step_policies",
]
