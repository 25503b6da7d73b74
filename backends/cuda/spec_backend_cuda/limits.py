"""CUDA limits and tuning: the memory-based capture-size cap and the sampler kernels' tile size.

* **Token limits.** Neither flash-attn nor SDPA bounds the query tokens per request, so
  ``max_query_tokens_per_request`` is unlimited and K is bounded only by the sampler's
  ``MAX_SPEC_TOKENS`` (128).
* **Capture sizes.** CUDA graphs have no hardware count limit (unlike ACLGraph's streams); what they
  cost is memory: every captured size keeps its activations in the shared graph pool, and the pool is
  as large as the largest graph's working set. The largest capture size is therefore capped by free
  device memory at start-up: ``CAPTURE_TOKENS_PER_GIB`` tokens per free GiB, clamped to
  ``[MIN_CAPTURE_SIZE, DEFAULT_MAX_CAPTURE_SIZE]``. There is no graph budget (``graph_budget=None``).
* **Attention.** flash-attn needs compute capability ``FLASH_MIN_CAPABILITY`` (Ampere) or newer; on
  older GPUs the ``auto`` attention runs SDPA, and the probe says so.
* **Sampler tile.** The shared triton kernels run one program per logits row and stream the
  vocabulary in tiles of ``VOCAB_BLOCK`` elements (see docs/cuda.md for the reasoning; the bandwidth
  benchmark sweeps it).
"""

from __future__ import annotations

#: flash-attn 2 runs on Ampere or newer GPUs only (Dao-AILab/flash-attention README, "Installation and
#: features": "FlashAttention-2 with CUDA currently supports: Ampere, Ada, or Hopper GPUs"); older GPUs
#: take the SDPA path.
FLASH_MIN_CAPABILITY = (8, 0)
#: Largest capture size when device memory is unknown (vLLM's default ceiling as well).
DEFAULT_MAX_CAPTURE_SIZE = 512
#: Smallest cap the memory rule may produce (one batch of K+1 = 16 tokens still gets a graph).
MIN_CAPTURE_SIZE = 16
#: Tokens of capture size allowed per GiB of free device memory (graph pools grow with batch tokens).
CAPTURE_TOKENS_PER_GIB = 64
#: Vocabulary elements per triton program per loop iteration: 4096 fp32 = 16 KiB per tile, 32 values
#: (128 B) per thread at triton's default 4 warps; V = 151936 takes 38 iterations.
VOCAB_BLOCK = 4096


def memory_capped_capture_size(free_bytes: int | None) -> int:
    """Cap the largest capture size by free device memory: 64 tokens per free GiB, within [16, 512]."""
    if free_bytes is None:
        return DEFAULT_MAX_CAPTURE_SIZE
    by_memory = (free_bytes // (1 << 30)) * CAPTURE_TOKENS_PER_GIB
    return max(MIN_CAPTURE_SIZE, min(DEFAULT_MAX_CAPTURE_SIZE, by_memory))
