# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""The gated MLP (SwiGLU) as two GEMMs and one triton kernel: ``CudaBackend(fused_kernels=True)``.

transformers' Llama-family MLP, ``down(silu(gate(x)) * up(x))``, is five kernels on a GPU: two GEMMs over
the same rows, the SiLU, the product, and the down GEMM. Here the gate and up weights are one matrix
(``[2I, H]``, gate rows first: one GEMM reads both), one kernel computes ``silu(g) * u`` from its two
halves, then the module's own ``down_proj`` runs. The kernel rounds as torch does: the SiLU in float32
rounded to the input dtype, then the product in float32 rounded once. The merged GEMM may sum in another
order than two separate ones (a GEMM library picks its tiles by shape), so values may differ from
transformers' in the last bit.

Glossary: *I* — the MLP's intermediate size; *H* — the hidden size.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from spec_backend_cuda.fused_norm import NORM_DTYPES, check_input, replace_modules

try:
    import triton
    import triton.language as tl
except ImportError:  # CudaBackend(fused_kernels=True) then refuses at prepare_model
    triton = None

logger = logging.getLogger("spec_backend.backends")

#: transformers classes whose forward is exactly ``LlamaMLP``'s (checked against its source in
#: ``test_cuda_fused_kernels.py`` for the installed release)
FUSABLE_MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "Qwen3MoeMLP"})


class FusedGatedMLP(torch.nn.Module):
    """``down(silu(gate(x)) * up(x))`` with the gate and up projections as one ``[2I, H]`` linear layer
    and the gating as one triton launch; ``down_proj`` is the replaced module's own."""

    def __init__(self, gate: torch.nn.Linear, up: torch.nn.Linear, down: torch.nn.Module) -> None:
        super().__init__()
        self.intermediate_size = gate.out_features
        with torch.no_grad():  # the concatenation is the parameter: no second copy, no initialisation
            self.gate_up_weight = torch.nn.Parameter(torch.cat([gate.weight, up.weight], 0), False)  # [2I, H]
            self.gate_up_bias = (
                torch.nn.Parameter(torch.cat([gate.bias, up.bias], 0), False)  # [2I]
                if gate.bias is not None and up.bias is not None
                else None
            )
        self.down_proj = down

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        gate_up = torch.nn.functional.linear(x, self.gate_up_weight, self.gate_up_bias)  # [..., 2I]
        return self.down_proj(silu_and_mul(gate_up, self.intermediate_size))  # type: ignore[no-any-return]


def silu_and_mul(gate_up: torch.Tensor, width: int) -> torch.Tensor:  # [..., 2I] -> [..., I]
    """``silu(gate_up[..., :I]) * gate_up[..., I:]``, rounded as torch rounds the two ops."""
    check_input(gate_up, "silu_and_mul")
    rows = gate_up.reshape(-1, 2 * width)  # [N, 2I]
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], width), dtype=gate_up.dtype, device=gate_up.device)  # [N, I]
    if rows.shape[0]:
        block = min(1024, max(16, int(triton.next_power_of_2(width))))
        grid = (rows.shape[0], triton.cdiv(width, block))
        _silu_and_mul_kernel[grid](rows, out, width, rows.stride(0), out.stride(0), BLOCK=block)
    return out.view(*gate_up.shape[:-1], width)


def fusable_mlp(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a gated MLP this computes as its own forward does: one of ``FUSABLE_MLPS``
    with SiLU gating, three plain ``nn.Linear`` projections of one supported dtype, and no hooks."""
    projections = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if type(module).__name__ not in FUSABLE_MLPS or not all(type(p) is torch.nn.Linear for p in projections):
        return False
    gate, up = projections[0], projections[1]
    assert isinstance(gate, torch.nn.Linear) and isinstance(up, torch.nn.Linear)
    act: Any = getattr(module, "act_fn", None)
    return (
        type(act).__name__ in ("SiLUActivation", "SiLU")
        and gate.weight.dtype in NORM_DTYPES
        and gate.weight.dtype == up.weight.dtype
        and (gate.bias is None) == (up.bias is None)
        and not any(m._forward_hooks or m._forward_pre_hooks for m in (module, gate, up))
    )


def install_fused_mlps(model: torch.nn.Module) -> int:
    """Replace every fusable gated MLP of ``model`` (``fusable_mlp``) by a ``FusedGatedMLP``; the number
    replaced. ``replace_modules`` builds one at a time, so each replaced module's gate and up weights are
    freed before the next merge (at most one layer's merged matrix is extra at any time), and an MLP
    shared by several parents gets one replacement, still shared."""
    count = replace_modules(model, fusable_mlp, _merged)
    if count:
        logger.info("spec_backend: %d gated MLPs: gate/up merged, one gating kernel", count)
    return count


def _merged(mlp: Any) -> FusedGatedMLP:
    return FusedGatedMLP(mlp.gate_proj, mlp.up_proj, mlp.down_proj)


if triton is not None:

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, width, sx, so, BLOCK: tl.constexpr):
        row = tl.cast(tl.program_id(0), tl.int64)  # 64-bit offsets: N * 2I may pass 2^31
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        live = cols < width
        gate = tl.load(x_ptr + row * sx + cols, mask=live, other=0.0)
        up = tl.load(x_ptr + row * sx + width + cols, mask=live, other=0.0).to(tl.float32)
        g32 = gate.to(tl.float32)
        silu = (g32 / (1.0 + tl.exp(-g32))).to(gate.dtype).to(tl.float32)  # F.silu, in the input dtype
        tl.store(out_ptr + row * so + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=live)


__all__ = ["FUSABLE_MLPS", "FusedGatedMLP", "fusable_mlp", "install_fused_mlps", "silu_and_mul"]
