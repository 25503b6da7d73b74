"""Random draft checkpoints written in the published on-disk formats, for tests and benchmarks.

Each writer reads the target's ``config.json`` (sizes, vocabulary) and writes ``config.json`` +
``model.safetensors`` exactly as the method's checkpoints ship (tensor names, shapes, config fields), with
random weights. They prove that loaders read the real formats; they say nothing about acceptance.

* ``write_eagle1``: EAGLE-1 (``yuhuili/EAGLE-*``): LlamaConfig + ``bias``, ``fc``, ``layers.0.*`` without
  ``input_layernorm``.
* ``write_eagle3``: EAGLE-3 in the original format (``midlayer.*``, ``draft_vocab_size``) or the
  ``speculators`` format (``transformer_layer_config``, ``layers.0.*``), with ``d2t``/``t2d`` when the
  draft vocabulary is smaller than the target's.
* ``write_dflash``: z-lab DFlash (Qwen3Config + ``block_size``, ``dflash_config``); ``write_dflash2``:
  z-lab's DFlash2 (convolutions, candidate selector, sliding non-causal layers).
* ``write_medusa``: Medusa heads in vLLM's or FasterDecoding's safetensors layout.
* ``write_mlp_speculator``: IBM's MLPSpeculator, tied or untied, with or without ``speculator.``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


def _target_config(target_dir: str) -> dict[str, Any]:
    with open(os.path.join(target_dir, "config.json"), encoding="utf-8") as f:
        cfg: dict[str, Any] = json.load(f)
    heads = cfg["num_attention_heads"]
    cfg.setdefault("head_dim", cfg["hidden_size"] // heads)
    cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or heads
    return cfg


def _save(path: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> str:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


class _Random:
    """Random tensors of one seed, scaled to keep activations in range."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, *shape: int, scale: float = 0.3) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen) * scale

    def norm(self, size: int) -> torch.Tensor:
        return 1 + self(size)


def _attention_mlp(rnd: _Random, prefix: str, cfg: dict[str, Any], width: int) -> dict[str, torch.Tensor]:
    """One Llama-style layer's projections; q/k/v read ``width`` inputs (2H for EAGLE-3's first layer)."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    std = width**-0.5
    return {
        prefix + "self_attn.q_proj.weight": rnd(heads * d, width, scale=std),
        prefix + "self_attn.k_proj.weight": rnd(kv * d, width, scale=std),
        prefix + "self_attn.v_proj.weight": rnd(kv * d, width, scale=std),
        prefix + "self_attn.o_proj.weight": rnd(h, heads * d, scale=(heads * d) ** -0.5),
        prefix + "mlp.gate_proj.weight": rnd(inter, h, scale=h**-0.5),
        prefix + "mlp.up_proj.weight": rnd(inter, h, scale=h**-0.5),
        prefix + "mlp.down_proj.weight": rnd(h, inter, scale=inter**-0.5),
        prefix + "post_attention_layernorm.weight": rnd.norm(h),
    }


def write_eagle1(path: Path, target_dir: str, bias: bool, seed: int = 0) -> str:
    """A random EAGLE-1 head for the target at ``target_dir``."""
    cfg = _target_config(target_dir)
    cfg.update({"num_hidden_layers": 1, "bias": bias, "architectures": ["LlamaForCausalLM"]})
    h, rnd = cfg["hidden_size"], _Random(seed)
    tensors = {
        "fc.weight": rnd(h, 2 * h, scale=(2 * h) ** -0.5 * 1.7),
        **_attention_mlp(rnd, "layers.0.", cfg, h),
    }
    if bias:
        tensors["fc.bias"] = rnd(h)
    return _save(path, tensors, cfg)


def write_eagle3(
    path: Path,
    target_dir: str,
    fmt: str,
    draft_vocab: int | None = None,
    aux_ids: list[int] | None = None,
    norm_before_residual: bool = False,
    seed: int = 0,
) -> str:
    """A random EAGLE-3 head for the target at ``target_dir`` in ``fmt``: "original", "speculators", or
    "peagle" (speculators' P-EAGLE: ``mask_hidden [1, 1, 3H]`` and ``mask_token_id`` 5, for parallel
    drafting)."""
    if fmt not in ("original", "speculators", "peagle"):
        raise ValueError(f"fmt must be 'original', 'speculators' or 'peagle', got {fmt!r}")
    cfg = _target_config(target_dir)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    vd, rnd = draft_vocab or v, _Random(seed)
    first = "midlayer." if fmt == "original" else "layers.0."
    tensors = {
        "fc.weight": rnd(h, 3 * h, scale=(3 * h) ** -0.5 * 1.7),
        first + "hidden_norm.weight": rnd.norm(h),
        first + "input_layernorm.weight": rnd.norm(h),
        **_attention_mlp(rnd, first, cfg, 2 * h),
        "norm.weight": rnd.norm(h),
        "lm_head.weight": rnd(vd, h, scale=8 * h**-0.5),
    }
    if vd < v:  # the vd target ids the draft vocabulary covers, as offsets (target = draft + d2t)
        ids = torch.randperm(v, generator=rnd.gen)[:vd].sort().values
        tensors["d2t"] = ids - torch.arange(vd)
        tensors["t2d"] = torch.zeros(v, dtype=torch.bool).index_fill(0, ids, True)
    layer = {**cfg, "num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"]}
    if fmt == "original":
        return _save(
            path, tensors, {**layer, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": vd}
        )
    if fmt == "peagle":
        tensors["mask_hidden"] = rnd(1, 1, 3 * h, scale=1.0)
    config = {
        "architectures": ["PEagleSpeculator" if fmt == "peagle" else "Eagle3Speculator"],
        "speculators_model_type": "peagle" if fmt == "peagle" else "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": vd,
        "norm_before_residual": norm_before_residual,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": aux_ids,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": target_dir, "architectures": cfg.get("architectures")},
        },
    }
    if fmt == "peagle":
        config["mask_token_id"] = 5
    return _save(path, tensors, config)


def write_dflash(
    path: Path,
    target_dir: str,
    layers: int = 2,
    target_layer_ids: list[int] | None = None,
    mask_token_id: int | None = None,
    block_size: int = 8,
    seed: int = 0,
    fmt: str = "zlab",
    draft_vocab: int | None = None,
) -> str:
    """A random DFlash head for the target at ``target_dir`` (mask token: the last id by default).

    ``fmt="zlab"``: z-lab's format (``target_layer_ids`` name layer outputs). ``fmt="speculators"``:
    speculators' (``target_layer_ids`` are written as ``aux_hidden_state_layer_ids``, i.e. layer inputs,
    as given), with its own ``embed_tokens`` and ``lm_head [Vd, H]`` and ``d2t``/``t2d`` when
    ``draft_vocab`` is smaller than the target's vocabulary.
    """
    if fmt not in ("zlab", "speculators"):
        raise ValueError(f"fmt must be 'zlab' or 'speculators', got {fmt!r}")
    cfg = _target_config(target_dir)
    h, v, d = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    n_feat, rnd = len(target_layer_ids) if target_layer_ids else layers, _Random(seed)
    tensors = {
        "fc.weight": rnd(h, n_feat * h, scale=(n_feat * h) ** -0.5 * 1.7),
        "hidden_norm.weight": rnd.norm(h),
        "norm.weight": rnd.norm(h),
    }
    for i in range(layers):
        p = f"layers.{i}."
        tensors |= _attention_mlp(rnd, p, cfg, h)
        tensors |= {
            p + "self_attn.q_norm.weight": rnd.norm(d),
            p + "self_attn.k_norm.weight": rnd.norm(d),
            p + "input_layernorm.weight": rnd.norm(h),
        }
    layer = _qwen3_layers(cfg, layers)
    mask = v - 1 if mask_token_id is None else mask_token_id
    if fmt == "speculators":
        return _save(
            path,
            tensors | _speculators_vocab(rnd, v, h, draft_vocab),
            _speculators_dflash(layer, mask, block_size, target_layer_ids, draft_vocab or v),
        )
    dflash: dict[str, Any] = {"mask_token_id": mask}
    if target_layer_ids is not None:
        dflash["target_layer_ids"] = target_layer_ids
    config = {
        "architectures": ["DFlashDraftModel"],
        **layer,
        "block_size": block_size,
        "num_target_layers": cfg["num_hidden_layers"],
        "dflash_config": dflash,
    }
    return _save(path, tensors, config)


def write_dflash2(
    path: Path,
    target_dir: str,
    layers: int = 2,
    seed: int = 0,
    window: int | None = 6,
    group_size: int = 8,
    rank: int = 8,
    top_k: int = 5,
) -> str:
    """A random z-lab DFlash2 head: ``write_dflash``'s tensors plus each layer's two grouped dynamic
    convolutions and the candidate selector, and ``dflash_config``'s DFlash2 fields, with
    ``DFlash2DraftModel``'s non-causal sliding-window layers (``window``) and its logit scale and softcap."""
    from safetensors.torch import load_file

    write_dflash(path, target_dir, layers=layers, seed=seed)
    tensors = load_file(str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    h, v, rnd = config["hidden_size"], config["vocab_size"], _Random(seed + 100)
    for i in range(layers):
        for conv in ("attention_conv", "mlp_conv"):
            p = f"layers.{i}.{conv}."
            tensors[p + "base_kernel"] = rnd(2, 2, h, scale=0.5)
            tensors[p + "kernel_projection.weight"] = rnd(2 * 2 * (h // group_size), h, scale=h**-0.5)
    tensors |= {  # the codebooks are stored without ".weight", as z-lab's checkpoints are
        "candidate_selector.predecessor_codebook": rnd(v, rank, scale=0.4),
        "candidate_selector.successor_codebook": rnd(v, rank, scale=0.4),
        "candidate_selector.hidden_projection.weight": rnd(rank, h, scale=h**-0.5),
    }
    config["dflash_config"] |= {
        "conv_kernel_size": 2,
        "conv_group_size": group_size,
        "selector_rank": rank,
        "selector_top_k": top_k,
        "output_multiplier": 0.5,
        "final_logit_softcapping": 1.0,
    }
    config |= {"architectures": ["DFlash2DraftModel"], "is_causal": False}
    if window is not None:
        config |= {"layer_types": ["sliding_attention"] * layers, "sliding_window": window}
        config |= {"use_sliding_window": True, "max_window_layers": layers}
    return _save(path, tensors, config)


def _qwen3_layers(cfg: dict[str, Any], layers: int) -> dict[str, Any]:
    """A Qwen3Config dict of ``layers`` draft layers with the target's sizes."""
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    return {
        "model_type": "qwen3",
        **{k: cfg[k] for k in keys},
        "num_hidden_layers": layers,
        "head_dim": cfg["head_dim"],
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": cfg.get("max_position_embeddings", 2048),
    }


def _speculators_vocab(rnd: _Random, v: int, h: int, draft_vocab: int | None) -> dict[str, torch.Tensor]:
    vd = draft_vocab or v
    tensors = {"embed_tokens.weight": rnd(v, h, scale=1.0), "lm_head.weight": rnd(vd, h, scale=8 * h**-0.5)}
    if vd < v:
        ids = torch.randperm(v, generator=rnd.gen)[:vd].sort().values
        tensors["d2t"] = ids - torch.arange(vd)
        tensors["t2d"] = torch.zeros(v, dtype=torch.bool).index_fill(0, ids, True)
    return tensors


def _speculators_dflash(
    layer: dict[str, Any], mask: int, block_size: int, aux_ids: list[int] | None, draft_vocab: int
) -> dict[str, Any]:
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": layer,
        "block_size": block_size,
        "mask_token_id": mask,
        "aux_hidden_state_layer_ids": aux_ids,
        "draft_vocab_size": draft_vocab,
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block_size - 1}],
        },
    }


def write_medusa(path: Path, hidden: int, vocab: int, heads: int, layout: str, seed: int = 0) -> str:
    """Random one-layer Medusa heads in vLLM's (``layout="vllm"``) or FasterDecoding's safetensors layout."""
    if layout not in ("vllm", "fasterdecoding"):
        raise ValueError(f"layout must be 'vllm' or 'fasterdecoding', got {layout!r}")
    rnd = _Random(seed)
    tensors: dict[str, torch.Tensor] = {}
    for i in range(heads):
        w, b, head = (
            rnd(hidden, hidden, scale=0.3 * (32 / hidden) ** 0.5),
            rnd(hidden, scale=0.1),
            rnd(vocab, hidden, scale=1.0),
        )
        if layout == "vllm":
            tensors |= {
                f"blocks.{i}.layers.0.weight": w,
                f"blocks.{i}.layers.0.bias": b,
                f"lm_heads.{i}.weight": head,
            }
        else:
            tensors |= {f"{i}.0.linear.weight": w, f"{i}.0.linear.bias": b, f"{i}.1.weight": head}
    config: dict[str, Any] = (
        {
            "model_type": "medusa",
            "num_heads": heads,
            "num_hidden_layers": 1,
            "medusa_fc_bias": True,
            "hidden_size": hidden,
            "vocab_size": vocab,
        }
        if layout == "vllm"
        else {"medusa_num_heads": heads, "medusa_num_layers": 1, "base_model_name_or_path": "tiny"}
    )
    return _save(path, tensors, config)


def write_mlp_speculator(
    path: Path,
    hidden: int,
    vocab: int,
    inner: int,
    n_predict: int,
    tied: bool,
    prefix: str = "speculator.",
    seed: int = 0,
) -> str:
    """A random IBM MLPSpeculator (tied or untied weights; ``prefix`` ``"speculator."`` or ``""``)."""
    rnd = _Random(seed)
    steps = 1 if tied else n_predict
    t: dict[str, torch.Tensor] = {"proj.0.weight": rnd(inner, hidden, scale=0.3 * (32 / hidden) ** 0.5)}
    for i in range(1, 2 if tied else n_predict):
        t[f"proj.{i}.weight"] = rnd(inner, inner)
    for i in range(steps):
        t[f"emb.{i}.weight"] = rnd(vocab, inner, scale=1.0)
        t[f"head.{i}.weight"] = rnd(vocab, inner, scale=1.0)
        t[f"ln.{i}.weight"] = 1 + rnd(inner, scale=0.1)
        t[f"ln.{i}.bias"] = rnd(inner, scale=0.1)
    config = {
        "model_type": "mlp_speculator",
        "vocab_size": vocab,
        "emb_dim": hidden,
        "inner_dim": inner,
        "n_predict": n_predict,
        "tie_weights": tied,
        "scale_input": tied,
        "top_k_tokens_per_head": [1] * n_predict,
        "n_candidates": 1,
    }
    return _save(path, {prefix + k: v for k, v in t.items()}, config)


__all__ = [
    "write_dflash",
    "write_dflash2",
    "write_eagle1",
    "write_eagle3",
    "write_medusa",
    "write_mlp_speculator",
]
