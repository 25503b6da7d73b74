"""``mtp`` with the MiMo layout (``model.mtp_layers.{i}.*``, hidden first, final norm inside the layer),
and a drafter built to agree with its target (full acceptance: alignment bugs cannot hide).

The target is a tiny Qwen2 model saved by transformers, re-labelled as MiMo the way the published
checkpoints are (``model_type: "mimo"``, ``MiMoForCausalLM``, ``num_nextn_predict_layers``) with the
extra layers' tensors renamed to MiMo's names. The oracle reads the MTP decoder layer with transformers
itself (a Qwen2 model with ``L + 1`` layers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import PROMPTS, check_rebuilds, one_thread  # noqa: F401 - autouse
from safetensors.torch import load_file, save_file
from test_drafter_mtp import outputs

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.eagle import EagleDrafter

L, H = 2, 32  # target decoder layers, hidden size
_IO = {
    "enorm": "token_layernorm",
    "hnorm": "hidden_layernorm",
    "proj": "input_proj",
    "norm": "final_layernorm",
}


def write_mimo(path: Path, nextn: int = 1, seed: int = 0, layers: int = L, eps: float = 1e-6) -> str:
    """A tiny MiMo checkpoint: Qwen2 decoder + ``nextn`` MTP layers under MiMo's names."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=128,
        hidden_size=H,
        intermediate_size=64,
        num_hidden_layers=layers + nextn,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=eps,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(path))
    tensors = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed + 1)
    for i in range(nextn):
        old, new = f"model.layers.{layers + i}.", f"model.mtp_layers.{i}."
        for name in [n for n in tensors if n.startswith(old)]:
            tensors[new + name[len(old) :]] = tensors.pop(name)
        tensors |= {
            new + "token_layernorm.weight": 1 + 0.3 * torch.randn(H, generator=gen),
            new + "hidden_layernorm.weight": 1 + 0.3 * torch.randn(H, generator=gen),
            new + "input_proj.weight": 0.3 * torch.randn(H, 2 * H, generator=gen),
            new + "final_layernorm.weight": 1 + 0.3 * torch.randn(H, generator=gen),
        }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((path / "config.json").read_text())
    raw.update(
        {
            "model_type": "mimo",
            "architectures": ["MiMoForCausalLM"],
            "auto_map": {"AutoModelForCausalLM": "modeling_mimo.MiMoForCausalLM"},
            "num_hidden_layers": layers,
            "layer_types": raw["layer_types"][:layers],
            "num_nextn_predict_layers": nextn,
        }
    )
    (path / "config.json").write_text(json.dumps(raw))
    return str(path)


@pytest.fixture(scope="module")
def mimo(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_mimo(tmp_path_factory.mktemp("mimo"), nextn=1)


def test_target_loads_as_qwen2_with_the_transformers_reading(mimo: str) -> None:
    """The re-labelled checkpoint decodes exactly as transformers' Qwen2 reading of the same weights."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    raw = json.loads(Path(mimo, "config.json").read_text())
    config = Qwen2Config(
        **{k: v for k, v in raw.items() if k not in ("model_type", "architectures", "auto_map")}
    )
    hf = AutoModelForCausalLM.from_pretrained(mimo, config=config, dtype=torch.float64).eval()
    got = outputs(LLM(mimo, dtype="float64"), SamplingParams(temperature=0.0, max_tokens=6))
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        ids = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None)
        assert tokens == ids[0, len(prompt) :].tolist()


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_identity(mimo: str, k: int) -> None:
    expected = outputs(LLM(mimo, dtype="float64"))
    llm = LLM(
        mimo,
        dtype="float64",
        speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": k},
    )
    assert isinstance(llm.engine.drafter, EagleDrafter)
    assert llm.engine.drafter.head.layout.family == "mimo"  # type: ignore[attr-defined]
    assert outputs(llm) == expected
    assert llm.metrics.total.num_draft_tokens > 0


def _oracle(target_dir: str, committed: list[int], k: int) -> list[int]:
    """MiMo drafts from vLLM's pseudo-code; the MTP decoder layer is read by transformers itself."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    w = {n: t.double() for n, t in load_file(os.path.join(target_dir, "model.safetensors")).items()}
    raw = json.loads(Path(target_dir, "config.json").read_text())
    settings = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "auto_map")}
    target = AutoModelForCausalLM.from_pretrained(
        target_dir, config=Qwen2Config(**settings), dtype=torch.float64
    )
    settings |= {"num_hidden_layers": L + 1, "layer_types": ["full_attention"] * (L + 1)}
    full = Qwen2ForCausalLM(Qwen2Config(**settings)).double().eval()
    p = "model.mtp_layers.0."
    block = {f"model.layers.{L}.{n[len(p) :]}": t for n, t in w.items() if n.startswith(p)}
    full.load_state_dict({**{n: t for n, t in w.items() if "mtp_layers" not in n}, **block}, strict=False)
    rms = full.model.norm.__class__(H, eps=raw["rms_norm_eps"]).double()

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        rms.weight.data = w[p + name + ".weight"]
        return rms(x)

    with torch.no_grad():
        h = list(
            target.eval()(torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states[-1][0]
        )
        toks, drafts = committed[1:], []
        for _ in range(k):
            pos = torch.arange(len(toks))[None]
            e = target.get_input_embeddings()(torch.tensor([toks]))
            e[pos == 0] = 0
            x = torch.cat([norm(torch.stack(h)[None], _IO["hnorm"]), norm(e, _IO["enorm"])], -1)
            x = x @ w[p + "input_proj.weight"].T  # hidden first, then the embedding
            mask = torch.ones(len(toks), len(toks), dtype=torch.bool).tril()[None, None]
            out = full.model.layers[L](
                x, attention_mask=mask, position_ids=pos, position_embeddings=full.model.rotary_emb(x, pos)
            )
            out = norm(out[0, -1], _IO["norm"])  # the layer's output is normalised: next h and logits
            d = int(target.lm_head(out).argmax())
            drafts.append(d)
            toks, h = [*toks, d], [*h, out]
    return drafts


def test_every_steps_drafts_match_a_rebuild_from_the_committed_tokens(tmp_path: Path) -> None:
    target = write_mimo(tmp_path / "one", nextn=1, seed=4)
    llm = LLM(
        target,
        dtype="float64",
        speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 2},
    )
    check_rebuilds(llm, lambda committed: _oracle(target, committed, 2))


def write_agreeing(path: Path, hidden_first: bool = True) -> str:
    """A MiMo checkpoint whose MTP layer computes exactly what its target computes for the next token.

    The target has one decoder layer whose attention output is zeroed (``o_proj = 0``), so its logits at
    a position depend on that position's token only: ``f(token) = lm_head(norm(e + mlp(ln(e))))``. Token
    embeddings have RMS 1 and the norms' epsilon is negligible, so ``token_layernorm(e) = e``. The MTP
    layer selects the embedding half of ``[hidden, embedding]`` (``hidden_first=False`` puts the identity
    in the other half: a negative control), copies the target block (attention zeroed too) and the final
    norm: its draft for position t+1 is ``f(token_{t+1})``, the target's own next token, at every step.
    """
    write_mimo(path, nextn=1, seed=7, layers=1, eps=1e-30)
    tensors = load_file(str(path / "model.safetensors"))
    emb = tensors["model.embed_tokens.weight"]
    tensors["model.embed_tokens.weight"] = emb / emb.pow(2).mean(-1, keepdim=True).sqrt()
    p = "model.mtp_layers.0."
    for name in [n for n in tensors if n.startswith("model.layers.0.")]:
        tensors[p + name[len("model.layers.0.") :]] = tensors[name].clone()
    for prefix in ("model.layers.0.", p):
        tensors[prefix + "self_attn.o_proj.weight"] = torch.zeros(H, H)
    eye, zero = torch.eye(H), torch.zeros(H, H)
    tensors[p + "input_proj.weight"] = torch.cat([zero, eye] if hidden_first else [eye, zero], dim=1)
    tensors[p + "token_layernorm.weight"] = torch.ones(H)
    tensors[p + "final_layernorm.weight"] = tensors["model.norm.weight"].clone()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_drafter_that_agrees_with_its_target_is_always_accepted(
    tmp_path_factory: pytest.TempPathFactory, k: int
) -> None:
    target = write_agreeing(tmp_path_factory.mktemp("agree"))
    llm = LLM(
        target,
        dtype="float64",
        speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": k},
    )
    expected = outputs(LLM(target, dtype="float64"))
    assert outputs(llm) == expected
    stats = llm.metrics.total
    assert stats.num_draft_tokens > 20 and stats.num_accepted_tokens == stats.num_draft_tokens


def test_the_agreement_test_can_fail(tmp_path: Path) -> None:
    """Negative control: the same head with its halves swapped (DeepSeek's order) reads the hidden state
    where it should read the token, and most drafts are rejected."""
    target = write_agreeing(tmp_path / "swapped", hidden_first=False)
    llm = LLM(
        target,
        dtype="float64",
        speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 2},
    )
    outputs(llm)
    assert llm.metrics.total.acceptance_rate < 0.5


def test_mimo_configuration_from_the_checkpoint(mimo: str) -> None:
    llm = LLM(mimo, dtype="float64", speculative_config={"model": mimo})  # method and K from config.json
    assert llm.speculative_config is not None and llm.speculative_config.method == "mtp"
    assert llm.speculative_config.num_speculative_tokens == 1


def test_missing_mimo_tensors_are_named(tmp_path: Path) -> None:
    broken = Path(write_mimo(tmp_path / "broken", nextn=1))
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.mtp_layers.0.input_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \['mtp.0.eh_proj.weight'\]"):
        LLM(
            str(broken),
            speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 1},
        )
    for name in [n for n in tensors if "mtp_layers" in n]:
        del tensors[name]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"has no MTP weights: expected the mimo layout \(model.mtp_layers.0.input_proj"
    ):
        LLM(
            str(broken),
            speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 1},
        )


def write_qwen3_next(path: Path, seed: int = 0) -> str:
    """A tiny Qwen3-Next checkpoint with one MTP layer under ``mtp.*`` (shared ``fc`` and norms).

    This target's decoder layers are all full attention, so the layout and the MTP math are checked
    against an oracle alone (hybrid targets with MTP: ``test_models_hybrid.py``).
    """
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        vocab_size=128,
        hidden_size=H,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=L + 1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        layer_types=["full_attention"] * (L + 1),
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = Qwen3NextForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(path))
    tensors = load_file(str(path / "model.safetensors"))
    for name in [n for n in tensors if n.startswith(f"model.layers.{L}.")]:
        tensors["mtp.layers.0." + name[len(f"model.layers.{L}.") :]] = tensors.pop(name)
    gen = torch.Generator().manual_seed(seed + 1)
    tensors |= {  # Qwen3-Next norms are zero-centred: the scale is 1 + weight
        "mtp.pre_fc_norm_embedding.weight": 0.3 * torch.randn(H, generator=gen),
        "mtp.pre_fc_norm_hidden.weight": 0.3 * torch.randn(H, generator=gen),
        "mtp.fc.weight": 0.3 * torch.randn(H, 2 * H, generator=gen),
        "mtp.norm.weight": 0.3 * torch.randn(H, generator=gen),
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((path / "config.json").read_text())
    raw.update({"num_hidden_layers": L, "layer_types": ["full_attention"] * L, "num_nextn_predict_layers": 1})
    (path / "config.json").write_text(json.dumps(raw))
    return str(path)


def _qwen3_next_oracle(target_dir: str, committed: list[int], k: int) -> list[int]:
    """Qwen3-Next drafts from vLLM's pseudo-code; the MTP block is read by transformers itself."""
    from transformers import AutoModelForCausalLM

    w = dict(load_file(os.path.join(target_dir, "model.safetensors")))
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    raw = json.loads(Path(target_dir, "config.json").read_text())
    raw |= {"num_hidden_layers": L + 1, "layer_types": ["full_attention"] * (L + 1)}
    block = {
        f"model.layers.{L}.{n[len('mtp.layers.0.') :]}": t
        for n, t in w.items()
        if n.startswith("mtp.layers.0.")
    }
    fresh = Path(target_dir, "oracle")
    fresh.mkdir(exist_ok=True)
    save_file(
        {**{n: t for n, t in w.items() if not n.startswith("mtp.")}, **block},
        str(fresh / "model.safetensors"),
    )
    (fresh / "config.json").write_text(json.dumps({**raw, "model_type": "qwen3_next"}))
    full = AutoModelForCausalLM.from_pretrained(str(fresh), dtype=torch.float32).eval()
    rms = target.model.norm.__class__(H, eps=raw["rms_norm_eps"])

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        rms.weight.data = w[f"mtp.{name}.weight"]
        return rms(x)

    with torch.no_grad():
        h = list(target(torch.tensor([committed[:-1]]), output_hidden_states=True).hidden_states[-1][0])
        toks, drafts = committed[1:], []
        for _ in range(k):
            pos = torch.arange(len(toks))[None]
            e = target.get_input_embeddings()(torch.tensor([toks]))  # no masking at position 0
            x = torch.cat(
                [norm(e, "pre_fc_norm_embedding"), norm(torch.stack(h)[None], "pre_fc_norm_hidden")], -1
            )
            x = x @ w["mtp.fc.weight"].T
            mask = torch.ones(len(toks), len(toks), dtype=torch.bool).tril()[None, None]
            out = full.model.layers[L](
                x, attention_mask=mask, position_ids=pos, position_embeddings=full.model.rotary_emb(x, pos)
            )
            out = norm(out[0, -1], "norm")
            d = int(target.lm_head(out).argmax())
            drafts.append(d)
            toks, h = [*toks, d], [*h, out]
    return drafts


def test_qwen3_next_layout(tmp_path: Path) -> None:
    target = write_qwen3_next(tmp_path / "q3n", seed=3)
    expected = outputs(LLM(target, dtype="float32"))
    llm = LLM(
        target,
        dtype="float32",
        speculative_config={"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 2},
    )
    assert llm.engine.drafter.head.layout.family == "qwen3_next"  # type: ignore[union-attr]
    assert outputs(llm) == expected and llm.metrics.total.num_draft_tokens > 0
    check_rebuilds(llm, lambda committed: _qwen3_next_oracle(target, committed, 2))
