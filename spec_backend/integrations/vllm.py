"""vLLM plugin entry point (``vllm.general_plugins``).

``register()`` is called by vLLM in every process it starts. It must be idempotent and harmless when
vLLM is absent. The rejection-sampler replacement lands with the vLLM integration work; until then
``register()`` only records that it ran.
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger(__name__)

_registered = False


def is_registered() -> bool:
    return _registered


def register() -> None:
    """Idempotent plugin hook; a no-op without vLLM."""
    global _registered
    if _registered:
        return
    _registered = True
    if importlib.util.find_spec("vllm") is None:
        logger.debug("spec_backend vLLM plugin: vLLM is not installed; nothing to register")
        return
    logger.info("spec_backend vLLM plugin loaded (rejection-sampler integration not built yet)")
