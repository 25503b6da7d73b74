"""One batched target forward over ragged per-request query tokens, on the ragged KV cache."""

from __future__ import annotations

from typing import Any

import torch

from spec_backend.engine.kv_cache import RaggedKVCache


def num_decoder_layers(config: Any) -> int:
    """Decoder layers of a transformers config (text sub-config for multimodal wrappers)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.num_hidden_layers)


class ModelRunner:
    """Owns the target model and its ``RaggedKVCache``; runs prefill and verification forwards.

    ``forward(start, tokens, last_only)``: request ``b`` (cache slot ``start+b``) feeds ``tokens[b]``;
    returns float32 logits ``[R, V]`` where ``R = B`` when ``last_only`` (each request's last position,
    used for prefill) and ``R = sum(len(tokens[b]))`` otherwise (every position, request-major: the
    sampler's layout of K target rows then the bonus row per request).
    """

    def __init__(self, model: Any, max_model_len: int, max_num_seqs: int, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.cache = RaggedKVCache(
            num_decoder_layers(model.config), max_model_len, initial_slots=max_num_seqs
        )
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])

    @torch.inference_mode()
    def forward(self, start: int, tokens: list[list[int]], last_only: bool) -> torch.Tensor:
        """See the class docstring. On failure the cache lengths are restored before re-raising."""
        query_lens = [len(t) for t in tokens]
        batch, q_max = len(tokens), max(query_lens)
        saved = list(self.cache.lengths)
        try:
            meta, position_ids = self.cache.begin_step(start, query_lens, self.device)  # [B, Q]
            input_ids = torch.zeros((batch, q_max), dtype=torch.long)  # [B, Q], padded with token 0
            for b, seq in enumerate(tokens):
                input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            q_idx = torch.arange(q_max)  # [Q]
            if last_only:
                keep = q_idx[None, :] == (meta.query_lens.cpu() - 1)[:, None]  # [B, Q]
            else:
                keep = q_idx[None, :] < meta.query_lens.cpu()[:, None]  # [B, Q]
            keep = keep.to(self.device)
            out = self.model(
                input_ids=input_ids.to(self.device),
                position_ids=position_ids,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=keep,
                spec_attn_metadata=meta,
            )
            logits: torch.Tensor = out.logits
            if logits.ndim == 3:  # a model that ignores boolean logits_to_keep: select rows here
                logits = logits[keep] if logits.shape[1] == q_max else logits.reshape(-1, logits.shape[-1])
            return logits if logits.dtype == torch.float64 else logits.float()  # [R, V]
        except BaseException:
            self.cache.lengths[: len(saved)] = saved
            raise
        finally:
            self.cache.end_step()
