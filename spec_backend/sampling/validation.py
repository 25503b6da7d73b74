"""Input checks of the rejection sampler: clear errors naming the tensor and the offending value.

Cost model: shape, dtype and length checks read only tensor metadata and host-side Python values, so
they are free and always on. Value checks that need the data (NaN/inf in logits, draft ids outside
[0, V) when the metadata does not know them on the host) read the tensors back to the host: one pass
over [T+B, V] plus a device synchronisation per call. They run only with ``debug=True``.
Per-request sampling values (temperature, top_k, top_p) are checked when ``SamplingMetadata`` is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from spec_backend.sampling.errors import SamplerInputError
from spec_backend.sampling.tuning import MAX_SPEC_TOKENS

if TYPE_CHECKING:
    from spec_backend.sampling.metadata import SpecDecodeMetadata
    from spec_backend.sampling.sampling_metadata import SamplingMetadata


def check_inputs(
    metadata: SpecDecodeMetadata,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling: SamplingMetadata,
    max_spec_tokens: int,
    backend_name: str,
) -> None:
    """Free checks (metadata only, no device sync)."""
    batch, total = metadata.batch_size, metadata.num_tokens
    if logits.dim() != 2:
        raise SamplerInputError(f"logits must be 2-D [T+B, V], got shape {list(logits.shape)}")
    if logits.shape[0] != total + batch:
        raise SamplerInputError(
            f"logits has {logits.shape[0]} rows (shape {list(logits.shape)}), expected T+B={total + batch} "
            f"(T={total} draft tokens, B={batch} requests)"
        )
    if not logits.is_floating_point():
        raise SamplerInputError(f"logits must be a floating tensor, got dtype {logits.dtype}")
    vocab = logits.shape[1]
    if vocab == 0:
        raise SamplerInputError("logits has an empty vocabulary dimension (V=0)")
    if draft_probs is not None and tuple(draft_probs.shape) != (total, vocab):
        raise SamplerInputError(
            f"draft_probs has shape {list(draft_probs.shape)}, expected [T, V]=[{total}, {vocab}]"
        )
    if sampling.batch_size != batch:
        raise SamplerInputError(
            f"SamplingMetadata has B={sampling.batch_size} requests but SpecDecodeMetadata has B={batch}"
        )
    limit = min(max_spec_tokens, MAX_SPEC_TOKENS)
    if metadata.max_spec_len > limit:
        worst = max(range(batch), key=lambda b: metadata.num_draft_tokens[b])
        raise SamplerInputError(
            f"request {worst} has K={metadata.max_spec_len} draft tokens (num_draft_tokens), above the "
            f"limit of {limit} speculative tokens per request on backend {backend_name!r}"
        )
    top = metadata.max_draft_token_id
    if top is not None and top >= vocab:
        raise SamplerInputError(f"draft_token_ids contains id {top}, outside the vocabulary [0, V={vocab})")


def check_values(
    metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None, logits: torch.Tensor
) -> None:
    """Debug checks that read the data back to the host (one pass over the logits and a sync).

    Logits may hold ``-inf`` (masked tokens) but no NaN and no ``+inf``, and every row needs a finite
    entry; draft ids lie in [0, V) or are ``PLACEHOLDER_TOKEN_ID`` (-1); ``draft_probs`` are finite and
    non-negative.
    """
    vocab = logits.shape[1]
    for what, row_has in (
        ("NaN", torch.isnan(logits).any(dim=1)),
        ("+inf", torch.isposinf(logits).any(dim=1)),
        ("no finite entry", ~torch.isfinite(logits).any(dim=1)),
    ):
        bad_rows = torch.nonzero(row_has).flatten().tolist()
        if bad_rows:
            verb = "has" if what == "no finite entry" else "contains"
            raise SamplerInputError(f"logits {verb} {what} in row(s) {bad_rows[:8]}")
    if metadata.draft_token_ids.numel():
        lo, hi = (int(v.item()) for v in torch.aminmax(metadata.draft_token_ids))
        if lo < -1 or hi >= vocab:
            bad = lo if lo < -1 else hi
            raise SamplerInputError(
                f"draft_token_ids contains id {bad}, outside the vocabulary [0, V={vocab}) "
                "(-1 is the placeholder)"
            )
    if draft_probs is not None and bool((~torch.isfinite(draft_probs) | (draft_probs < 0)).any()):
        raise SamplerInputError("draft_probs contains NaN, infinite or negative values")


__all__ = ["SamplerInputError", "check_inputs", "check_values"]
