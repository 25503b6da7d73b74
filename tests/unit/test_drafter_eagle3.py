"""``eagle3`` from the original and the ``speculators`` checkpoint formats.

Checkpoints are written as they ship: the original (``config.json`` = LlamaConfig of the draft layer +
``draft_vocab_size``, ``midlayer.*``, ``fc``, ``norm``, ``lm_head [Vd, H]``, ``d2t``, ``t2d``) and
speculators' (``speculators_model_type: eagle3``, ``transformer_layer_config``, ``layers.0.*``,
``eagle_aux_hidden_state_layer_ids``). The oracle recomputes every step's drafts from the committed
tokens alone (no cache), so it checks alignment, ``d2t`` mapping and draft-cache rollback at once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, check_greedy_identity, draft_history, one_thread  # noqa: F401 - autouse
from safetensors.torch import save_file

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.eagle import EagleDrafter
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3
from spec_backend.tools.tiny import make_tiny_model


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 6-layer tiny Llama: vLLM's default aux layers (2, 3, 3) exist in it."""
    return make_tiny_model(tmp_path_factory.mktemp("deep"), "llama", num_hidden_layers=6, seed=3)


def greedy_outputs(target: str) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in LLM(target, dtype="float64").generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("k", [1, 3])
def test_original_format_greedy_identity(deep_target: str, tmp_path: Path, k: int) -> None:
    head = write_eagle3(tmp_path / "e3", deep_target, "original", draft_vocab=48)
    spec = {"adaptive_draft_length": False, "method": "eagle3", "model": head, "num_speculative_tokens": k}
    llm = check_greedy_identity(deep_target, greedy_outputs(deep_target), spec, EagleDrafter)
    assert llm.engine.drafter is not None and llm.engine.drafter.hidden_states.aux_layer_ids == (2, 3, 3)


def test_speculators_format_greedy_identity(
    target_dir: str, expected: list[list[int]], tmp_path: Path
) -> None:
    head = write_eagle3(
        tmp_path / "e3", target_dir, "speculators", aux_ids=[0, 1, 2], norm_before_residual=True
    )
    spec = {"adaptive_draft_length": False, "method": "eagle3", "model": head, "num_speculative_tokens": 3}
    llm = check_greedy_identity(target_dir, expected, spec, EagleDrafter)
    assert llm.engine.drafter is not None and llm.engine.drafter.hidden_states.aux_layer_ids == (0, 1, 2)


def _aux_states(target: Any, tokens: list[int], ids: list[int]) -> torch.Tensor:  # [T, 3H]
    """Residual streams entering layers ``ids`` (id L = last layer's pre-norm output), by transformers."""
    layers = target.model.layers
    kept: list[torch.Tensor] = []
    handle = layers[-1].register_forward_hook(
        lambda m, a, out: kept.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        states = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    handle.remove()
    return torch.cat([kept[0][0] if i == len(layers) else states[i][0] for i in ids], dim=-1)


def _oracle(target_dir: str, head_dir: str, committed: list[int], k: int) -> list[int]:
    """EAGLE-3 drafts straight from the pseudo-code, recomputing every row from the committed tokens."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    raw = json.loads(Path(head_dir, "config.json").read_text())
    speculators = "speculators_model_type" in raw
    layer_cfg = raw["transformer_layer_config"] if speculators else raw
    config = LlamaConfig(
        **{n: x for n, x in layer_cfg.items() if n not in ("architectures", "draft_vocab_size")}
    )
    config._attn_implementation = "sdpa"
    w = {
        n.replace("midlayer.", "layers.0."): t
        for n, t in load_file(str(Path(head_dir, "model.safetensors"))).items()
    }
    layer = LlamaDecoderLayer(config, 0).double()
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(
            layer.self_attn,
            name,
            torch.nn.Linear(2 * config.hidden_size, getattr(layer.self_attn, name).out_features, bias=False),
        )
    layer.load_state_dict(
        {n[9:]: t for n, t in w.items() if n.startswith("layers.0.") and "hidden_norm" not in n}, strict=False
    )
    layer = layer.double()
    hidden_norm, norm = LlamaRMSNorm(config.hidden_size).double(), LlamaRMSNorm(config.hidden_size).double()
    hidden_norm.weight.data, norm.weight.data = (
        w["layers.0.hidden_norm.weight"].double(),
        w["norm.weight"].double(),
    )
    rope = LlamaRotaryEmbedding(config)
    n_layers = target.config.num_hidden_layers
    ids = (raw.get("eagle_aux_hidden_state_layer_ids") if speculators else None) or [
        2,
        n_layers // 2,
        n_layers - 3,
    ]
    g = list(_aux_states(target, committed[:-1], ids) @ w["fc.weight"].double().T)  # rows' g
    toks, drafts = committed[1:], []
    if "mask_hidden" in w:  # P-EAGLE: K-1 mask rows in one causal pass, drafts from the last K rows
        mask_g = w["mask_hidden"].double().reshape(-1) @ w["fc.weight"].double().T
        toks, g = [*toks, *[raw["mask_token_id"]] * (k - 1)], [*g, *[mask_g] * (k - 1)]
    for _ in range(1 if "mask_hidden" in w else k):
        e = layer.input_layernorm(target.get_input_embeddings()(torch.tensor([toks])))  # [1, T, H]
        gs = torch.stack(g)[None]  # [1, T, H]
        hn = hidden_norm(gs)
        pos = torch.arange(len(toks))[None]
        mask = torch.ones(len(toks), len(toks), dtype=torch.bool).tril()[None, None]
        x = torch.cat([e, hn], -1)
        attn = layer.self_attn(x, rope(x, pos), mask)[0]
        x = (hn if raw.get("norm_before_residual") else gs) + attn
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        rows = x[0, -k:] if "mask_hidden" in w else x[0, -1:]
        for draft_id in (norm(rows) @ w["lm_head.weight"].double().T).argmax(-1).tolist():  # [Vd] each
            drafts.append(draft_id + int(w["d2t"][draft_id]) if "d2t" in w else draft_id)
        toks, g = [*toks, drafts[-1]], [*g, x[0, -1]]
    return drafts


@pytest.mark.parametrize("fmt", ["original", "speculators", "peagle"])
def test_every_steps_drafts_match_a_rebuild_from_the_committed_tokens(
    target_dir: str, deep_target: str, tmp_path: Path, fmt: str
) -> None:
    target = deep_target if fmt == "original" else target_dir
    head = write_eagle3(
        tmp_path / "e3",
        target,
        fmt,
        draft_vocab=None if fmt == "speculators" else 64,
        aux_ids=[0, 1, 2],
        norm_before_residual=True,
        seed=1,
    )
    llm = LLM(
        target,
        dtype="float64",
        speculative_config={
            "adaptive_draft_length": False,
            "method": "eagle3",
            "model": head,
            "num_speculative_tokens": 3,
        },
    )
    assert getattr(llm.engine.drafter, "mask_token_id", None) == (5 if fmt == "peagle" else None)
    tokens, seen = draft_history(llm, PROMPTS[0], 12)
    assert len(seen) >= 3 and llm.metrics.total.num_draft_tokens > 0
    for n, drafts in seen:
        assert drafts == _oracle(target, head, tokens[:n], 3)[: len(drafts)], f"drafts after {n} tokens"


@pytest.mark.parametrize("k", [1, 3])
def test_parallel_drafting_greedy_identity(
    target_dir: str, expected: list[list[int]], tmp_path: Path, k: int
) -> None:
    """A P-EAGLE checkpoint alone selects eagle3 with parallel drafting; greedy output is unchanged."""
    head = write_eagle3(tmp_path / "pe", target_dir, "peagle", draft_vocab=64, aux_ids=[0, 1, 2])
    llm = check_greedy_identity(
        target_dir, expected, {"model": head, "num_speculative_tokens": k}, EagleDrafter
    )
    assert llm.speculative_config is not None and llm.speculative_config.parallel_drafting
    assert llm.speculative_config.method == "eagle3"


def test_parallel_drafting_needs_a_head_trained_for_it(target_dir: str, tmp_path: Path) -> None:
    head = write_eagle3(tmp_path / "e3", target_dir, "speculators", aux_ids=[0, 1, 2])
    spec = {
        "adaptive_draft_length": False,
        "method": "eagle3",
        "model": head,
        "num_speculative_tokens": 3,
        "parallel_drafting": True,
    }
    with pytest.raises(
        ValueError, match=r"parallel_drafting=True needs a head trained for it .* has no mask_hidden"
    ):
        LLM(target_dir, speculative_config=spec)


def test_drafts_stay_in_the_draft_vocabulary(deep_target: str, tmp_path: Path) -> None:
    head = write_eagle3(tmp_path / "e3", deep_target, "original", draft_vocab=16, seed=2)
    from safetensors.torch import load_file

    allowed = set(load_file(os.path.join(head, "model.safetensors"))["t2d"].nonzero().flatten().tolist())
    llm = LLM(
        deep_target,
        speculative_config={
            "adaptive_draft_length": False,
            "method": "eagle3",
            "model": head,
            "num_speculative_tokens": 3,
        },
    )
    drafter: Any = llm.engine.drafter
    propose, drafted = drafter.propose, set()

    def spy(inputs: Any) -> Any:
        out = propose(inputs)
        for b, n in enumerate(out.num_draft_tokens):
            drafted.update(out.token_ids[b, :n].tolist())
        return out

    drafter.propose = spy
    llm.generate(PROMPTS, SamplingParams(temperature=1.0, seed=0, max_tokens=16))
    assert drafted and drafted <= allowed


def _edit(head: str, **changes: Any) -> None:
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(head, "model.safetensors"))
    for name, value in changes.items():
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    save_file(tensors, os.path.join(head, "model.safetensors"))


def test_bad_checkpoints_are_refused(target_dir: str, tmp_path: Path) -> None:
    spec: dict[str, Any] = {"adaptive_draft_length": False, "method": "eagle3", "num_speculative_tokens": 2}
    head = write_eagle3(tmp_path / "default_ids", target_dir, "original")
    with pytest.raises(
        ValueError, match=r"3 layer ids in 0\.\.2 \(the target has 2 layers\), got \[2, 1, -1\]"
    ):
        LLM(target_dir, speculative_config={**spec, "model": head})
    head = write_eagle3(tmp_path / "shapes", target_dir, "speculators", aux_ids=[0, 1, 2])
    _edit(head, **{"norm.weight": None, "fc.weight": torch.zeros(32, 64)})
    with pytest.raises(
        ValueError, match=r"missing \['norm.weight'\].*fc.weight: \[32, 64\] \(expected \[32, 96\]\)"
    ):
        LLM(target_dir, speculative_config={**spec, "model": head})
    head = write_eagle3(tmp_path / "d2t", target_dir, "speculators", draft_vocab=16, aux_ids=[0, 1, 2])
    _edit(head, d2t=torch.full((16,), 120, dtype=torch.int64))
    with pytest.raises(
        ValueError, match=r"d2t must map the 16 draft ids to distinct target ids in \[0, 128\)"
    ):
        LLM(target_dir, speculative_config={**spec, "model": head})
    head = write_eagle3(tmp_path / "t2d", target_dir, "speculators", draft_vocab=16, aux_ids=[0, 1, 2])
    _edit(head, t2d=torch.ones(128, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"t2d \(shape \[128\]\) must be a bool\[128\] mask"):
        LLM(target_dir, speculative_config={**spec, "model": head})


def test_an_eagle1_checkpoint_is_not_an_eagle3_one(target_dir: str, tmp_path: Path) -> None:
    from spec_backend.testing.fixtures.draft_checkpoints import write_eagle1

    head = write_eagle1(tmp_path / "eagle1", target_dir, bias=False)
    with pytest.raises(
        ValueError,
        match=r"EAGLE-3 checkpoint .* missing \[.*'layers.0.hidden_norm.weight'.*"
        r"fc.weight: \[32, 64\] \(expected \[32, 96\]\)",
    ):
        LLM(
            target_dir,
            speculative_config={
                "adaptive_draft_length": False,
                "method": "eagle3",
                "model": head,
                "num_speculative_tokens": 2,
            },
        )
