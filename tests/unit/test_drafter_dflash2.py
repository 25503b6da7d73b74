"""``dflash`` with z-lab's DFlash2 checkpoints (``DFlash2DraftModel``): grouped dynamic convolutions
around every sub-layer, non-causal sliding-window attention, scaled and soft-capped logits and the
candidate selector. The oracle follows z-lab's published pseudo-code row by row (no cache, the whole
context rebuilt from the committed tokens), independently of the engine's modules."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import (  # noqa: F401 - one_thread is autouse
    GREEDY,
    PROMPTS,
    check_greedy_identity,
    check_rebuilds,
    draft_history,
    one_thread,
)
from safetensors.torch import load_file, save_file
from test_drafter_dflash import _rms, _rope

from spec_backend.engine import LLM
from spec_backend.proposers.dflash import DFlashDrafter
from spec_backend.testing.fixtures.draft_checkpoints import write_dflash2
from spec_backend.tools.tiny import make_tiny_model

MASK = 127


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("deep"), "llama", num_hidden_layers=6, seed=5)


def _conv(x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group: int) -> torch.Tensor:
    """Row t = sum over offsets o of (base[o] + dynamic[t, o] per group) * x[t - o] (zero before row 0)."""
    out = torch.zeros_like(x)  # x [Q, H]; dynamic [Q, ks, G]; base [ks, H]
    for t in range(x.shape[0]):
        for o in range(base.shape[0]):
            if t - o >= 0:
                out[t] += (base[o] + dynamic[t, o].repeat_interleave(group)) * x[t - o]
    return out


def _oracle(target_dir: str, head_dir: str, committed: list[int], k: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    w = {n: t.double() for n, t in load_file(os.path.join(head_dir, "model.safetensors")).items()}
    cfg = json.loads(Path(head_dir, "config.json").read_text())
    window, group = cfg["sliding_window"], cfg["dflash_config"]["conv_group_size"]
    with torch.no_grad():
        states = target(torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states
        ctx = _rms(torch.cat([states[2][0], states[4][0]], -1) @ w["fc.weight"].T, w["hidden_norm.weight"])
        n = len(committed)
        block = [committed[-1]] + [MASK] * k
        x = target.get_input_embeddings().weight[torch.tensor(block)]  # [Q, H]
        pos_c, pos_q = torch.arange(n - 1), torch.arange(n - 1, n + k)
        keys_pos = torch.cat([pos_c, pos_q])
        visible = (pos_q[:, None] - keys_pos[None] < window) & (keys_pos[None] - pos_q[:, None] < window)

        def sub_layer(i: int, conv: str, h: torch.Tensor, fn: object) -> torch.Tensor:
            c = f"layers.{i}.{conv}."
            dyn = (h @ w[c + "kernel_projection.weight"].T).view(len(block), 2, 2, -1)  # [Q, 2, ks, G]
            h = _conv(h, dyn[:, 0], w[c + "base_kernel"][0], group)
            return _conv(fn(h), dyn[:, 1], w[c + "base_kernel"][1], group)  # type: ignore[operator]

        for i in range(2):
            p = f"layers.{i}.self_attn."

            def attention(h: torch.Tensor, p: str = p) -> torch.Tensor:
                both = torch.cat([ctx, h])
                q = _rope(_rms((h @ w[p + "q_proj.weight"].T).view(-1, 4, 8), w[p + "q_norm.weight"]), pos_q)
                kk = _rope(
                    _rms((both @ w[p + "k_proj.weight"].T).view(-1, 2, 8), w[p + "k_norm.weight"]), keys_pos
                )
                v = (both @ w[p + "v_proj.weight"].T).view(-1, 2, 8)
                kk, v = kk.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
                scores = torch.einsum("qhd,khd->hqk", q, kk) / 8**0.5
                att = torch.softmax(scores.masked_fill(~visible[None], -torch.inf), -1)
                return torch.einsum("hqk,khd->qhd", att, v).reshape(len(block), -1) @ w[p + "o_proj.weight"].T

            def mlp(y: torch.Tensor, m: str = f"layers.{i}.mlp.") -> torch.Tensor:
                act = torch.nn.functional.silu(y @ w[m + "gate_proj.weight"].T) * (
                    y @ w[m + "up_proj.weight"].T
                )
                return act @ w[m + "down_proj.weight"].T

            x = x + sub_layer(
                i, "attention_conv", _rms(x, w[f"layers.{i}.input_layernorm.weight"]), attention
            )
            x = x + sub_layer(i, "mlp_conv", _rms(x, w[f"layers.{i}.post_attention_layernorm.weight"]), mlp)
        out = _rms(x, w["norm.weight"])[1:]  # [K, H]
    return _select(target, w, cfg["dflash_config"], out, committed[-1], k)


def _select(target: object, w: dict, zlab: dict, out: torch.Tensor, anchor: int, k: int) -> list[int]:
    """Scaled, soft-capped logits, then the candidate selector's greedy path from the anchor."""
    with torch.no_grad():
        scale, cap = zlab["output_multiplier"], zlab["final_logit_softcapping"]
        logits = torch.tanh(target.lm_head(out) * scale / cap) * cap  # type: ignore[attr-defined]
        unary, cand = logits.topk(zlab["selector_top_k"], -1)  # [K, k]
        projected = out @ w["candidate_selector.hidden_projection.weight"].T  # [K, r]
        previous, drafts = anchor, []
        for i in range(k):
            pair = (w["candidate_selector.predecessor_codebook"][previous] * projected[i]) @ w[
                "candidate_selector.successor_codebook"
            ][cand[i]].T
            previous = int(cand[i][int((unary[i] + pair).argmax())])
            drafts.append(previous)
    return drafts


@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_identity(deep_target: str, tmp_path: Path, k: int) -> None:
    head = write_dflash2(tmp_path / "dflash2", deep_target)
    expected = [o.outputs[0].token_ids for o in LLM(deep_target, dtype="float64").generate(PROMPTS, GREEDY)]
    spec = {"adaptive_draft_length": False, "method": "dflash", "model": head, "num_speculative_tokens": k}
    llm = check_greedy_identity(deep_target, expected, spec, DFlashDrafter)
    drafter = llm.engine.drafter
    assert isinstance(drafter, DFlashDrafter) and drafter.head.candidate_selector is not None


@pytest.mark.parametrize("window", [4, 1000])
def test_every_steps_drafts_match_zlabs_pseudo_code(deep_target: str, tmp_path: Path, window: int) -> None:
    head = write_dflash2(tmp_path / "dflash2", deep_target, seed=3, window=window)
    spec = {"adaptive_draft_length": False, "method": "dflash", "model": head, "num_speculative_tokens": 3}
    llm = LLM(deep_target, dtype="float64", speculative_config=spec)
    check_rebuilds(llm, lambda committed: _oracle(deep_target, head, committed, 3), ([40], PROMPTS[2]), 12)


def test_the_checkpoint_alone_selects_dflash(deep_target: str, tmp_path: Path) -> None:
    head = write_dflash2(tmp_path / "head", deep_target)  # a name that matches no method pattern
    llm = LLM(deep_target, speculative_config={"model": head, "num_speculative_tokens": 2})
    assert llm.speculative_config is not None and llm.speculative_config.method == "dflash"
    assert isinstance(llm.engine.drafter, DFlashDrafter)


def test_the_selector_changes_the_drafts(deep_target: str, tmp_path: Path) -> None:
    """Negative control: without the selector's pair scores, drafts are the plain argmax; they differ."""
    head = write_dflash2(tmp_path / "dflash2", deep_target, seed=3)
    spec = {"adaptive_draft_length": False, "method": "dflash", "model": head, "num_speculative_tokens": 3}
    with_selector = draft_history(LLM(deep_target, dtype="float64", speculative_config=spec), PROMPTS[2], 12)[
        1
    ]
    tensors = load_file(os.path.join(head, "model.safetensors"))
    tensors["candidate_selector.hidden_projection.weight"].zero_()
    save_file(tensors, os.path.join(head, "model.safetensors"))
    unary_only = draft_history(LLM(deep_target, dtype="float64", speculative_config=spec), PROMPTS[2], 12)[1]
    assert [d for _, d in with_selector] != [d for _, d in unary_only]


def test_bad_dflash2_configs_are_refused(deep_target: str, tmp_path: Path) -> None:
    head = Path(write_dflash2(tmp_path / "dflash2", deep_target))
    config = json.loads((head / "config.json").read_text())
    config["dflash_config"]["conv_group_size"] = 5
    (head / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"DFlash2 checkpoint .* group size dividing hidden_size 32"):
        LLM(
            deep_target,
            speculative_config={
                "adaptive_draft_length": False,
                "method": "dflash",
                "model": str(head),
                "num_speculative_tokens": 2,
            },
        )
    config["dflash_config"]["conv_group_size"] = 8
    (head / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(head / "model.safetensors"))
    del tensors["candidate_selector.successor_codebook"]
    save_file(tensors, str(head / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['candidate_selector.successor_codebook'\]"):
        LLM(
            deep_target,
            speculative_config={
                "adaptive_draft_length": False,
                "method": "dflash",
                "model": str(head),
                "num_speculative_tokens": 2,
            },
        )
