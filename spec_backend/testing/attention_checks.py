"""The attention tier of the conformance suite: a backend's attention function against the reference's.

``check_attention(backend)`` runs ``backend.attention_function()`` on random ragged batches shaped like
the engine's steps (decode: 1 query token per request; verify: K+1; prefill: longer prompts; 1..4
requests; caches from a few tokens to several hundred, so paged backends span several pages), full and
with a sliding window (``WINDOWED_CASES``: each row sees the last ``W`` positions up to its own), and
compares every real query row (padding rows are unspecified) with ``sdpa_ragged_attention`` computed in
float64. Inputs are rounded through float16 first, so a backend that runs the op in half precision sees
the same values. Noise floor: ``atol`` (default 1e-4: float32 arithmetic over a few hundred keys; pass
2e-3 for a backend whose op computes in float16).
"""

from __future__ import annotations

import torch

from spec_backend.backends.attention import sdpa_ragged_attention
from spec_backend.backends.base import Backend
from spec_backend.step import RaggedAttentionMetadata
from spec_backend.testing.report import CheckResult

#: (requests, query tokens per request, longest cached prefix, head dim): decode, verify, prefill
ATTENTION_CASES: tuple[tuple[int, int, int, int], ...] = (
    (1, 1, 300, 64),
    (3, 1, 40, 128),
    (1, 6, 260, 64),
    (4, 6, 150, 64),
    (2, 4, 20, 32),
    (2, 24, 140, 64),
)
#: (requests, query tokens per request, longest cached prefix, head dim, sliding window)
WINDOWED_CASES: tuple[tuple[int, int, int, int, int], ...] = (
    (3, 1, 80, 64, 16),
    (4, 6, 150, 64, 16),
    (2, 4, 20, 32, 1),
    (2, 24, 140, 64, 32),
)
HEADS, KV_HEADS = 4, 2


def _case(
    gen: torch.Generator, batch: int, q_len: int, prefix: int, dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RaggedAttentionMetadata]:
    query_lens = torch.randint(1, q_len + 1, (batch,), generator=gen)  # [B]
    kv_lens = query_lens + torch.randint(0, prefix + 1, (batch,), generator=gen)  # [B]
    length = int(kv_lens.max())

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).half().float().to(device)

    query = rand(batch, HEADS, q_len, dim)  # [B, Hq, Q, D]
    key, value = rand(batch, KV_HEADS, length, dim), rand(batch, KV_HEADS, length, dim)  # [B, Hkv, L, D]
    meta = RaggedAttentionMetadata(query_lens.to(device), kv_lens.to(device))
    return query, key, value, meta


def check_attention(
    backend: Backend, module: torch.nn.Module | None = None, atol: float = 1e-4, seed: int = 0
) -> list[CheckResult]:
    """One ``CheckResult`` per case of ``ATTENTION_CASES`` and ``WINDOWED_CASES``: the largest deviation
    of a real row from the float64 reference, against ``atol``. ``module``: what the attention function
    receives as the layer (default: a bare module)."""
    attention, device = backend.attention_function(), backend.device()
    module = module if module is not None else torch.nn.Module()
    gen = torch.Generator().manual_seed(seed)
    results = []
    cases = [(*case, None) for case in ATTENTION_CASES] + list(WINDOWED_CASES)
    for batch, q_len, prefix, dim, window in cases:
        name = f"attention[B={batch},Q={q_len},D={dim}{f',W={window}' if window else ''}]"
        q, k, v, meta = _case(gen, batch, q_len, prefix, dim, device)
        kwargs = {"scaling": dim**-0.5, "spec_attn_metadata": meta, "sliding_window": window}
        got, _ = attention(module, q, k, v, None, **kwargs)  # [B, Q, Hq, D]
        want, _ = sdpa_ragged_attention(module, q.double(), k.double(), v.double(), None, **kwargs)
        rows = torch.arange(q_len, device=device)[None, :] < meta.query_lens[:, None]  # [B, Q] real rows
        error = float((got[rows].double() - want[rows]).abs().max())
        results.append(CheckResult(name, error <= atol, f"max |error| {error:.2e} (allowed {atol:.0e})"))
    return results


__all__ = ["ATTENTION_CASES", "WINDOWED_CASES", "check_attention"]
