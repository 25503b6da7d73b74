"""Start-up hook: reads ``additional_config`` where vLLM builds its ``VllmConfig``.

A general plugin is not handed the engine's configuration, and vLLM 0.32 offers no plugin callback
that sees it (``Platform.check_and_update_config`` belongs to platform plugins). ``VllmConfig`` is
built in the front-end process after plugins are loaded, so wrapping ``VllmConfig.__post_init__`` is
the earliest point that sees ``additional_config`` — errors surface before any model is loaded.

With ``rejection_sampler_config`` present, before vLLM's own ``__post_init__`` runs, the wrapper:

1. validates it (``RejectionSamplerConfig``; our message, raised as vLLM's config error);
2. maps vLLM's speculative config onto ours (``rejection_sample_method`` with its synthetic / FLy
   parameters included), resolves the verification plan the sampler will run (``VerifyPlan.resolve``:
   the two configs checked against each other, a rule our sampler cannot honour refused by name) and
   binds the result to ``load_backend()`` (the active backend's token limits, e.g. Ascend's K+1 <= 16);
3. selects the V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``), where the verification hook lives;
4. when the user gave no ``cudagraph_capture_sizes``, sets them from ``plan_capture_sizes``
   (multiples of K+1, the backend's cap and graph budget); vLLM then validates them as its own.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spec_backend.config import ADDITIONAL_CONFIG_KEY, RejectionSamplerConfig, SpeculativeConfig, VerifyPlan
from spec_backend.methods import METHODS

logger = logging.getLogger("spec_backend.integrations.vllm")

_MARK = "_spec_backend_wrapped"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


#: vLLM's FLy fields (vLLM 0.33, ``vllm/config/speculative.py``): the same names as ours
VLLM_FLY_FIELDS = ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")


@dataclass(frozen=True)
class ResolvedConfig:
    """What the verification hook needs: the sampler flags in effect (``plan.config``: with
    ``rejection_sample_method="block"`` block verification is on), vLLM's speculative config mapped onto
    ours, and the one ``VerifyPlan`` both resolve to — the rule vLLM's config names with its parameters
    (synthetic rates, FLy's window), as the embedded engine resolves it (``VerifyPlan.resolve``)."""

    rejection: RejectionSamplerConfig
    speculative: SpeculativeConfig | None
    plan: VerifyPlan


def rejection_config_from(additional_config: Any) -> RejectionSamplerConfig | None:
    """Our config when ``additional_config`` carries ``rejection_sampler_config``, else ``None``.

    Raises ``ValueError`` (prefixed with the plugin's name) for bad values.
    """
    if isinstance(additional_config, str | bytes) or not isinstance(additional_config, Mapping):
        return None  # vLLM accepts SupportsHash objects here; those carry no rejection_sampler_config
    if ADDITIONAL_CONFIG_KEY not in additional_config:
        return None
    try:
        return RejectionSamplerConfig.from_additional_config(additional_config)
    except ValueError as exc:
        raise ValueError(f"spec_backend vLLM plugin: invalid additional_config: {exc}") from exc


def to_spec_config(vllm_spec: Any) -> SpeculativeConfig:
    """Map vLLM's ``SpeculativeConfig`` onto ours (the fields verification depends on).

    vLLM has already resolved its config (draft model, K from ``n_predict``, synthetic rates, FLy's
    window), so only resolved values are carried over: K, ``rejection_sample_method`` with its
    parameters (``synthetic_acceptance_rates``; ``fly_window_size`` / ``fly_entropy_threshold`` /
    ``fly_entropy_top_k``), the n-gram bounds. A drafting method name we do not know is kept out
    (verification does not depend on it) rather than failing a configuration vLLM accepted; a
    ``rejection_sample_method`` we do not know fails (``ValueError`` naming it): the plugin never verifies
    with a rule other than the one vLLM's config names.
    """
    method = getattr(vllm_spec, "method", None)
    k = getattr(vllm_spec, "num_speculative_tokens", None)
    data: dict[str, Any] = {"num_speculative_tokens": k}
    if method in METHODS and METHODS[method].family == "host":
        data["method"] = method
    else:
        data["method"] = "ngram"  # model-free stand-in: no draft-model resolution from our side
        if method not in (None, "ngram"):
            logger.debug("spec_backend: verifying drafts of vLLM method %r (method not re-validated)", method)
    rsm = getattr(vllm_spec, "rejection_sample_method", "standard") or "standard"
    data["rejection_sample_method"] = rsm  # a name we do not know is refused by name below
    if rsm == "synthetic":
        data["synthetic_acceptance_rates"] = list(
            getattr(vllm_spec, "synthetic_acceptance_rates", None) or []
        )
    if rsm == "fly":  # vLLM 0.33 has resolved the window; our defaults equal vLLM's for absent fields
        data.update({n: v for n in VLLM_FLY_FIELDS if (v := getattr(vllm_spec, n, None)) is not None})
    for name in ("prompt_lookup_max", "prompt_lookup_min"):
        value = getattr(vllm_spec, name, None)
        if data["method"] in ("ngram", "ngram_gpu") and isinstance(value, int):
            data[name] = value
    try:
        return SpeculativeConfig.model_validate(data)
    except ValueError as exc:
        raise ValueError(
            f"spec_backend vLLM plugin: speculative_config cannot be verified by spec_backend: {exc}"
        ) from exc


def resolve(additional_config: Any, vllm_spec: Any, backend: Any = None) -> ResolvedConfig | None:
    """Validate, map, resolve the verification plan and bind. ``None`` when ``rejection_sampler_config``
    is absent; ``ValueError`` (prefixed with the plugin's name) for what cannot run."""
    rs = rejection_config_from(additional_config)
    if rs is None:
        return None
    if vllm_spec is None:
        return ResolvedConfig(rs, None, VerifyPlan.resolve(None, rs))
    spec = to_spec_config(vllm_spec)
    try:
        plan = VerifyPlan.resolve(spec, rs)
        if backend is None:
            from spec_backend.backends import load_backend

            backend = load_backend()
        spec.bind(backend)
    except ValueError as exc:
        raise ValueError(f"spec_backend vLLM plugin: {exc}") from exc
    return ResolvedConfig(plan.config, spec, plan)


#: Platform plugins that replace vLLM's ``rejection_sample`` themselves and read the same
#: ``rejection_sampler_config`` key with their own semantics: top-level module -> product name.
OWN_REJECTION_PLATFORMS = {"vllm_ascend": "vllm-ascend"}


def platform_owning_rejection() -> str | None:
    """The active vLLM platform plugin that owns rejection sampling itself (vllm-ascend), or ``None``."""
    from vllm import platforms

    module = type(platforms.current_platform).__module__.split(".")[0]
    return OWN_REJECTION_PLATFORMS.get(module)


def refuse_shared_key(additional_config: Any) -> None:
    """Raise when ``rejection_sampler_config`` is set on a platform whose plugin also reads it."""
    if not isinstance(additional_config, Mapping) or ADDITIONAL_CONFIG_KEY not in additional_config:
        return
    owner = platform_owning_rejection()
    if owner is None:
        return
    raise ValueError(
        f"spec_backend vLLM plugin: additional_config[{ADDITIONAL_CONFIG_KEY!r}] is read by both {owner} "
        f"(the active platform, whose rejection sampler replaces vLLM's and whose block verify is the lossy "
        "cumulative rule) and spec_backend (lossless unless a lossy mode is named); one engine cannot honour "
        f"both. For {owner}'s sampler, start vLLM without spec_backend's plugin (list the plugins to load in "
        "VLLM_PLUGINS, leaving out 'spec_backend', or pip uninstall spec-backend). For spec_backend's "
        "verification on this hardware, use spec_backend's own engine (from spec_backend import LLM). "
        "See docs/vllm.md, 'vllm-ascend'."
    )


def select_v1_runner() -> None:
    """The verification hook is in the V1 model runner: select it, or fail if V2 was asked for."""
    value = os.environ.get(V2_RUNNER_ENV)
    if value is not None and value.strip().lower() in ("1", "true", "yes"):
        raise ValueError(
            f"spec_backend vLLM plugin: rejection_sampler_config runs in vLLM's V1 model runner, but "
            f"{V2_RUNNER_ENV}={value} asks for Model Runner V2; unset it (or set it to 0), or drop "
            "rejection_sampler_config from additional_config"
        )
    if value is None:
        os.environ[V2_RUNNER_ENV] = "0"  # inherited by the engine-core and worker processes
        logger.info(
            "spec_backend: rejection_sampler_config selects vLLM's V1 model runner (%s=0)", V2_RUNNER_ENV
        )


def plan_vllm_capture_sizes(vllm_config: Any, spec: SpeculativeConfig, backend: Any) -> list[int] | None:
    """Our capture plan for this engine, or ``None`` to leave vLLM's defaults (user-given sizes,
    eager mode, a backend that does not capture)."""
    from spec_backend.graphs import plan_capture_sizes

    comp = vllm_config.compilation_config
    if comp.cudagraph_capture_sizes is not None or getattr(vllm_config.model_config, "enforce_eager", False):
        return None
    if not backend.capture_policy().enabled:
        return None
    sched = vllm_config.scheduler_config
    max_seqs, max_tokens = (
        getattr(sched, "max_num_seqs", None),
        getattr(sched, "max_num_batched_tokens", None),
    )
    if not isinstance(max_seqs, int) or max_seqs < 1:
        return None
    cap = comp.max_cudagraph_capture_size
    if isinstance(cap, int) and cap > 0:
        max_tokens = min(cap, max_tokens) if isinstance(max_tokens, int) else cap
    assert spec.num_speculative_tokens is not None
    return plan_capture_sizes(
        spec.num_speculative_tokens,
        max_seqs,
        max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None,
        backend=backend,
    )


def _before_post_init(vllm_config: Any) -> bool:
    """Our part of ``VllmConfig.__post_init__``; returns whether our sampler is configured."""
    if getattr(getattr(vllm_config, "model_config", None), "is_submodel_config", False):
        return False  # a view of an already validated parent config
    refuse_shared_key(vllm_config.additional_config)
    resolved = resolve(vllm_config.additional_config, vllm_config.speculative_config)
    if resolved is None:
        return False
    if resolved.speculative is None:
        logger.warning(
            "spec_backend: %s is set but speculative decoding is off (no speculative_config): no effect",
            ADDITIONAL_CONFIG_KEY,
        )
        return False
    select_v1_runner()
    from spec_backend.backends import load_backend

    backend = load_backend()
    sizes = plan_vllm_capture_sizes(vllm_config, resolved.speculative, backend)
    if sizes is not None:
        vllm_config.compilation_config.cudagraph_capture_sizes = sizes
        logger.info(
            "spec_backend: cudagraph capture sizes from the %s backend's plan: %s", backend.name, sizes
        )
    logger.info(
        "spec_backend: rejection sampler rule %r %s on backend %s (K=%s)",
        resolved.plan.rule.name,
        resolved.rejection.model_dump(),
        backend.name,
        resolved.speculative.num_speculative_tokens,
    )
    return True


def _after_post_init(vllm_config: Any) -> None:
    if getattr(vllm_config, "use_v2_model_runner", False):
        raise ValueError(
            "spec_backend vLLM plugin: this configuration forces vLLM's Model Runner V2 (e.g. watermarking "
            f"or HiSparse), where {ADDITIONAL_CONFIG_KEY} cannot be applied; drop one of them"
        )


def install() -> None:
    """Wrap ``VllmConfig.__post_init__`` once per process."""
    from vllm.config import VllmConfig

    original = VllmConfig.__post_init__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def __post_init__(self: Any) -> None:
        ours = _before_post_init(self)
        original(self)
        if ours:
            _after_post_init(self)

    setattr(__post_init__, _MARK, True)
    __post_init__.__wrapped_original__ = original  # type: ignore[attr-defined]
    VllmConfig.__post_init__ = __post_init__


def uninstall() -> None:
    """Undo ``install()`` (tests)."""
    from vllm.config import VllmConfig

    current = VllmConfig.__post_init__
    if getattr(current, _MARK, False):
        VllmConfig.__post_init__ = current.__wrapped_original__
