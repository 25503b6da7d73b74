"""vLLM plugin entry point (``vllm.general_plugins`` → ``spec_backend.integrations.vllm:register``).

vLLM calls ``register()`` in every process it starts (front-end, engine core, each worker), before
any ``VllmConfig`` exists. ``register()`` therefore only installs two inert hooks; they act only when
the engine's ``additional_config`` carries ``rejection_sampler_config``:

* a config hook (``vllm_config_hook``) around ``VllmConfig.__post_init__``: validates
  ``rejection_sampler_config`` with ``RejectionSamplerConfig`` (bad values fail at start-up with our
  message), maps vLLM's speculative config onto ours and binds it to ``load_backend()`` (token
  limits), selects the V1 model runner, and plans cudagraph capture sizes (multiples of K+1);
* a verification hook (``vllm_sampler``) in ``vllm.v1.sample.rejection_sampler``: vLLM's
  ``RejectionSampler`` keeps its logits processing, bonus-token sampling and logprobs, and our
  ``spec_backend.sampling.RejectionSampler`` replaces the verification step (the function that runs
  vLLM's triton kernels).

One more, active whatever ``additional_config`` says: when ``arctic-inference`` is not installed,
vLLM's ``method="suffix"`` drafts with our suffix drafter (``arctic_suffix``) instead of failing.

Everything that touches vLLM lives under ``spec_backend.integrations``. See docs/vllm.md.
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger("spec_backend.integrations.vllm")

#: vLLM releases this plugin is written against: [low, high). Keep in step with pyproject's extra.
SUPPORTED_VLLM = ("0.32.0", "0.34")

_registered = False


class UnsupportedVllmVersionError(RuntimeError):
    """The installed vLLM is outside ``SUPPORTED_VLLM``."""


def is_registered() -> bool:
    return _registered


def check_vllm_version(version: str) -> None:
    """Raise ``UnsupportedVllmVersionError`` unless ``version`` lies in ``SUPPORTED_VLLM``."""
    from packaging.version import InvalidVersion, Version

    low, high = SUPPORTED_VLLM
    try:
        # Compare the release part only: 0.33.1.dev5+g1234 and 0.32.0+cu130 count as 0.33.1 / 0.32.0.
        release = Version(Version(version).base_version)
    except InvalidVersion:
        raise UnsupportedVllmVersionError(
            f"spec_backend vLLM plugin: cannot parse the installed vLLM version {version!r}; "
            f"supported: vllm>={low},<{high}"
        ) from None
    if not Version(low) <= release < Version(high):
        raise UnsupportedVllmVersionError(
            f"spec_backend vLLM plugin: vLLM {version} is not supported (supported: vllm>={low},<{high}); "
            f"install a supported vLLM (pip install 'spec-backend[vllm]') or uninstall spec-backend "
            "from this environment to run vLLM without it"
        )


def register() -> None:
    """Idempotent plugin hook; a no-op without vLLM. Raises for an unsupported vLLM version."""
    global _registered
    if _registered:
        return
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # origin None: a bare "vllm" folder on sys.path, not vLLM
        logger.debug("spec_backend vLLM plugin: vLLM is not installed; nothing to register")
        _registered = True
        return
    import vllm

    check_vllm_version(str(getattr(vllm, "__version__", "unknown")))
    from spec_backend.integrations import arctic_suffix, vllm_config_hook, vllm_sampler

    vllm_config_hook.install()
    vllm_sampler.install()
    arctic_suffix.install()
    _registered = True
    logger.debug("spec_backend vLLM plugin registered (active only with rejection_sampler_config)")


__all__ = ["SUPPORTED_VLLM", "UnsupportedVllmVersionError", "check_vllm_version", "is_registered", "register"]
