# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
"""RMSNorm as one triton kernel: ``CudaBackend(fused_kernels=True)`` swaps it in at ``prepare_model``.

transformers' Llama-family RMSNorm (``LlamaRMSNorm`` and the classes with its exact forward) is eight
small kernels on a GPU — a cast to float32, the square, the mean, the epsilon, the reciprocal square
root, the product, the cast back and the weight's product — and a plain decode step replays about 2 x
layers + 1 of them: on a 30-layer model some 480 kernels of a few microseconds each, a large part of a
graph step whose GEMMs take a quarter of its device time (docs/benchmarks.md, fifth CUDA round). The
kernel reads each row once and computes the same formula in the same order:
``weight * (x32 * rsqrt(mean(x32²) + eps)).to(x.dtype)``, the product in float32 rounded once to the
promoted dtype, as torch's elementwise product does. The mean's summation order differs (a blocked sum)
and the reciprocal square root is ``1 / sqrt_rn`` (torch's CUDA kernel uses an approximate ``rsqrtf``), so
the normalised row, rounded to the input dtype, may differ from transformers' by one unit in its last
place — a float32 weight then carries that unit (about 0.4 % of a bfloat16 value) into its float32 output.
Tests compare float32 and float16 on CPU; bfloat16 only on a GPU: the triton interpreter converts float32
to bfloat16 by truncation, not by rounding to nearest as a GPU does.

Glossary: *row* — one vector normalised over the hidden size (``[..., H]`` flattened to ``[N, H]``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import cast

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CudaBackend(fused_kernels=True) then refuses at prepare_model
    triton = None

logger = logging.getLogger("spec_backend.backends")

#: transformers classes whose forward is exactly ``LlamaRMSNorm``'s (checked against its source in
#: ``test_cuda_fused_kernels.py`` for the installed release)
FUSABLE_NORMS = frozenset(
    {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "Phi3RMSNorm"}
)
#: dtypes the kernel reads and writes
NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: the widest hidden size one program holds in registers
MAX_HIDDEN = 16384


class FusedRMSNorm(torch.nn.Module):
    """An RMSNorm computed by one triton launch; holds the replaced module's own ``weight`` parameter."""

    def __init__(self, weight: torch.nn.Parameter, eps: float) -> None:
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)


def check_input(tensor: torch.Tensor, what: str) -> None:
    """``ValueError`` unless ``tensor`` is of a dtype the kernels take (``NORM_DTYPES``) and on CUDA (or
    the triton interpreter runs the kernels)."""
    if tensor.dtype not in NORM_DTYPES:
        raise ValueError(f"{what} takes {[str(d) for d in NORM_DTYPES]} inputs, got {tensor.dtype}")
    if tensor.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"{what} runs on CUDA (or anywhere under TRITON_INTERPRET=1), "
            f"got a tensor on {tensor.device.type}"
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # [..., H] -> [..., H]
    check_input(x, "rms_norm")
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(
            f"rms_norm: rows of {hidden} values need a weight of shape ({hidden},), got {tuple(weight.shape)}"
        )
    rows = x.reshape(-1, hidden)  # [N, H]
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if rows.shape[0]:
        block = max(16, int(triton.next_power_of_2(hidden)))
        grid = (min(rows.shape[0], 1024),)  # persistent: program p takes rows p, p + grid, ...
        _rms_norm_kernel[grid](
            rows, weight, out, rows.shape[0], hidden, rows.stride(0), out.stride(0), float(eps),
            BLOCK=block, num_warps=min(16, max(1, block // 512)),
        )  # fmt: skip
    return out.view(x.shape)


def fusable(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an RMSNorm this kernel computes exactly as its own forward does: one of
    ``FUSABLE_NORMS``, a 1-D weight of a supported dtype and width, a float epsilon, and no hooks."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ in FUSABLE_NORMS
        and isinstance(weight, torch.nn.Parameter)
        and weight.dim() == 1
        and weight.dtype in NORM_DTYPES
        and weight.shape[0] <= MAX_HIDDEN
        and isinstance(getattr(module, "variance_epsilon", None), float)
        and not (module._forward_hooks or module._forward_pre_hooks)
    )


def replace_modules(
    model: torch.nn.Module,
    fusable: Callable[[torch.nn.Module], bool],
    build: Callable[[torch.nn.Module], torch.nn.Module],
) -> int:
    """Replace every submodule of ``model`` for which ``fusable`` holds by ``build(module)``; the number
    replaced. One at a time, so that a replaced module (and what only it holds) is freed before the next
    is built; a module shared by several parents gets one replacement, still shared."""
    if triton is None:
        raise ValueError("CudaBackend(fused_kernels=True) needs triton (pip install spec-backend-cuda)")
    places = [(p, name, id(c)) for p in model.modules() for name, c in p.named_children() if fusable(c)]
    built: dict[int, torch.nn.Module] = {}
    for parent, name, key in places:
        if key not in built:
            built[key] = build(getattr(parent, name))
        setattr(parent, name, built[key])
    return len(built)


def install_fused_norms(model: torch.nn.Module) -> int:
    """Replace every fusable RMSNorm of ``model`` (``fusable``) by a ``FusedRMSNorm`` sharing its weight;
    the number replaced."""
    count = replace_modules(
        model,
        fusable,
        lambda norm: FusedRMSNorm(cast(torch.nn.Parameter, norm.weight), cast(float, norm.variance_epsilon)),
    )
    if count:
        logger.info("spec_backend: %d RMSNorm modules computed by one triton kernel each", count)
    return count


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, rows, hidden, sx, so, eps, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        live = cols < hidden
        weight = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)  # [H]
        for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
            at = tl.cast(row, tl.int64)  # 64-bit offsets: N * H may pass 2^31
            x = tl.load(x_ptr + at * sx + cols, mask=live, other=0.0)  # [H], the input dtype
            x32 = x.to(tl.float32)
            variance = tl.sum(x32 * x32, 0) / hidden
            normed = (x32 * (1.0 / tl.sqrt_rn(variance + eps))).to(x.dtype)  # .to(input_dtype)
            tl.store(
                out_ptr + at * so + cols,
                (weight * normed.to(tl.float32)).to(out_ptr.dtype.element_ty),
                mask=live,
            )


__all__ = [
    "FUSABLE_NORMS",
    "FusedRMSNorm",
    "check_input",
    "fusable",
    "install_fused_norms",
    "replace_modules",
    "rms_norm",
]
