"""``TritonSamplerOps``: the shared triton sampler kernels behind the ``SamplerOps`` protocol.

One implementation for CUDA and Ascend; the backend's ``SamplerTuning`` supplies the vocabulary tile
(``vocab_block``, a constexpr of every vocabulary loop), the grid cap (``max_grid``: every kernel is
persistent-style, so a capped grid loops over rows and gives identical results) and ``device_uniforms``.

Per op (kernels in ``triton.greedy``, ``triton.rng``, ``triton.softmax`` and ``triton.verify``; the
row-wide softmax and residual sampling launched by ``triton.rows``, with rows split over programs by
``triton.split``):

=====================  ===================================================================================
op                     implementation
=====================  ===================================================================================
``argmax``             triton (vocab-blocked row argmax)
``greedy_verify``      triton scan (plus ``greedy_sample``: argmax fused with the scan, see below)
``target_probs``       triton temperature softmax; **torch** when any row applies top-k / top-p (sort)
``entropy_thresholds`` **torch** reference (one reduction per row; not on the verify path's critical data)
``uniforms``           triton hash when ``device_uniforms``; else the **torch** rng (no float64 drawn on
                       the device by triton)
``standard_verify``    triton scan               ``cumulative_verify``  triton scan
``block_verify``       triton scan with the residual-mass vocabulary pass fused
``synthetic_verify``   triton                    ``sample_residual``    triton, noise hashed in registers
``tree_verify``        triton walk, one program per request (``triton.tree``)
``fused_verify``       ``ops.FusedVerifyOps``: the whole verification in four launches without the [N, V]
                       probabilities (``triton.fused``), when ``SamplerTuning.fused_verify``
=====================  ===================================================================================

Float64: with ``device_uniforms=False`` (Ascend) no triton kernel touches float64: the float64 protocol
inputs (uniforms, thresholds, block weights, synthetic rates) are cast to float32 by torch before the
launch and the float32 results cast back, so the scans are exact up to float32 rounding at ties (see
``triton.verify``). With ``device_uniforms=True`` they run in float64 and match the reference
bit for bit; the only non-bit-exact parts are blocked float32 sums (softmax normaliser, block residual
mass) and ``log`` in the exponential race, whose last bit may differ from torch's.

Nothing here synchronises with the host: grid sizes come from tensor shapes, never from values.
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from spec_backend.sampling import probs as _probs
from spec_backend.sampling import rng
from spec_backend.sampling.gbv_ops import TorchGbvOps
from spec_backend.sampling.triton import greedy as _kg
from spec_backend.sampling.triton import rng as _kr
from spec_backend.sampling.triton import rows as _rowops
from spec_backend.sampling.triton import verify as _kv
from spec_backend.sampling.triton.tree import TritonTreeOps
from spec_backend.sampling.tuning import SamplerTuning

_ELEMENTWISE_BLOCK = 256


_rows = _rowops.rows


class TritonSamplerOps(TritonTreeOps, TorchGbvOps):  # GBV: the torch op (``sampling.gbv_ops``)
    """``SamplerOps`` on triton kernels tuned by ``SamplerTuning`` (see the module docstring)."""

    name = "triton"

    def __init__(self, tuning: SamplerTuning | None = None) -> None:
        self.tuning = tuning if tuning is not None else SamplerTuning()
        block = self.tuning.vocab_block
        if block <= 0 or block & (block - 1):
            raise ValueError(f"SamplerTuning.vocab_block must be a power of two, got {block}")
        if self.tuning.max_grid is not None and self.tuning.max_grid < 1:
            raise ValueError(f"SamplerTuning.max_grid must be >= 1 or None, got {self.tuning.max_grid}")
        self.f64 = self.tuning.device_uniforms
        self._scalar_dtype = torch.float64 if self.f64 else torch.float32

    def __repr__(self) -> str:
        return f"TritonSamplerOps({self.tuning})"

    # ------------------------------------------------------------------ helpers
    def _grid(self, work: int) -> tuple[int]:
        cap = self.tuning.max_grid
        return (max(1, min(work, cap) if cap is not None else work),)

    def _launch(self, kernel: Any, work: int, *args: Any, **meta: Any) -> None:
        kernel[self._grid(work)](*args, enable_fp_fusion=False, **meta)

    def _scalars(self, t: torch.Tensor) -> torch.Tensor:
        """Per-token float64 protocol scalars in the kernels' precision (float32 without device f64)."""
        return t.to(self._scalar_dtype).contiguous()

    # ------------------------------------------------------------------ probabilities
    def target_probs(
        self,
        logits: torch.Tensor,  # [N, V]
        temperature: torch.Tensor,  # [N]
        top_k: torch.Tensor,  # [N]
        top_p: torch.Tensor,  # [N]
        apply_top_k: bool,
        apply_top_p: bool,
        max_top_k: int | None = None,
    ) -> torch.Tensor:  # [N, V] float32
        del max_top_k  # the torch filter below has no k limit
        if apply_top_k or apply_top_p:  # needs a sort: the torch reference (same device)
            return _probs.target_probs(logits, temperature, top_k, top_p, apply_top_k, apply_top_p)
        return _rowops.softmax(self._launch, self.tuning, logits, temperature)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N] int64
        logits = _rows(logits)
        n, vocab = logits.shape
        out = torch.empty(n, dtype=torch.int64, device=logits.device)
        if n:
            self._launch(
                _kg.argmax_kernel, n, logits, logits.stride(0), out, n, vocab, BLOCK_V=self.tuning.vocab_block
            )
        return out

    def entropy_thresholds(self, logits: torch.Tensor, alpha: float, threshold: float) -> torch.Tensor:
        return _probs.entropy_thresholds(logits, alpha, threshold)  # torch reference, same device

    def uniforms(
        self, seeds: torch.Tensor, positions: torch.Tensor, counters: torch.Tensor, stream: int
    ) -> torch.Tensor:  # [M] float64
        if not self.tuning.device_uniforms:
            return rng.uniform_f64(seeds, positions, counters, stream)  # torch: no float64 in triton
        m = seeds.shape[0]
        out = torch.empty(m, dtype=torch.float64, device=seeds.device)
        if m:
            self._launch(
                _kr.uniforms_kernel,
                triton.cdiv(m, _ELEMENTWISE_BLOCK),
                seeds.contiguous(),
                positions.contiguous(),
                counters.contiguous(),
                out,
                m,
                STREAM=stream,
                BLOCK=_ELEMENTWISE_BLOCK,
            )
        return out

    # ------------------------------------------------------------------ verification
    def greedy_verify(
        self,
        draft_ids: torch.Tensor,  # [T]
        target_argmax: torch.Tensor,  # [T]
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
    ) -> torch.Tensor:  # [B] int64
        del max_spec_len  # the kernel loops to each request's own K_b
        batch = cu_num_draft_tokens.shape[0]
        out = torch.zeros(batch, dtype=torch.int64, device=cu_num_draft_tokens.device)
        if batch and draft_ids.numel():
            self._launch(
                _kg.greedy_verify_kernel,
                batch,
                draft_ids.contiguous(),
                target_argmax.contiguous(),
                cu_num_draft_tokens.contiguous(),
                out,
                batch,
            )
        return out

    def greedy_sample(
        self,
        logits: torch.Tensor,  # [N, V] raw logits
        draft_ids: torch.Tensor,  # [T]
        target_rows: torch.Tensor,  # [T]
        bonus_rows: torch.Tensor,  # [B]
        cu_num_draft_tokens: torch.Tensor,  # [B]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([B] int64 accepted drafts, [B] int64 emitted token)
        """Extension (not in the protocol): greedy verification fused with the argmax. Equals
        ``greedy_verify(draft_ids, argmax(logits)[target_rows], cu)`` and the argmax of the first
        rejected (or the bonus) row, reading only the rows it needs (see ``greedy_fused_kernel``)."""
        logits = _rows(logits)
        batch, vocab = cu_num_draft_tokens.shape[0], logits.shape[1]
        device = logits.device
        count = torch.zeros(batch, dtype=torch.int64, device=device)
        token = torch.zeros(batch, dtype=torch.int64, device=device)
        if batch:
            ids = draft_ids if draft_ids.numel() else bonus_rows  # dummy pointer, never read
            rows = target_rows if target_rows.numel() else bonus_rows
            self._launch(
                _kg.greedy_fused_kernel,
                batch,
                logits,
                logits.stride(0),
                ids.contiguous(),
                rows.contiguous(),
                bonus_rows.contiguous(),
                cu_num_draft_tokens.contiguous(),
                count,
                token,
                batch,
                vocab,
                BLOCK_V=self.tuning.vocab_block,
            )
        return count, token

    def _verify_args(
        self,
        draft_ids: torch.Tensor,  # [T]
        draft_probs: torch.Tensor | None,  # [T, V]
        target_probs: torch.Tensor,  # [N, V]
        target_rows: torch.Tensor,  # [T]
        uniforms: torch.Tensor,  # [T]
        thresholds: torch.Tensor | None,  # [T]
        cu_num_draft_tokens: torch.Tensor,  # [B]
    ) -> tuple[Any, ...]:
        """Leading arguments of every verify kernel; absent q / thresholds get unread stand-ins."""
        p = _rows(target_probs)
        q = _rows(draft_probs) if draft_probs is not None else p
        u = self._scalars(uniforms)
        return (
            draft_ids.contiguous(),
            q,
            q.stride(0) if draft_probs is not None else 0,
            p,
            p.stride(0),
            target_rows.contiguous(),
            u,
            self._scalars(thresholds) if thresholds is not None else u,
            cu_num_draft_tokens.contiguous(),
        )

    def _scan(
        self,
        draft_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        target_rows: torch.Tensor,
        uniforms: torch.Tensor,
        thresholds: torch.Tensor | None,
        cu_num_draft_tokens: torch.Tensor,
        cumulative: bool,
    ) -> torch.Tensor:  # [B] int64
        batch = cu_num_draft_tokens.shape[0]
        out = torch.zeros(batch, dtype=torch.int64, device=cu_num_draft_tokens.device)
        if batch == 0 or draft_ids.numel() == 0:
            return out
        self._launch(
            _kv.scan_verify_kernel,
            batch,
            *self._verify_args(
                draft_ids, draft_probs, target_probs, target_rows, uniforms, thresholds, cu_num_draft_tokens
            ),
            out,
            batch,
            HAS_Q=draft_probs is not None,
            HAS_THR=thresholds is not None,
            CUMULATIVE=cumulative,
            F64=self.f64,
        )
        return out

    def standard_verify(
        self,
        draft_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        target_rows: torch.Tensor,
        uniforms: torch.Tensor,
        thresholds: torch.Tensor | None,
        cu_num_draft_tokens: torch.Tensor,
        max_spec_len: int,
    ) -> torch.Tensor:
        del max_spec_len
        return self._scan(
            draft_ids,
            draft_probs,
            target_probs,
            target_rows,
            uniforms,
            thresholds,
            cu_num_draft_tokens,
            False,
        )

    def cumulative_verify(
        self,
        draft_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        target_rows: torch.Tensor,
        uniforms: torch.Tensor,
        thresholds: torch.Tensor | None,
        cu_num_draft_tokens: torch.Tensor,
        max_spec_len: int,
    ) -> torch.Tensor:
        del max_spec_len
        return self._scan(
            draft_ids, draft_probs, target_probs, target_rows, uniforms, thresholds, cu_num_draft_tokens, True
        )

    def block_verify(
        self,
        draft_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        target_rows: torch.Tensor,
        uniforms: torch.Tensor,
        thresholds: torch.Tensor | None,
        cu_num_draft_tokens: torch.Tensor,
        max_spec_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([B] int64 τ, [B] float64 b_τ)
        del max_spec_len
        batch = cu_num_draft_tokens.shape[0]
        device = cu_num_draft_tokens.device
        tau = torch.zeros(batch, dtype=torch.int64, device=device)
        weight = torch.ones(batch, dtype=self._scalar_dtype, device=device)
        if batch and draft_ids.numel():
            self._launch(
                _kv.block_verify_kernel,
                batch,
                *self._verify_args(
                    draft_ids,
                    draft_probs,
                    target_probs,
                    target_rows,
                    uniforms,
                    thresholds,
                    cu_num_draft_tokens,
                ),
                tau,
                weight,
                batch,
                target_probs.shape[1],
                HAS_Q=draft_probs is not None,
                HAS_THR=thresholds is not None,
                F64=self.f64,
                BLOCK_V=self.tuning.vocab_block,
            )
        return tau, weight.to(torch.float64)

    def synthetic_verify(
        self,
        uniforms: torch.Tensor,  # [B]
        rates: torch.Tensor,  # [R]
        cu_num_draft_tokens: torch.Tensor,  # [B]
        max_spec_len: int,
    ) -> torch.Tensor:  # [B] int64
        del max_spec_len
        batch = cu_num_draft_tokens.shape[0]
        out = torch.zeros(batch, dtype=torch.int64, device=cu_num_draft_tokens.device)
        if batch:
            self._launch(
                _kv.synthetic_verify_kernel,
                batch,
                self._scalars(uniforms),
                self._scalars(rates),
                cu_num_draft_tokens.contiguous(),
                out,
                batch,
            )
        return out

    # ------------------------------------------------------------------ point-mass drafts, fused
    def fuses_verify(self) -> bool:
        """``ops.FusedVerifyOps``: with the tuning's ``fused_verify`` and float64 on the device (the accept
        uniforms are drawn inside the kernel)."""
        return self.tuning.fused_verify and self.f64

    def fused_verify(
        self,
        logits: torch.Tensor,
        draft_probs: torch.Tensor | None,
        layout: tuple[torch.Tensor, ...],
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        positions: torch.Tensor,
        max_spec_len: int,
        rule: str,
        sampled: bool,
    ) -> torch.Tensor:  # [B, max_spec_len + 1] int32
        return _rowops.fused_verify(
            self._launch, self.tuning, logits, draft_probs, layout, temperature, seeds, positions,
            max_spec_len, rule, sampled,
        )  # fmt: skip

    # ------------------------------------------------------------------ recovered / bonus tokens
    def sample_residual(
        self,
        target_probs: torch.Tensor,  # [N, V]
        target_rows: torch.Tensor,  # [R]
        draft_probs: torch.Tensor | None,  # [T, V]
        draft_ids: torch.Tensor,  # [T]
        draft_rows: torch.Tensor,  # [R]
        scale: torch.Tensor,  # [R] float64
        seeds: torch.Tensor,  # [R]
        positions: torch.Tensor,  # [R]
    ) -> torch.Tensor:  # [R] int64
        return _rowops.residual(
            self._launch, self.tuning, target_probs, target_rows, draft_probs, draft_ids, draft_rows,
            scale, seeds, positions,
        )  # fmt: skip


__all__ = ["TritonSamplerOps"]
