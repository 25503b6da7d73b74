"""The Backend contract: the only place where hardware differences live.

Algorithms in ``spec_backend`` never branch on device or vendor. They ask the active backend for:

* identity and availability: ``name``, ``device_type``, ``probe()`` / ``is_available()`` (cheap; a
  probe never raises, it reports ``unavailable: <reason>``);
* token limits (``TokenLimits``), checked when a configuration is bound to the backend;
* a capture-size policy (``CapturePolicy``) consumed by ``spec_backend.graphs.plan_capture_sizes``;
* a graph runner (``GraphRunner``) that captures a callable at each planned size and replays it with
  padding;
* an attention function for transformers' ``AttentionInterface`` over the engine's ragged KV cache;
* sampler ops (the kernels behind the rejection sampler) and their tuning (tile sizes, grid caps);
* optional kernel choices on a loaded model, with the options the user passed (``prepare_model``,
  ``ModelOptions``), and the dtype a model runs in when the user asked for ``dtype="auto"``
  (``default_dtype``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

# The capture policy lives with the capture-size planner that reads it (below this package); re-exported.
from spec_backend.graphs import CapturePolicy

# The sampler's tuning and K bound live with the sampler (below this package); re-exported here.
from spec_backend.sampling.tuning import MAX_SPEC_TOKENS, SamplerTuning

if TYPE_CHECKING:
    from spec_backend.backends.recurrence import RecurrenceOps
    from spec_backend.sampling.ops import SamplerOps

DeviceType = Literal["cpu", "cuda", "npu"]

#: What a graph runner returns: one tensor, or a tuple of tensors, each with the token count as its
#: leading dimension ([N, ...]).
GraphOutput = torch.Tensor | tuple[torch.Tensor, ...]
#: What a graph runner captures: ``fn(**inputs) -> GraphOutput``, every input [N, ...].
GraphFn = Callable[..., GraphOutput]

#: transformers' attention-function signature: (module, query, key, value, mask, **kwargs) -> (out, weights)
AttentionFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


class BackendError(RuntimeError):
    """Raised for backend discovery, loading and capability errors."""


class BackendNotImplementedError(NotImplementedError, BackendError):
    """A backend part that has not been built yet; never silently replaced by another backend's part."""

    def __init__(self, backend: str, part: str) -> None:
        super().__init__(f"{part} is not implemented yet for backend {backend!r}")


@dataclass(frozen=True)
class ModelOptions:
    """What the user asked of one loaded model, handed to ``Backend.prepare_model`` (never stashed on the
    model's config). ``quantization``: a weight-only mode (one of the backend's
    ``supported_quantizations``), from ``LLM(quantization=...)`` for the target or
    ``speculative_config['quantization']`` for draft weights; ``None``: the weights as loaded.
    ``speculative_tokens``: K of the speculative config the model verifies for (its verify steps have K+1
    rows per request), ``None`` where not known; a backend may measure its kernels at that shape.
    ``gguf_file``: the GGUF file the weights were de-quantized from, ``None`` for other checkpoints; a
    backend may run layers from the file's quantized blocks."""

    quantization: str | None = None
    speculative_tokens: int | None = None
    gguf_file: str | None = None


@dataclass(frozen=True)
class Availability:
    """Result of a backend probe: ``reason`` explains why a backend is unavailable (for an available one,
    an optional note, e.g. a slower path it falls back to)."""

    available: bool
    reason: str = ""

    def __str__(self) -> str:
        if self.available:
            return f"available ({self.reason})" if self.reason else "available"
        return f"unavailable: {self.reason}"


@dataclass(frozen=True)
class TokenLimits:
    """What a device can do per decode round.

    ``max_query_tokens_per_request``: query tokens one request may carry through attention in one step
    (verification needs K+1); ``None`` means unlimited. ``max_speculative_tokens``: draft tokens per
    request that the sampler supports on this backend.
    """

    max_query_tokens_per_request: int | None = None
    max_speculative_tokens: int = MAX_SPEC_TOKENS

    def check_num_speculative_tokens(self, backend: str, k: int) -> None:
        """Raise ``ValueError`` naming backend, limit and value when K draft tokens cannot run."""
        if k > self.max_speculative_tokens:
            raise ValueError(
                f"num_speculative_tokens={k} exceeds the limit of backend {backend!r}: "
                f"at most {self.max_speculative_tokens} speculative tokens per request"
            )
        limit = self.max_query_tokens_per_request
        if limit is not None and k + 1 > limit:
            raise ValueError(
                f"backend {backend!r} allows at most {limit} query tokens per request per step "
                f"(max_query_tokens_per_request={limit}), but num_speculative_tokens={k} needs K+1={k + 1}; "
                f"use num_speculative_tokens <= {limit - 1}"
            )


class GraphRunner(ABC):
    """Captures ``fn(**inputs)`` at fixed token counts and replays it, padding up to the next size.

    Every input's leading dimension is the number of tokens; ``fn`` returns one tensor or a tuple of
    tensors (``GraphOutput``), each with the token count as its leading dimension. ``run`` returns the
    same structure sliced back to the real number of tokens. Above the largest captured size the callable
    runs eagerly.
    """

    def __init__(self, fn: GraphFn, capture_sizes: Sequence[int]) -> None:
        self.fn = fn
        self.capture_sizes: tuple[int, ...] = tuple(sorted(set(capture_sizes)))

    @abstractmethod
    def capture(self, example_inputs: Mapping[str, torch.Tensor], shared: Collection[str] = ()) -> None:
        """Capture one graph per size; ``example_inputs`` are sized at the largest capture size. The
        inputs named in ``shared`` are the static buffers themselves, not copied: runners handed the same
        tensor share its memory, and a caller that writes a step's input into it once (passing
        ``buffer[:n]`` to ``run``) feeds whichever of them replays."""

    @abstractmethod
    def run(self, inputs: Mapping[str, torch.Tensor]) -> GraphOutput:
        """Replay (or run eagerly) on ``inputs`` whose leading dim is the real token count."""

    def set_step_lengths(self, query_lens: Sequence[int], kv_lens: Sequence[int]) -> None:
        """The per-request query and kv lengths of the next ``run`` (the engine calls it before each
        run). Devices whose captured attention keeps host-side lengths (Ascend) re-issue them on replay;
        the default ignores them."""
        del query_lens, kv_lens


class Backend(ABC):
    """Abstract backend. Subclasses are registered under the ``spec_backend.backends`` entry points."""

    name: ClassVar[str]
    device_type: ClassVar[DeviceType]
    #: Weight-only quantization modes ``prepare_model`` applies when ``ModelOptions.quantization`` names
    #: one; none by default (a mode not listed here is refused before any weights load).
    supported_quantizations: ClassVar[tuple[str, ...]] = ()
    #: whether its attention applies a token tree's ancestor mask (``RaggedAttentionMetadata.tree``); a
    #: backend that cannot is refused a branching ``speculative_token_tree`` at start-up
    token_trees: ClassVar[bool] = True
    #: whether its graph runner may capture a token-tree verify step (its attention applies the ancestor
    #: mask inside a captured graph); False: tree steps run eagerly
    captures_token_trees: ClassVar[bool] = True
    #: whether its graph runner may capture the rejection sampler after a decode step's forward
    #: (``runtime/captured_verify``: its sampler ops launched inside a graph); False: verified eagerly
    captures_sampler: ClassVar[bool] = True
    #: whether its captured attention reads each forward's lengths from device tensors, so that one graph
    #: may hold several forwards over lengths growing inside it (a draft head's greedy chain,
    #: ``proposers/captured_head``) and a verify step may replay over lengths the host has not read (a
    #: speculative step launched ahead, ``engine/spec_ahead.py``); False (host-side lengths re-issued
    #: once per replay): one replay per draft step, and speculative steps stay synchronous
    captures_draft_chains: ClassVar[bool] = False
    #: whether the device runs launched work while the host goes on (a GPU's or an NPU's stream): then
    #: ``async_scheduling`` (``engine/lookahead.py``) is on by default, and a plain step's host work
    #: overlaps the next step's device time; False (the host computes each op as it is called): off
    launches_async: ClassVar[bool] = False
    #: whether ``start_host_copy``'s wait waits for the copied work alone, not for work queued after it
    #: (a copy into pinned memory and an event): then a step launched ahead is queued before the step
    #: before it is read (``engine/lookahead.py``); False: a read waits for everything queued, so the
    #: step is read before the next one is launched
    reads_early: ClassVar[bool] = False

    def start_host_copy(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        """Start copying ``tensor`` (a step's packed output: a few ints per request) to the host, right
        after the work that writes it is queued; the returned callable waits for the copy and returns
        the host tensor (``reads_early``: it waits for that work alone). Default: the copy is made when
        the callable is called (``Tensor.cpu``, which on a queueing device waits for all queued work)."""
        return tensor.cpu

    @abstractmethod
    def probe(self) -> Availability:
        """Cheap availability check; never raises and never imports another vendor's stack."""

    def is_available(self) -> bool:
        return self.probe().available

    @abstractmethod
    def token_limits(self) -> TokenLimits:
        """Per-device token limits (see ``TokenLimits``)."""

    @abstractmethod
    def capture_policy(self, num_hidden_layers: int | None = None) -> CapturePolicy:
        """Capture-size caps; ``num_hidden_layers`` lets stream-limited devices size their budget."""

    @abstractmethod
    def graph_runner(self, fn: GraphFn, capture_sizes: Sequence[int]) -> GraphRunner:
        """A graph runner for ``fn`` at ``capture_sizes`` (multiples of K+1). Every backend takes exactly
        these parameters (checked when the plugin loads); device knobs belong on the backend instance."""

    @abstractmethod
    def attention_function(self) -> AttentionFn:
        """The function registered in transformers' ``AttentionInterface`` under ``self.name``."""

    @abstractmethod
    def sampler_ops(self) -> SamplerOps:
        """The kernels behind the rejection sampler on this device."""

    @abstractmethod
    def sampler_tuning(self) -> SamplerTuning:
        """Tile sizes and grid caps for the shared triton sampler kernels."""

    def prepare_model(self, model: torch.nn.Module, options: ModelOptions) -> None:
        """Device-specific kernel choices on a loaded model, target or draft (default: none), including the
        weight-only quantization ``options`` names (one of ``supported_quantizations``)."""
        del model, options

    def recurrence_ops(self) -> RecurrenceOps:
        """The recurrences behind linear-attention layers (Gated DeltaNet, Mamba-2) on this device
        (default: the plain-torch reference, ``backends.recurrence.ReferenceRecurrence``)."""
        from spec_backend.backends.recurrence import REFERENCE_RECURRENCE

        return REFERENCE_RECURRENCE

    def default_dtype(self, loaded: torch.dtype) -> torch.dtype:
        """The dtype a model whose weights load as ``loaded`` runs in when the user asked for
        ``dtype="auto"`` (default: as loaded; CPU backends widen half precision to float32)."""
        return loaded

    def device(self) -> torch.device:
        """The torch device tensors for this backend live on."""
        return torch.device(self.device_type)

    def check_num_speculative_tokens(self, k: int) -> None:
        """Fail (``ValueError``) when this backend cannot verify K draft tokens per request."""
        self.token_limits().check_num_speculative_tokens(self.name, k)

    def describe(self) -> dict[str, Any]:
        """A summary for ``spec-backend backends``."""
        limits = self.token_limits()
        return {
            "name": self.name,
            "device": self.device_type,
            "status": str(self.probe()),
            "max_query_tokens_per_request": limits.max_query_tokens_per_request,
            "max_speculative_tokens": limits.max_speculative_tokens,
        }


__all__ = [
    "MAX_SPEC_TOKENS",
    "AttentionFn",
    "Availability",
    "Backend",
    "BackendError",
    "BackendNotImplementedError",
    "CapturePolicy",
    "DeviceType",
    "GraphFn",
    "GraphOutput",
    "GraphRunner",
    "ModelOptions",
    "SamplerTuning",
    "TokenLimits",
]
