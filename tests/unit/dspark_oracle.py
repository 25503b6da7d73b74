"""DSpark's drafting written out from DeepSpec's pseudo-code (``draft_ops.build_dspark_proposal``,
``markov_head.py``, the paper's Eq. 2-7), for the tests: no cache, the context rebuilt from the committed
tokens every time, float64, greedy. Independent of the engine's modules: it reads the checkpoint's
``config.json`` and ``model.safetensors`` itself.

    ctx   = hidden_norm(fc(concat(target hidden states of the chosen layers)))  for committed[:-1]
    block = [anchor, MASK x (block_size - 1)] at positions anchor_pos ..
    out   = norm(layers(block; keys/values from ctx and block, no mask))
    rows  = out[0:K] (anchor predicts) or out[1:K+1] (DFlash layout)
    prev  = anchor
    for k in 0..K-1:
        e = W1[prev]; bias = Markov(e, rows[k]); logits = lm_head(rows[k]) + bias
        conf[k] = sigmoid(w . [rows[k]; e] + b)
        prev = draft[k] = argmax(logits)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from test_drafter_dflash import _rms, _rope


def _fields(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg.get("speculators_model_type") == "dspark":
        layer = cfg["transformer_layer_config"]
        return {
            "layer": layer,
            "inputs": cfg["aux_hidden_state_layer_ids"],
            "first": 0 if cfg.get("sample_from_anchor") else 1,
        }
    return {"layer": cfg, "inputs": [i + 1 for i in cfg["target_layer_ids"]], "first": 0}


def _backbone(
    w: dict[str, torch.Tensor],
    layer: dict[str, Any],
    ctx: torch.Tensor,
    x: torch.Tensor,
    pos_c: torch.Tensor,
    pos_q: torch.Tensor,
) -> torch.Tensor:
    heads, kv, d = layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]
    for i in range(layer["num_hidden_layers"]):
        p = f"layers.{i}.self_attn."
        h = _rms(x, w[f"layers.{i}.input_layernorm.weight"])
        both = torch.cat([ctx, h])  # the same k/v projections read the context and the block
        q = _rope(_rms((h @ w[p + "q_proj.weight"].T).view(-1, heads, d), w[p + "q_norm.weight"]), pos_q)
        keys = _rms((both @ w[p + "k_proj.weight"].T).view(-1, kv, d), w[p + "k_norm.weight"])
        keys = _rope(keys, torch.cat([pos_c, pos_q])).repeat_interleave(heads // kv, dim=1)
        v = (both @ w[p + "v_proj.weight"].T).view(-1, kv, d).repeat_interleave(heads // kv, dim=1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, keys) / d**0.5, -1)  # no mask
        x = x + torch.einsum("hqk,khd->qhd", att, v).reshape(len(x), -1) @ w[p + "o_proj.weight"].T
        m = f"layers.{i}.mlp."
        y = _rms(x, w[f"layers.{i}.post_attention_layernorm.weight"])
        act = torch.nn.functional.silu(y @ w[m + "gate_proj.weight"].T) * (y @ w[m + "up_proj.weight"].T)
        x = x + act @ w[m + "down_proj.weight"].T
    return _rms(x, w["norm.weight"])


def _markov(
    w: dict[str, torch.Tensor], kind: str, e: torch.Tensor, h: torch.Tensor, s: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(bias [Vd], next state) of one slot."""
    if kind == "gated":
        gate = torch.sigmoid(
            torch.cat([h, e]) @ w["markov_head.gate_proj.weight"].T + w["markov_head.gate_proj.bias"]
        )
        return w["markov_head.markov_w2.weight"] @ (gate * e), s
    if kind == "rnn":
        z = torch.cat([s, e, h]) @ w["markov_head.joint_proj.weight"].T + w["markov_head.joint_proj.bias"]
        g, c, o = z.chunk(3)
        s = torch.sigmoid(g) * s + (1 - torch.sigmoid(g)) * torch.tanh(c)
        return w["markov_head.markov_w2.weight"] @ torch.tanh(o), s
    return w["markov_head.markov_w2.weight"] @ e, s


def dspark_drafts(
    target_dir: str, head_dir: str, committed: list[int], k: int
) -> tuple[list[int], list[float]]:
    """Greedy drafts and their confidences after ``committed`` (module docstring)."""
    from transformers import AutoModelForCausalLM

    target: Any = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    w = {n: t.double() for n, t in load_file(os.path.join(head_dir, "model.safetensors")).items()}
    cfg = json.loads(Path(head_dir, "config.json").read_text())
    f = _fields(cfg)
    bs, mask, rank = cfg["block_size"], cfg["mask_token_id"], cfg.get("markov_rank", 0)
    with torch.no_grad():
        states = target(torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states
        ctx = _rms(
            torch.cat([states[i][0] for i in f["inputs"]], -1) @ w["fc.weight"].T, w["hidden_norm.weight"]
        )
        n = len(committed)
        block = torch.tensor([committed[-1]] + [mask] * (bs - 1))
        embed = w.get("embed_tokens.weight", target.get_input_embeddings().weight)
        out = _backbone(
            w, f["layer"], ctx, embed[block], torch.arange(n - 1), torch.arange(n - 1, n - 1 + bs)
        )
        rows = out[f["first"] : f["first"] + k]  # [K, H]
        head = w.get("lm_head.weight", target.lm_head.weight)
        d2t = w["d2t"].long() if "d2t" in w else None
        prev, s, drafts, conf = committed[-1], torch.zeros(rank, dtype=torch.float64), [], []
        for j in range(k):
            logits = rows[j] @ head.T
            e = w["markov_head.markov_w1.weight"][prev] if rank else torch.zeros(0, dtype=torch.float64)
            if rank:
                bias, s = _markov(w, cfg.get("markov_head_type", "vanilla"), e, rows[j], s)
                logits = logits + bias
            if "confidence_head.proj.weight" in w:
                feats = torch.cat([rows[j], e]) if cfg.get("confidence_head_with_markov", True) else rows[j]
                logit = feats @ w["confidence_head.proj.weight"][0] + w["confidence_head.proj.bias"][0]
                conf.append(float(torch.sigmoid(logit)))
            best = int(logits.argmax())
            prev = best + int(d2t[best]) if d2t is not None else best
            drafts.append(prev)
    return drafts, conf
