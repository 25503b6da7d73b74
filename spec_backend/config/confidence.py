"""``confidence_verification`` and ``confidence_threshold``: how many of its drafts a request sends to
verification when the drafter has a confidence head (DSpark; ``spec_backend.engine.confidence``).

* ``"throughput"`` (the default for such drafters): the paper's hardware-aware prefix scheduler — every
  request's drafts are ranked by their survival (the product of their confidences), and drafts are
  admitted in that order while the expected tokens per second of the step, measured on this machine,
  still grow; a request may verify no draft at all;
* ``"threshold"``: DeepSpec's rule — a request verifies its drafts up to, not including, the first whose
  own confidence is below ``confidence_threshold`` (``0``: every draft);
* ``"off"``: every draft within the request's budget.

Each rule decides whether draft ``k`` is verified from confidences that depend only on the drafts before
it, so verification stays lossless. Other methods have no confidence head: the options are refused.
"""

from __future__ import annotations

from typing import Any


def resolve_confidence_fields(config: Any) -> None:
    """Check the two fields against each other and the method; ``confidence_threshold`` alone selects
    ``"threshold"``."""
    mode, threshold = config.confidence_verification, config.confidence_threshold
    if threshold is not None and mode is None:
        mode = config.confidence_verification = "threshold"
    if mode is not None and config.method != "dspark":
        raise ValueError(
            f"confidence_verification={mode!r} needs a drafter with a confidence head (method='dspark'), "
            f"got method={config.method!r}"
        )
    if mode == "threshold" and threshold is None:
        raise ValueError("confidence_verification='threshold' needs confidence_threshold (in [0, 1])")
    if threshold is not None and mode != "threshold":
        raise ValueError(
            f"confidence_threshold={threshold!r} acts only with confidence_verification='threshold', "
            f"got confidence_verification={mode!r}"
        )


__all__ = ["resolve_confidence_fields"]
