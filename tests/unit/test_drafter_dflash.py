"""``dflash`` from z-lab's checkpoint format: greedy identity, a from-scratch oracle, refusals.

The checkpoint is written as z-lab ships it: ``config.json`` = a Qwen3Config of the draft layers plus
``block_size``, ``num_target_layers``, ``dflash_config: {mask_token_id, target_layer_ids}`` and
``architectures: ["DFlashDraftModel"]``; safetensors ``fc``, ``hidden_norm``, ``layers.{i}.*`` (with
``q_norm``/``k_norm``), ``norm``; no embedding, no LM head.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, check_greedy_identity, draft_history, one_thread  # noqa: F401 - autouse
from safetensors.torch import load_file, save_file

from spec_backend.engine import LLM
from spec_backend.proposers.dflash import DFlashDrafter
from spec_backend.testing.fixtures.draft_checkpoints import write_dflash
from spec_backend.tools.tiny import make_tiny_model

MASK = 127


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 6-layer tiny Llama: z-lab's default target layers for 2 draft layers are (1, 3)."""
    return make_tiny_model(tmp_path_factory.mktemp("deep"), "llama", num_hidden_layers=6, seed=5)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_identity(deep_target: str, tmp_path: Path, k: int) -> None:
    head = write_dflash(tmp_path / "dflash", deep_target)
    expected = [o.outputs[0].token_ids for o in LLM(deep_target, dtype="float64").generate(PROMPTS, GREEDY)]
    spec = {"adaptive_draft_length": False, "method": "dflash", "model": head, "num_speculative_tokens": k}
    llm = check_greedy_identity(deep_target, expected, spec, DFlashDrafter)
    assert llm.engine.drafter is not None and llm.engine.drafter.hidden_states.aux_layer_ids == (2, 4)


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x [T, heads, d]
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos.double()[:, None] * inv[None]  # [T, d/2]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None], torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin


def _oracle(target_dir: str, head_dir: str, committed: list[int], k: int) -> list[int]:
    """DFlash from the pseudo-code: context = every committed token but the last, one block, no cache."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    w = {n: t.double() for n, t in load_file(os.path.join(head_dir, "model.safetensors")).items()}
    speculators = "embed_tokens.weight" in w  # speculators: aux ids are layer inputs, own embed/head
    inputs = [2, 4] if speculators else [1 + 1, 3 + 1]  # z-lab's default for 6 layers: outputs of 1, 3
    with torch.no_grad():
        states = target(torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states
        feats = torch.cat([states[i][0] for i in inputs], -1)  # [C, 2H]
        ctx = _rms(feats @ w["fc.weight"].T, w["hidden_norm.weight"])  # [C, H]
        n = len(committed)
        block = [committed[-1]] + [MASK] * k
        embed = w["embed_tokens.weight"] if speculators else target.get_input_embeddings().weight
        x = embed[torch.tensor(block)]  # [Q, H]
        pos_c, pos_q = torch.arange(n - 1), torch.arange(n - 1, n + k)
        for i in range(2):
            p = f"layers.{i}.self_attn."
            h = _rms(x, w[f"layers.{i}.input_layernorm.weight"])
            both = torch.cat([ctx, h])  # keys/values come from the context and the block alike
            q = _rope(_rms((h @ w[p + "q_proj.weight"].T).view(-1, 4, 8), w[p + "q_norm.weight"]), pos_q)
            kk = _rope(
                _rms((both @ w[p + "k_proj.weight"].T).view(-1, 2, 8), w[p + "k_norm.weight"]),
                torch.cat([pos_c, pos_q]),
            )
            v = (both @ w[p + "v_proj.weight"].T).view(-1, 2, 8)
            kk, v = kk.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # GQA: 4 heads over 2
            att = torch.softmax(torch.einsum("qhd,khd->hqk", q, kk) / 8**0.5, -1)  # no mask: non-causal
            x = x + torch.einsum("hqk,khd->qhd", att, v).reshape(len(block), -1) @ w[p + "o_proj.weight"].T
            m = f"layers.{i}.mlp."
            y = _rms(x, w[f"layers.{i}.post_attention_layernorm.weight"])
            act = torch.nn.functional.silu(y @ w[m + "gate_proj.weight"].T) * (y @ w[m + "up_proj.weight"].T)
            x = x + act @ w[m + "down_proj.weight"].T
        out = _rms(x, w["norm.weight"])  # [Q, H]
        if not speculators:
            return target.lm_head(out)[1:].argmax(-1).tolist()
        best = (out @ w["lm_head.weight"].T)[1:].argmax(-1)  # [K] draft ids
        return (best + w["d2t"].long()[best] if "d2t" in w else best).tolist()


@pytest.mark.parametrize("fmt", ["zlab", "speculators"])
def test_every_steps_drafts_match_a_rebuild_from_the_committed_tokens(
    deep_target: str, tmp_path: Path, fmt: str
) -> None:
    ids = [2, 4] if fmt == "speculators" else None
    head = write_dflash(
        tmp_path / "dflash", deep_target, seed=1, fmt=fmt, target_layer_ids=ids, draft_vocab=64
    )
    llm = LLM(
        deep_target,
        dtype="float64",
        speculative_config={
            "adaptive_draft_length": False,
            "method": "dflash",
            "model": head,
            "num_speculative_tokens": 3,
        },
    )
    tokens, seen = draft_history(llm, PROMPTS[2], 12)
    assert len(seen) >= 3 and llm.metrics.total.num_draft_tokens > 0
    for n, drafts in seen:
        assert drafts == _oracle(deep_target, head, tokens[:n], 3)[: len(drafts)], f"drafts after {n} tokens"


def test_speculators_format_alone_selects_dflash_and_k(deep_target: str, tmp_path: Path) -> None:
    head = write_dflash(
        tmp_path / "s", deep_target, fmt="speculators", target_layer_ids=[2, 4], draft_vocab=64
    )
    expected = [o.outputs[0].token_ids for o in LLM(deep_target, dtype="float64").generate(PROMPTS, GREEDY)]
    llm = check_greedy_identity(deep_target, expected, {"model": head}, DFlashDrafter)
    spec = llm.speculative_config
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("dflash", 7)
    assert llm.engine.drafter is not None and llm.engine.drafter.hidden_states.aux_layer_ids == (2, 4)


def test_method_comes_from_the_checkpoint_and_bad_ones_are_refused(deep_target: str, tmp_path: Path) -> None:
    head = write_dflash(tmp_path / "dflash", deep_target, layers=1, target_layer_ids=[0, 2, 4])
    llm = LLM(deep_target, speculative_config={"model": head, "num_speculative_tokens": 2})
    assert isinstance(llm.engine.drafter, DFlashDrafter)
    assert llm.engine.drafter.hidden_states.aux_layer_ids == (1, 3, 5)
    with pytest.raises(ValueError, match=r"num_speculative_tokens=8 exceeds .* \(block_size 8 - 1 = 7\)"):
        LLM(deep_target, speculative_config={"model": head, "num_speculative_tokens": 8})
    bad = write_dflash(tmp_path / "ids", deep_target, target_layer_ids=[1, 6])
    with pytest.raises(ValueError, match=r"target_layer_ids \[1, 6\] must be layer ids in 0\.\.5"):
        LLM(deep_target, speculative_config={"model": bad, "num_speculative_tokens": 2})
    tensors = load_file(os.path.join(head, "model.safetensors"))
    del tensors["layers.0.self_attn.k_norm.weight"]
    save_file(tensors, os.path.join(head, "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"DFlash checkpoint .* missing \['layers.0.self_attn.k_norm.weight'\]"
    ):
        LLM(deep_target, speculative_config={"model": head, "num_speculative_tokens": 2})
