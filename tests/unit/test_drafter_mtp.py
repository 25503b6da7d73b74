"""``mtp``: the MTP layers a GLM-4.5 / DeepSeek-V3 style checkpoint ships as ``model.layers.{L+i}.*``.

The target is a tiny ``Glm4MoeForCausalLM`` saved by transformers (experts stored one by one, as the
published checkpoints are), with ``num_nextn_predict_layers`` MTP layers appended: ``enorm``,
``hnorm``, ``eh_proj``, ``shared_head.{norm,head}``, ``embed_tokens`` and a full decoder layer. The
oracle loads that decoder layer with transformers itself (a model with ``L + 1`` layers), so our
loader's renaming and expert stacking are checked against an independent reading of the same files.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, check_rebuilds, one_thread  # noqa: F401 - autouse
from safetensors.torch import load_file, save_file

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.eagle import EagleDrafter

L = 2  # target decoder layers


def write_glm_with_mtp(path: Path, nextn: int = 1, moe: bool = False, seed: int = 0) -> str:
    """A tiny GLM-4.5-style checkpoint with ``nextn`` MTP layers (``moe``: MoE blocks past layer 0)."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    settings: dict[str, Any] = {
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "moe_intermediate_size": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1 if moe else 100,
        "n_group": 1,
        "topk_group": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(Glm4MoeConfig(num_hidden_layers=L + nextn, **settings))
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(path))
    tensors = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed + 1)
    for i in range(nextn):
        p = f"model.layers.{L + i}."
        tensors |= {
            p + "enorm.weight": 1 + 0.3 * torch.randn(32, generator=gen),
            p + "hnorm.weight": 1 + 0.3 * torch.randn(32, generator=gen),
            p + "eh_proj.weight": 0.3 * torch.randn(32, 64, generator=gen),
            p + "shared_head.norm.weight": 1 + 0.3 * torch.randn(32, generator=gen),
            p + "shared_head.head.weight": tensors["lm_head.weight"].clone(),
            p + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
        }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config.update({"num_hidden_layers": L, "num_nextn_predict_layers": nextn})
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def glm(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_glm_with_mtp(tmp_path_factory.mktemp("glm"), nextn=2)


def outputs(llm: LLM, params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_identity(glm: str, k: int) -> None:
    expected = outputs(LLM(glm, dtype="float64"))
    llm = LLM(
        glm,
        dtype="float64",
        speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": k},
    )
    assert isinstance(llm.engine.drafter, EagleDrafter)
    assert outputs(llm) == expected
    assert llm.metrics.total.num_draft_tokens > 0
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()


def test_moe_blocks_load_from_per_expert_weights(tmp_path: Path) -> None:
    target = write_glm_with_mtp(tmp_path / "moe", nextn=1, moe=True)
    expected = outputs(LLM(target, dtype="float32"))
    llm = LLM(
        target,
        dtype="float32",
        speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 1},
    )
    head: Any = llm.engine.drafter.head  # type: ignore[union-attr]
    assert head.mtp[0].block.mlp.experts.gate_up_proj.shape == (4, 32, 32)
    assert outputs(llm) == expected


def _oracle(target_dir: str, committed: list[int], k: int, nextn: int) -> list[int]:
    """MTP drafts from the pseudo-code; the MTP decoder layers are read by transformers itself."""
    return [d for d, _ in _oracle_steps(target_dir, committed, k, nextn)]


def _oracle_steps(
    target_dir: str, committed: list[int], k: int, nextn: int
) -> list[tuple[int, torch.Tensor]]:
    """Per draft: the draft and the head output that drew it ``[H]``, each step's layer recomputed over
    every committed token and every draft before it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    config.num_hidden_layers = L + nextn
    config._attn_implementation = "sdpa"
    full = AutoModelForCausalLM.from_pretrained(target_dir, config=config, dtype=torch.float64).eval()
    w = {n: t.double() for n, t in load_file(os.path.join(target_dir, "model.safetensors")).items()}
    rms = full.model.norm.__class__(32, eps=config.rms_norm_eps).double()

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        rms.weight.data = w[name]
        return rms(x)

    with torch.no_grad():
        h = list(target(torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states[-1][0])
        toks, drafts = committed[1:], list[tuple[int, torch.Tensor]]()
        for step in range(k):
            p = f"model.layers.{L + step % nextn}."
            pos = torch.arange(len(toks))[None]
            e = norm(target.get_input_embeddings()(torch.tensor([toks])), p + "enorm.weight")
            e[pos == 0] = 0
            x = torch.cat([e, norm(torch.stack(h)[None], p + "hnorm.weight")], -1) @ w[p + "eh_proj.weight"].T
            mask = torch.ones(len(toks), len(toks), dtype=torch.bool).tril()[None, None]
            block = full.model.layers[L + step % nextn]
            out = block(
                x, attention_mask=mask, position_ids=pos, position_embeddings=full.model.rotary_emb(x, pos)
            )
            d = int(target.lm_head(norm(out[0, -1], p + "shared_head.norm.weight")).argmax())
            drafts.append((d, out[0, -1]))
            toks, h = [*toks, d], [*h, out[0, -1]]
    return drafts


def test_every_steps_drafts_match_a_rebuild_from_the_committed_tokens(tmp_path: Path) -> None:
    target = write_glm_with_mtp(tmp_path / "one", nextn=1, seed=4)
    llm = LLM(
        target,
        dtype="float64",
        speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 2},
    )
    check_rebuilds(llm, lambda committed: _oracle(target, committed, 2, 1))


def test_every_mtp_layer_attends_over_rows_it_computed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two MTP layers, K = 4 (layers 0, 1, 0, 1), in a slot another request held before: the head output
    that draws each draft equals the oracle's, which recomputes each step's layer over every committed
    token and draft (``proposers/layered_chain.py``). Failed before (by 2.5e-3 from draft 3 on, and by
    what the slot held before): the committed rows went through layer 0 only, and each draft step fed its
    layer one row, so a layer attended over positions it never wrote."""
    target = write_glm_with_mtp(tmp_path / "two", nextn=2, seed=4)
    spec = {"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 4}
    llm = LLM(target, dtype="float64", speculative_config=spec, max_num_seqs=1)
    llm.generate(
        [list(range(60, 80))], SamplingParams(temperature=1.0, seed=3, max_tokens=40, ignore_eos=True)
    )
    drafter: Any = llm.engine.drafter
    propose, draw, steps = drafter.propose, drafter._draw, []

    def spy_propose(inputs: Any) -> Any:
        steps.append((inputs.requests[0].num_tokens, []))
        return propose(inputs)

    def spy_draw(chain: Any, out: torch.Tensor, step: int) -> torch.Tensor:
        steps[-1][1].append(out[0].clone())
        return draw(chain, out, step)  # type: ignore[no-any-return]

    monkeypatch.setattr(drafter, "propose", spy_propose)
    monkeypatch.setattr(drafter, "_draw", spy_draw)
    prompt = PROMPTS[0]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=10))[0].outputs[0]
    tokens, checked = prompt + out.token_ids, 0
    for n, outs in steps:
        expected = _oracle_steps(target, tokens[:n], len(outs), 2)
        for step, (got, (_, want)) in enumerate(zip(outs, expected, strict=True)):
            assert torch.allclose(got, want, atol=1e-9, rtol=0), f"draft {step + 1} after {n} tokens"
            checked += 1
    assert checked >= 12 and len(steps) >= 3


def test_configuration_from_the_checkpoint(glm: str, caplog: pytest.LogCaptureFixture) -> None:
    llm = LLM(glm, dtype="float64", speculative_config={"model": glm})  # method and K from config.json
    assert llm.speculative_config is not None and llm.speculative_config.num_speculative_tokens == 2
    with caplog.at_level(logging.WARNING, logger="spec_backend.config"):
        llm = LLM(
            glm,
            dtype="float64",
            speculative_config={
                "adaptive_draft_length": False,
                "method": "glm4_moe_mtp",
                "num_speculative_tokens": 2,
            },
        )
    assert llm.speculative_config is not None and llm.speculative_config.method == "mtp"
    assert "deprecated" in caplog.text
    with pytest.raises(
        ValueError, match=r"num_speculative_tokens=3 must be a multiple of the draft model's n_predict=2"
    ):
        LLM(
            glm,
            speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 3},
        )


def test_checkpoints_without_mtp_layers_are_refused(target_dir: str, tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"method='mtp' does not match the draft model .* whose model_type is 'llama'"
    ):
        LLM(
            target_dir,
            speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 1},
        )
    broken = Path(write_glm_with_mtp(tmp_path / "broken", nextn=1))
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors[f"model.layers.{L}.eh_proj.weight"]
    tensors[f"model.layers.{L}.hnorm.weight"] = torch.ones(16)
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \['mtp.0.eh_proj.weight'\].*mtp.0.hnorm.weight: \[16\]"):
        LLM(
            str(broken),
            speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 1},
        )
