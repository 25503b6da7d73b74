"""``eagle`` (EAGLE-1) from the published checkpoint format: greedy identity and an oracle alignment check.

The checkpoint is written exactly as EAGLE-1 ships: ``config.json`` (a LlamaConfig with
``num_hidden_layers: 1`` and ``bias``) and ``model.safetensors`` with ``fc.weight [H, 2H]``, optional
``fc.bias``, ``layers.0.*`` without ``input_layernorm``, and no embeddings (shared with the target).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, check_greedy_identity, one_thread, record_drafts  # noqa: F401 - autouse
from safetensors.torch import save_file

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.eagle import EagleDrafter
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle1


@pytest.mark.parametrize(("k", "bias"), [(1, True), (3, False), (3, True)])
def test_greedy_identity(
    target_dir: str, expected: list[list[int]], tmp_path: Path, k: int, bias: bool
) -> None:
    head = write_eagle1(tmp_path / "eagle", target_dir, bias)
    spec = {"method": "eagle", "model": head, "num_speculative_tokens": k}
    check_greedy_identity(target_dir, expected, spec, EagleDrafter)


def _reference_drafts(target_dir: str, head_dir: str, prompt: list[int], first: int, k: int) -> list[int]:
    """EAGLE-1 straight from the pseudo-code, no cache: full recomputation of every row."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    cfg = json.loads(Path(head_dir, "config.json").read_text())
    config = LlamaConfig(**{k2: v for k2, v in cfg.items() if k2 not in ("architectures", "bias")})
    config._attn_implementation = "sdpa"
    w = {n: t.double() for n, t in load_file(str(Path(head_dir, "model.safetensors"))).items()}
    layer = LlamaDecoderLayer(config, 0).double()
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict({n[len("layers.0.") :]: t for n, t in w.items() if n.startswith("layers.0.")})
    rope = LlamaRotaryEmbedding(config)
    with torch.no_grad():
        h = target(torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1][0]  # [P, H] post-norm
        toks, hid, drafts = [*prompt[1:], first], list(h), []
        for _ in range(k):
            e = target.get_input_embeddings()(torch.tensor([toks]))  # [1, T, H]
            x = torch.cat([e, torch.stack(hid)[None]], -1) @ w["fc.weight"].T + w.get("fc.bias", 0)
            pos = torch.arange(len(toks))[None]
            mask = torch.ones(len(toks), len(toks), dtype=torch.bool).tril()[None, None]
            out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rope(x, pos))[0]
            d = int(target.get_output_embeddings()(out[-1]).argmax())
            drafts.append(d)
            toks, hid = [*toks, d], [*hid, out[-1]]
    return drafts


def test_first_drafts_match_the_pseudo_code(target_dir: str, tmp_path: Path) -> None:
    head = write_eagle1(tmp_path / "eagle", target_dir, bias=True, seed=1)
    llm = LLM(
        target_dir,
        dtype="float64",
        speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 3},
    )
    seen = record_drafts(llm)
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=6))[0].outputs[0]
    assert seen[0] == _reference_drafts(target_dir, head, PROMPTS[0], out.token_ids[0], 3)


def test_bad_checkpoint_is_refused(target_dir: str, tmp_path: Path) -> None:
    head = Path(write_eagle1(tmp_path / "eagle", target_dir, bias=False))
    from safetensors.torch import load_file

    tensors = load_file(str(head / "model.safetensors"))
    del tensors["layers.0.mlp.up_proj.weight"]
    tensors["fc.weight"] = tensors["fc.weight"][:, :10].contiguous()
    save_file(tensors, str(head / "model.safetensors"))
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match=r"missing \['layers.0.mlp.up_proj.weight'\].*fc.weight: \[32, 10\]"):
        LLM(target_dir, speculative_config=spec)
