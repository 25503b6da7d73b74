"""``SpeculativeConfig``: the ``--speculative-config`` / ``speculative_config=`` settings.

Field names, defaults and rules follow vLLM's ``SpeculativeConfig`` so configurations carry over. The
target and draft model configs are our own light models (``ModelConfigLite`` / ``ParallelConfigLite``):
rules that need them are skipped while they are unknown. See docs/configuration.md for every field.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import math
import sys
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from spec_backend.config import draft as draft_rules
from spec_backend.config.confidence import resolve_confidence_fields
from spec_backend.config.fly import (
    DEFAULT_FLY_ENTROPY_THRESHOLD,
    DEFAULT_FLY_ENTROPY_TOP_K,
    FlyConfig,
    resolve_fly,
)
from spec_backend.config.json_input import json_object
from spec_backend.config.methods import (
    AUX_HIDDEN_STATE_METHODS,
    AUX_HIDDEN_STATES_SUPPORTED,
    EAGLE_METHODS,
    MODEL_FREE_METHODS,
    SpeculativeMethod,
    check_method_name,
    infer_method,
    normalize_method,
)
from spec_backend.config.model_configs import LoadConfigLite, ModelConfigLite, ParallelConfigLite
from spec_backend.config.ngram import resolve_lookup_window
from spec_backend.config.sampler_methods import (
    SAMPLER_METHOD_BY_NAME,
    RejectionSampleMethod,
    SamplerMethod,
    check_rejection_sample_method,
    resolve_verification_fields,
)
from spec_backend.config.token_tree import (
    TokenTree,
    parse_token_tree,
    resolve_dynamic_tree_fields,
    sort_token_tree,
    tree_to_string,
)

logger = logging.getLogger("spec_backend.config")

#: Sanity bound on K at config time; backends impose their own (lower) limits in ``bind()``.
MAX_NUM_SPECULATIVE_TOKENS = 1024


#: Numeric ranges checked on fields: name -> (low, high, rule as stated in the error).
_RANGES: dict[str, tuple[float, float, str]] = {
    "disable_by_batch_size": (2, math.inf, ">= 2 (or null to never disable speculation)"),
    "suffix_decoding_max_tree_depth": (1, math.inf, ">= 1"),
    "suffix_decoding_max_cached_requests": (0, math.inf, ">= 0 (0 disables the global suffix tree)"),
    "suffix_decoding_max_spec_factor": (0.0, sys.float_info.max, "a finite number >= 0"),
    "suffix_decoding_min_token_prob": (0.0, 1.0, "in [0, 1]"),
    "confidence_threshold": (0.0, 1.0, "in [0, 1]"),
}


class SupportsSpeculativeTokenCheck(Protocol):
    """Anything with the Backend contract's ``check_num_speculative_tokens`` (e.g. a ``Backend``)."""

    def check_num_speculative_tokens(self, k: int) -> None: ...


class SpeculativeConfig(BaseModel):
    """Speculative decoding settings, validated and resolved at construction.

    After validation ``method`` is normalised (inferred, ``[ngram]`` → ``ngram``, deprecated MTP names
    → ``mtp``), ``num_speculative_tokens`` is set, and the draft model/parallel configs, token tree and
    synthetic rates are resolved. ``SpeculativeConfig.model_validate(cfg.model_dump())`` gives ``cfg``
    back.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    # General control
    enforce_eager: bool | None = None
    num_speculative_tokens: int | None = Field(default=None, gt=0)
    model: str | None = None
    method: SpeculativeMethod | None = None
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    tensor_parallel_size: int | None = None
    # Draft model
    quantization: str | None = None
    moe_backend: str | None = None
    max_model_len: int | None = Field(default=None, ge=1)
    revision: str | None = None
    code_revision: str | None = None
    # Advanced control
    disable_padded_drafter_batch: bool = False
    use_local_argmax_reduction: bool = False
    disable_by_batch_size: int | None = None
    #: this engine's own (engine/adaptive.py); None: on for chains (``engine.assembly.adaptive_wanted``)
    adaptive_draft_length: bool | None = None
    #: this engine's own, for drafters with a confidence head (dspark): how many drafts each request
    #: verifies (engine/confidence.py, config/confidence.py)
    confidence_verification: Literal["throughput", "threshold", "off"] | None = None
    confidence_threshold: float | None = None
    # n-gram
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    # Drafting strategies
    speculative_token_tree: str | None = None
    #: this engine's own: EAGLE-2 dynamic trees, i.i.d. draft paths verified by GBV (config/token_tree.py)
    tree_top_k: int | None = Field(default=None, ge=1)
    tree_nodes: int | None = Field(default=None, ge=1)
    tree_paths: int | None = Field(default=None, ge=2, le=8)
    parallel_drafting: bool = False
    # Target (given) and draft (resolved) configs
    target_model_config: ModelConfigLite | None = None
    target_parallel_config: ParallelConfigLite | None = None
    draft_model_config: ModelConfigLite | None = None
    draft_parallel_config: ParallelConfigLite | None = None
    # Suffix decoding
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    draft_load_config: LoadConfigLite | None = None
    # Verification
    rejection_sample_method: RejectionSampleMethod = "strict"
    synthetic_acceptance_rates: list[float] | None = None
    synthetic_acceptance_length: float | None = None
    fly_window_size: int | None = Field(default=None, ge=1)
    fly_entropy_threshold: float = Field(default=DEFAULT_FLY_ENTROPY_THRESHOLD, ge=0)
    fly_entropy_top_k: int = Field(default=DEFAULT_FLY_ENTROPY_TOP_K, ge=1)
    # --- input checks ---------------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _check_keys(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        allowed = sorted(cls.model_fields)
        unknown = sorted((k for k in data if k not in cls.model_fields), key=str)
        if unknown:
            hints = [
                f"{close[0]!r} for {k!r}"
                for k in unknown
                if isinstance(k, str) and (close := difflib.get_close_matches(k, allowed, n=1))
            ]
            hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
            raise ValueError(f"unknown speculative_config key(s) {unknown}{hint}; allowed keys: {allowed}")
        draft = data.get("draft_model_config")
        extracting = data.get("method") == "extract_hidden_states"
        if extracting and isinstance(draft, Mapping) and "model" not in draft:
            data = {**data, "draft_model_config": {**draft, "model": "extract_hidden_states"}}
        if data.get("tensor_parallel_size") is not None:
            raise ValueError(
                f"tensor_parallel_size={data['tensor_parallel_size']!r} is not a speculative_config "
                "option; pass draft_tensor_parallel_size (1 or the target's tensor parallel size) instead"
            )
        return data

    @field_validator("method", mode="before")
    @classmethod
    def _check_method(cls, v: Any) -> Any:
        return check_method_name(v)

    @field_validator("rejection_sample_method", mode="before")
    @classmethod
    def _check_rejection_sample_method(cls, v: Any) -> Any:
        return check_rejection_sample_method(v)

    @field_validator("speculative_token_tree", mode="before")
    @classmethod
    def _tree_from_list(cls, v: Any) -> Any:
        return tree_to_string(v)

    @field_validator(*_RANGES)
    @classmethod
    def _check_range(cls, v: Any, info: ValidationInfo) -> Any:
        low, high, rule = _RANGES[str(info.field_name)]
        if v is not None and not low <= v <= high:
            raise ValueError(f"{info.field_name} must be {rule}, got {v!r}")
        return v

    # --- resolution -------------------------------------------------------------------------------

    @model_validator(mode="after")
    def _resolve(self) -> SpeculativeConfig:
        self.method = normalize_method(self.method if self.method is not None else infer_method(self.model))
        if (
            self.model is None
            and self.draft_model_config is not None
            and self.method not in MODEL_FREE_METHODS
        ):
            self.model = self.draft_model_config.model
        if self.model is None and self.method in MODEL_FREE_METHODS:
            self.model = self.method  # model-free methods name themselves
        elif self.model is None and self.num_speculative_tokens is not None:
            self._default_model()
        if self.method in ("ngram", "ngram_gpu"):
            self._resolve_ngram()
        elif self.method == "suffix":
            if self.num_speculative_tokens is None:
                self.num_speculative_tokens = self.suffix_decoding_max_tree_depth
                logger.warning(
                    "num_speculative_tokens defaulted to suffix_decoding_max_tree_depth=%d for suffix "
                    "decoding (an upper bound: suffix decoding picks each step's length)",
                    self.num_speculative_tokens,
                )
        elif self.method == "extract_hidden_states":
            self.model = "extract_hidden_states"
            if self.target_model_config is not None:
                extra = self.draft_model_config.hf_config if self.draft_model_config is not None else {}
                target = self.target_model_config
                self.draft_model_config = target.model_copy(
                    update={"hf_config": {**target.hf_config, **extra}}, deep=True
                )
            self.draft_parallel_config = self.target_parallel_config
        elif self.model is not None:
            draft_rules.resolve_draft_model(self, self.model)
        self._verify()
        return self

    def _default_model(self) -> None:
        """K was given without ``model``: MTP reuses the target's checkpoint, other methods need one."""
        if self.method == "mtp":
            target = self.target_model_config
            if target is None:
                return  # resolved once the target is known (skipped rule, see docs)
            if target.model_type == "deepseek_v32":
                self.enforce_eager = True  # graph capture with DeepSeek-V3.2 MTP is not supported
            self.model = target.model
            if not self.quantization:
                self.quantization = target.quantization
        else:
            raise ValueError(
                f"method={self.method!r} needs draft weights: num_speculative_tokens="
                f"{self.num_speculative_tokens} was given without model (set model to the draft model, "
                "EAGLE head or MTP weights, or use a model-free method such as 'ngram' or 'suffix')"
            )

    def _resolve_ngram(self) -> None:
        assert self.method is not None
        self.prompt_lookup_min, self.prompt_lookup_max = resolve_lookup_window(
            self.method, self.prompt_lookup_min, self.prompt_lookup_max
        )
        self.draft_model_config = self.target_model_config
        self.draft_parallel_config = self.target_parallel_config

    @staticmethod
    def check_k_bound(k: int) -> None:
        """Raise ``ValueError`` when K exceeds ``MAX_NUM_SPECULATIVE_TOKENS``."""
        if k > MAX_NUM_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens={k} is larger than {MAX_NUM_SPECULATIVE_TOKENS}, the most any "
                "backend supports (backends check their own, lower limits in SpeculativeConfig.bind)"
            )

    def _verify(self) -> None:
        k = self.num_speculative_tokens
        if k is None:
            raise ValueError(
                "num_speculative_tokens is required unless the draft model config defines n_predict "
                f"(got num_speculative_tokens=None with method={self.method!r}, model={self.model!r})"
            )
        self.check_k_bound(k)
        if self.speculative_token_tree is not None:
            self.speculative_token_tree = sort_token_tree(self.speculative_token_tree)
        resolve_verification_fields(self)
        resolve_confidence_fields(self)
        resolve_dynamic_tree_fields(self)
        if self.draft_model_config is not None and self.draft_parallel_config is not None:
            draft_rules.check_heads_divisible(
                self.draft_model_config.hf_text_config, self.draft_parallel_config.tensor_parallel_size
            )
        target_type = self.target_model_config.model_type if self.target_model_config else ""
        if (
            self.method in AUX_HIDDEN_STATE_METHODS
            and target_type
            and not any(name in target_type for name in AUX_HIDDEN_STATES_SUPPORTED)
        ):
            raise ValueError(
                f"method={self.method!r} needs auxiliary hidden states, supported only for target models "
                f"whose model_type contains one of {list(AUX_HIDDEN_STATES_SUPPORTED)}; got {target_type!r}"
            )
        if self.parallel_drafting and self.method not in (*EAGLE_METHODS, "draft_model"):
            raise ValueError(
                f"parallel_drafting=True works only with EAGLE-style methods {list(EAGLE_METHODS)} or "
                f"'draft_model', got method={self.method!r}"
            )
        self._check_vocab_sizes()

    def _check_vocab_sizes(self) -> None:
        target_config, draft_config = self.target_model_config, self.draft_model_config
        if self.method != "draft_model" or target_config is None or draft_config is None:
            return
        target, draft = target_config.get_vocab_size(), draft_config.get_vocab_size()
        if target is not None and draft is not None and target != draft:
            raise ValueError(
                f"the target and draft models must have the same vocabulary size for method='draft_model': "
                f"target vocab_size={target}, draft vocab_size={draft} (models with different tokenizers "
                "would index out of bounds)"
            )

    # --- construction helpers ---------------------------------------------------------------------

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """Parse ``--speculative-config`` JSON (an object) and validate it."""
        return cls.model_validate(json_object(text))

    def bind(self, backend: SupportsSpeculativeTokenCheck) -> SpeculativeConfig:
        """Check this config against a backend's token limits; raise ``ValueError`` naming backend,
        limit and value when K draft tokens cannot be verified there. Returns ``self``."""
        assert self.num_speculative_tokens is not None
        backend.check_num_speculative_tokens(self.num_speculative_tokens)
        return self

    # --- queries ----------------------------------------------------------------------------------

    @property
    def sampler_method(self) -> SamplerMethod:
        """The ``RejectionSampler`` method: ``"synthetic"``, ``"fly"`` or ``"standard"`` (lossless names)."""
        return SAMPLER_METHOD_BY_NAME[self.rejection_sample_method]

    @property
    def fly(self) -> FlyConfig | None:
        """FLy's validated parameters when ``rejection_sample_method="fly"`` (else ``None``)."""
        if self.rejection_sample_method != "fly":
            return None
        assert self.num_speculative_tokens is not None
        return resolve_fly(
            self.num_speculative_tokens,
            self.fly_window_size,
            self.fly_entropy_threshold,
            self.fly_entropy_top_k,
        )

    @property
    def block_verify_requested(self) -> bool:
        """``rejection_sample_method="block"``: lossless block verification is to be enabled."""
        return self.rejection_sample_method == "block"

    @property
    def uses_draft_probs(self) -> bool:
        """Whether verification uses the drafter's probabilities (``strict`` treats drafts as point
        masses; ``synthetic`` ignores them)."""
        return self.rejection_sample_method not in ("strict", "synthetic")

    @property
    def token_tree(self) -> TokenTree | None:
        """``speculative_token_tree`` parsed into tuples (``None`` for model-free methods)."""
        return None if self.speculative_token_tree is None else parse_token_tree(self.speculative_token_tree)

    @property
    def max_num_new_slots_for_drafting(self) -> int:
        """Most batch slots drafting may add per request (parallel drafting: K - 1; draft model: +1)."""
        slots = (self.num_speculative_tokens or 1) - 1 if self.parallel_drafting else 0
        return slots + 1 if self.uses_draft_model() else slots

    def use_eagle(self) -> bool:
        """EAGLE-style drafter on the target's hidden states (eagle, eagle3, mtp, dflash)."""
        return self.method in EAGLE_METHODS

    def use_dflash(self) -> bool:
        """The DFlash drafter."""
        return self.method == "dflash"

    def uses_draft_model(self) -> bool:
        """A separate small draft LM."""
        return self.method == "draft_model"

    def uses_extract_hidden_states(self) -> bool:
        """The hidden-state extraction pseudo-drafter."""
        return self.method == "extract_hidden_states"

    def use_ngram_gpu(self) -> bool:
        """The device-side n-gram drafter."""
        return self.method == "ngram_gpu"

    def compute_hash(self) -> str:
        """Hash of what changes the target's computation graph (auxiliary hidden states and their layers)."""
        aux = self.method in AUX_HIDDEN_STATE_METHODS
        factors: list[Any] = [aux]
        if aux and self.draft_model_config is not None:
            layer_ids = self.draft_model_config.hf_config.get("eagle_aux_hidden_state_layer_ids")
            if layer_ids is not None:
                factors.append(tuple(layer_ids) if isinstance(layer_ids, list) else layer_ids)
        return hashlib.sha256(str(factors).encode()).hexdigest()


__all__ = ["MAX_NUM_SPECULATIVE_TOKENS", "SpeculativeConfig", "SupportsSpeculativeTokenCheck"]
