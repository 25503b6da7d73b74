"""One batched forward of a causal LM over a ``StepBatch`` on its preallocated ragged KV cache."""

from __future__ import annotations

from typing import Any

import torch

from spec_backend.runtime.hf_compat import cache_kwargs
from spec_backend.runtime.hidden import HiddenCapture
from spec_backend.runtime.kv_cache import RaggedKVCache
from spec_backend.runtime.lean_forward import lean_forward
from spec_backend.step import HiddenStateRequest, StepBatch, TargetOutput


def boolean_logits_to_keep() -> bool:
    """Whether this transformers release takes a boolean ``[B, Q]`` ``logits_to_keep`` (its causal LMs
    slice through ``modeling_utils.slice_logits_to_keep``). Earlier 5.x releases index
    ``hidden[:, logits_to_keep, :]``, which a 2-D mask breaks ("too many indices"): the runner then asks
    for every row (``0``) and selects the kept rows itself."""
    import transformers.modeling_utils as modeling_utils

    return hasattr(modeling_utils, "slice_logits_to_keep")


def num_decoder_layers(config: Any) -> int:
    """Decoder layers of a transformers config (text sub-config for multimodal wrappers)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.num_hidden_layers)


class ModelRunner:
    """Runs a model (the target, or a draft LM) on its own ``RaggedKVCache``.

    ``forward(batch, last_only)`` returns a ``TargetOutput``: float32 logits ``[R, V]`` where ``R = B``
    when ``last_only`` (each request's last query row: prefill, drafting) and ``R = N`` otherwise (every
    query row, request-major: the sampler's layout of K target rows then the bonus row per request),
    plus the hidden states ``hidden`` declares for every query row.
    """

    def __init__(self, model: Any, cache: RaggedKVCache, hidden: HiddenStateRequest | None = None) -> None:
        self.model = model
        self.cache = cache
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.mask_logits = boolean_logits_to_keep()
        self.lean = lean_forward(model, self.mask_logits)  # None: transformers' forward (lean_forward.py)
        request = hidden if hidden is not None else HiddenStateRequest()
        layers = num_decoder_layers(model.config)
        self.capture = HiddenCapture(model, request, layers) if request.any else None

    @torch.inference_mode()
    def forward(self, batch: StepBatch, last_only: bool) -> TargetOutput:
        """See the class docstring. On failure the cache lengths are restored before re-raising."""
        saved = list(self.cache.lengths)
        try:
            self.cache.begin_step(batch)
            shape, device = (batch.batch_size, batch.max_query_len), batch.input_ids.device
            if not last_only and batch.unpadded:  # every query row's logits
                keep = torch.ones(shape, dtype=torch.bool, device=device)  # [B, Q]
            else:
                keep = torch.zeros(shape, dtype=torch.bool, device=device)  # [B, Q]
                if last_only:
                    keep[torch.arange(batch.batch_size, device=device), batch.query_lens - 1] = True
                else:
                    keep[batch.rows, batch.cols] = True
            ids, positions = batch.padded(batch.input_ids), batch.padded_positions()  # [B, Q], [B, Q]
            if self.lean is not None and not self.lean.hooked():  # the same calls without the wrappers
                logits = self.lean(ids, positions, self.cache, keep, spec_attn_metadata=batch.attention)
            else:
                logits = self.model(
                    input_ids=ids,
                    position_ids=positions,
                    **cache_kwargs(self.model, self.cache),
                    use_cache=True,
                    logits_to_keep=keep if self.mask_logits else 0,
                    spec_attn_metadata=batch.attention,
                ).logits
            if logits.ndim == 3:  # a model that ignores boolean logits_to_keep: select rows here
                q_max = batch.max_query_len
                logits = logits[keep] if logits.shape[1] == q_max else logits.reshape(-1, logits.shape[-1])
            logits = logits if logits.dtype == torch.float64 else logits.float()  # [R, V]
            final, aux = self.capture.collect(batch) if self.capture is not None else (None, None)
            return TargetOutput(logits=logits, final=final, aux=aux)
        except BaseException:
            self.cache.lengths[: len(saved)] = saved
            raise
        finally:
            self.cache.end_step()
