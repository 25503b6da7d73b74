"""Which way a model's Q4_1 (or int4-quantized) layers run on this machine, chosen by measurement at load.

Glossary:

* **path** — ``native``: int4 products on our Q4_1 × int8 kernel of the selected ISA variant
  (``int4_linear``, ``isa``), and each supported decoder layer as one native call (``native_layer``);
  ``int4-bf16``: int4 products on torch's kernel with bfloat16 activations under transformers' layers;
  ``float32``: the de-quantized weights as loaded (the reference backend's numerics). The packed paths are
  lossy against float32 (``int4_linear``); both keep the engine's guarantee, speculative greedy output
  equal to plain greedy output, because their rows never depend on the batch (fixed-order products and
  the row attention kernel, ``attention``); float32 keeps it as the reference does.
* **measurement** — on the model's first decoder layer that holds Q4_1 weights (its real shapes), each
  candidate path is built (packed copies; float weights shared, not copied) and timed on a decode step
  (1 row) and a verify step (K+1 rows, ``ModelOptions.speculative_tokens``, 4 when unknown): the best of
  ``REPEATS`` calls after a warm-up, the candidates interleaved so that load changes on the machine hit
  them alike. Attention sees only the step's rows (no cache): what differs between paths is the products
  and the per-layer overhead. A few ms per candidate on SmolLM2's layers.
* **rule** — a packed path is eligible only if it is faster than float32 on both steps (it is lossy, so it
  is never picked for a speed it does not deliver); the eligible path with the lowest decode + verify time
  wins, float32 when none is. With ``quantization="int4"`` the user asked for packed weights: float32 is
  no candidate.
* **override** — ``SPEC_BACKEND_CPU_PATH=native|int4-bf16|float32`` pins the path (benchmarks, tests, a
  machine whose measurement you distrust); unset or ``measure`` measures.

The choice is logged with every time measured. It is made once per process for a layer shape (later
loads reuse it, so two engines on one model run the same path and give the same tokens); separate
processes measure anew, and where two paths are within noise of each other (or the machine is
overloaded) they can choose differently, which is what the override is for.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from spec_backend.cpu.attention import mark_batch_invariant
from spec_backend.cpu.gguf_blocks import Decoded
from spec_backend.cpu.int4_linear import install_int4_linears, recover_q4_1
from spec_backend.cpu.kquant_linear import install_k8_linears
from spec_backend.cpu.native import active_variant, native_op
from spec_backend.cpu.native_layer import NATIVE_LAYERS_ENV, native_class, supported
from spec_backend.cpu.vocab_projection import install_small_batch_linears
from spec_backend.step import RaggedAttentionMetadata

logger = logging.getLogger("spec_backend.backends")

PATH_ENV = "SPEC_BACKEND_CPU_PATH"
#: every path, in the order they are reported
PATHS = ("native", "int4-bf16", "float32")
#: timed calls per candidate and step shape, after one warm-up
REPEATS = 5
#: draft tokens per verify step when the model's speculative config is not known
DEFAULT_SPECULATIVE_TOKENS = 4


@dataclass(frozen=True)
class Decision:
    """The path a model runs, why, and the times measured: path -> (decode s, verify s) per layer."""

    path: str
    reason: str
    times: dict[str, tuple[float, float]] = field(default_factory=dict)
    verify_rows: int = 0


def pinned_path() -> str | None:
    """The path ``SPEC_BACKEND_CPU_PATH`` pins, ``None`` to measure; anything else is refused by name."""
    value = os.environ.get(PATH_ENV, "").strip()
    if value in ("", "measure"):
        return None
    if value not in PATHS:
        raise ValueError(f"{PATH_ENV} must be one of measure, {', '.join(PATHS)}; got {value!r}")
    return value


def candidate_paths(quantize: bool) -> list[str]:
    """The paths this machine can run: native where the native Q4_1 kernel loads, float32 unless the user
    asked for int4 weights (module glossary)."""
    paths = ["native"] if native_op("q4_1_q8_mm") is not None else []
    return [*paths, "int4-bf16", *([] if quantize else ["float32"])]


def choose(times: dict[str, tuple[float, float]]) -> tuple[str, str]:
    """The rule (module glossary) on measured ``times``: the path and why."""
    base = times.get("float32")
    eligible = [
        p for p, t in times.items() if base is None or p == "float32" or (t[0] < base[0] and t[1] < base[1])
    ]
    slow = [p for p in times if p not in eligible]
    best = min(eligible, key=lambda p: sum(times[p]))
    if best == "float32" and slow:
        return best, "no packed path is faster than float32 on both steps"
    reason = f"the fastest of {', '.join(eligible)}" if len(eligible) > 1 else "the only candidate"
    if slow:
        verb = "is" if len(slow) == 1 else "are"
        reason += f"; {' and '.join(slow)} {verb} not faster than float32 on both steps"
    return best, reason


def path_kernel(path: str) -> str | None:
    """``Int4Linear``'s kernel for a packed path: ours wherever it applies (16 | N) on the native path,
    torch's elsewhere."""
    return None if path == "native" else "torch"


def _first_linear(layer: nn.Module) -> nn.Linear | None:
    return next((m for m in layer.modules() if type(m) is nn.Linear), None)


def sample_layer(
    model: nn.Module, quantize: bool, blocks: dict[int, Decoded] | None = None
) -> tuple[nn.Module, nn.Module] | None:
    """The first plain decoder layer (children: attention, MLP and norms) whose first linear layer is Q4_1
    or has GGUF ``blocks`` (any, with ``quantize``), and the model's rotary embedding; ``None`` without
    both."""
    rotary = next((m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")), None)
    if rotary is None:
        return None
    for module in model.modules():
        names = set(dict(module.named_children()))
        if not type(module).__name__.endswith("DecoderLayer") or not {"self_attn", "mlp"} <= names:
            continue
        if any(n not in ("self_attn", "mlp") and not n.endswith("layernorm") for n in names):
            continue  # e.g. EAGLE-3's first layer, which reads two inputs
        first = _first_linear(module)
        if first is not None and (
            quantize or id(first.weight) in (blocks or {}) or recover_q4_1(first.weight) is not None
        ):
            return module, rotary
    return None


def build(layer: nn.Module, path: str, quantize: bool, blocks: dict[int, Decoded] | None = None) -> nn.Module:
    """``layer`` as ``path`` runs it: a copy sharing its float weights, packed as ``prepare_model`` packs
    (``pack``)."""
    tensors = [*layer.parameters(), *layer.buffers()]
    clone: nn.Module = copy.deepcopy(layer, {id(t): t for t in tensors})
    if path == "float32":
        install_small_batch_linears(clone)
        return clone
    pack(clone, path, quantize, blocks)
    if path == "native" and os.environ.get(NATIVE_LAYERS_ENV, "1") != "0" and supported(clone):
        clone = native_class(type(layer))(clone)
    mark_batch_invariant(clone)
    return clone


def pack(model: nn.Module, path: str, quantize: bool, blocks: dict[int, Decoded] | None) -> int:
    """``model``'s linear layers packed for a packed ``path``: Q4_1, Q4_K and Q4_0 ones as int4 on the
    path's kernel, and on the native path the other GGUF ``blocks`` (Q5_K, Q6_K, Q8_0, Q5_0, Q5_1) on the
    k8 kernel (``kquant_linear``); returns how many were replaced."""
    packed = install_int4_linears(model, quantize=quantize, kernel=path_kernel(path), blocks=blocks)
    if path == "native" and blocks:
        packed += install_k8_linears(model, blocks)
    return packed


def _step(layer: nn.Module, rotary: nn.Module, hidden: int, rows: int) -> Callable[[], object]:
    """One call of ``layer`` on ``rows`` new rows of width ``hidden`` at positions 16.. (no cache)."""
    x = torch.randn(1, rows, hidden, generator=torch.Generator().manual_seed(rows))  # [1, M, H]
    positions = torch.arange(16, 16 + rows)[None]  # [1, M]
    cos, sin = rotary(x, position_ids=positions)  # [1, M, D]
    meta = RaggedAttentionMetadata(torch.tensor([rows]), torch.tensor([rows]))
    return lambda: layer(
        x,
        attention_mask=None,
        position_embeddings=(cos, sin),
        position_ids=positions,
        spec_attn_metadata=meta,
    )


def measure(
    layer: nn.Module,
    rotary: nn.Module,
    paths: list[str],
    quantize: bool,
    verify_rows: int,
    blocks: dict[int, Decoded] | None = None,
) -> dict[str, tuple[float, float]]:
    """Per path, the best time of a decode and of a verify call of ``layer`` built as that path (seconds;
    module glossary)."""
    first = _first_linear(layer)
    if first is None:
        raise ValueError("the layer has no linear layer")
    calls: dict[tuple[str, int], Callable[[], object]] = {}
    for path in paths:
        built = build(layer, path, quantize, blocks)
        for rows in (1, verify_rows):
            calls[path, rows] = _step(built, rotary, first.in_features, rows)
    best = dict.fromkeys(calls, float("inf"))
    with torch.inference_mode():
        for call in calls.values():
            call()  # warm-up
        for _ in range(REPEATS):
            for key, call in calls.items():
                start = time.perf_counter()
                call()
                best[key] = min(best[key], time.perf_counter() - start)
    return {path: (best[path, 1], best[path, verify_rows]) for path in paths}


#: decisions measured in this process, by what they depend on (``_key``): every later load of a model with
#: the same layers runs the same path, so two engines on one model give the same tokens
_DECISIONS: dict[tuple[object, ...], Decision] = {}


def _key(
    layer: nn.Module, paths: list[str], quantize: bool, verify_rows: int, blocks: dict[int, Decoded]
) -> tuple[object, ...]:
    """What a measurement depends on: the layer's class, weight shapes and GGUF block types, the
    candidates, the step shapes, the threads, the ISA variant and whether native layers are allowed."""
    variant = active_variant()
    shapes = tuple(
        (name, tuple(p.shape), blocks[id(p)].kind if id(p) in blocks else "")
        for name, p in layer.named_parameters()
    )
    return (type(layer).__name__, shapes, tuple(paths), quantize, verify_rows, torch.get_num_threads(),
            variant.name if variant else None, os.environ.get(NATIVE_LAYERS_ENV, "1"))  # fmt: skip


def decide(
    model: nn.Module, quantize: bool, speculative_tokens: int | None, blocks: dict[int, Decoded] | None = None
) -> Decision:
    """The path ``model`` runs (module glossary): pinned, measured (once per process for a layer shape:
    ``_DECISIONS``), or — where no layer can be timed — native where its kernel loads, else int4-bf16.
    ``blocks``: the model's GGUF k-quant and Q8_0 layers (``kquant_linear.read_blocks``)."""
    blocks = blocks or {}
    pinned, paths = pinned_path(), candidate_paths(quantize)
    if pinned is not None:
        if pinned not in paths:
            raise ValueError(
                f"{PATH_ENV}={pinned} cannot run here; this model and machine allow {', '.join(paths)}"
            )
        return Decision(pinned, f"pinned by {PATH_ENV}")
    sample = sample_layer(model, quantize, blocks)
    if sample is None:
        return Decision(
            paths[0], "not measured: no plain decoder layer with Q4_1 or GGUF block weights to time"
        )
    verify_rows = (speculative_tokens or DEFAULT_SPECULATIVE_TOKENS) + 1
    key = _key(sample[0], paths, quantize, verify_rows, blocks)
    if key not in _DECISIONS:
        try:
            times = measure(*sample, paths, quantize, verify_rows, blocks)
        except Exception as exc:  # an architecture whose layer cannot be called alone
            return Decision(paths[0], f"not measured: {type(exc).__name__}: {exc}")
        _DECISIONS[key] = Decision(*choose(times), times, verify_rows)
    return _DECISIONS[key]


#: SmolLM2-135M's layer shapes (the bundled default model), for ``spec-backend backends``
SMOLLM2_SHAPES: dict[str, Any] = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
}


def default_model_decision() -> Decision:
    """The rule on a random layer with SmolLM2-135M's shapes, int4-quantized like its Q4_1 layers (what
    ``spec-backend backends`` shows: no model is loaded there)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(vocab_size=256, num_hidden_layers=1, **SMOLLM2_SHAPES)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        layer, rotary = LlamaDecoderLayer(config, 0).eval(), LlamaRotaryEmbedding(config)
    paths = candidate_paths(quantize=False)
    times = measure(layer, rotary, paths, True, DEFAULT_SPECULATIVE_TOKENS + 1)
    path, reason = choose(times)
    return Decision(path, reason, times, DEFAULT_SPECULATIVE_TOKENS + 1)


def describe(decision: Decision) -> str:
    """One line for the log: the path, why, and every time measured (ms per layer)."""
    variant = active_variant()
    text = f"{decision.path}: {decision.reason}"
    if decision.times:
        shown = ", ".join(f"{p} {d * 1e3:.3f}/{v * 1e3:.3f}" for p, (d, v) in decision.times.items())
        text += f" (ms per layer for 1/{decision.verify_rows} rows: {shown})"
    if variant is not None and decision.path == "native":
        text += f", {variant.name} kernels"
    return text


__all__ = [
    "DEFAULT_SPECULATIVE_TOKENS",
    "PATHS",
    "PATH_ENV",
    "REPEATS",
    "Decision",
    "build",
    "candidate_paths",
    "choose",
    "decide",
    "default_model_decision",
    "describe",
    "measure",
    "pack",
    "path_kernel",
    "pinned_path",
    "sample_layer",
]
