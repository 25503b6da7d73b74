"""``eagle`` (EAGLE-1) from the published checkpoint format: greedy identity and an oracle alignment check.

The checkpoint is written exactly as EAGLE-1 ships: ``config.json`` (a LlamaConfig with
``num_hidden_layers: 1`` and ``bias``) and ``model.safetensors`` with ``fc.weight [H, 2H]``, optional
``fc.bias``, ``layers.0.*`` without ``input_layernorm``, and no embeddings (shared with the target).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, check_greedy_identity, one_thread, record_drafts  # noqa: F401 - autouse
from safetensors.torch import save_file

from spec_backend.config.token_tree import parse_token_tree
from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.eagle import EagleDrafter
from spec_backend.proposers.tree_build import depths_of, dynamic_tree, fill_static, static_shape
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle1

TREE = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"  # 6 nodes, 3 deep


@pytest.mark.parametrize(("k", "bias"), [(1, True), (3, False), (3, True)])
def test_greedy_identity(
    target_dir: str, expected: list[list[int]], tmp_path: Path, k: int, bias: bool
) -> None:
    head = write_eagle1(tmp_path / "eagle", target_dir, bias)
    spec = {"adaptive_draft_length": False, "method": "eagle", "model": head, "num_speculative_tokens": k}
    check_greedy_identity(target_dir, expected, spec, EagleDrafter)


def _reference(
    target_dir: str, head_dir: str, prompt: list[int], first: int
) -> Callable[[Sequence[int]], Any]:
    """EAGLE-1 straight from the pseudo-code, no cache: the head's logits after the committed tokens and
    then ``path`` (each draft fed with the output of the row before it), every row recomputed."""
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

    @torch.no_grad()
    def logits_after(path: Sequence[int]) -> torch.Tensor:  # [V]
        toks, hid = [*prompt[1:], first], list(h)
        for i in range(len(path) + 1):
            e = target.get_input_embeddings()(torch.tensor([toks]))  # [1, T, H]
            x = torch.cat([e, torch.stack(hid)[None]], -1) @ w["fc.weight"].T + w.get("fc.bias", 0)
            pos = torch.arange(len(toks))[None]
            mask = torch.ones(len(toks), len(toks), dtype=torch.bool).tril()[None, None]
            out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rope(x, pos))[0]
            if i < len(path):
                toks, hid = [*toks, path[i]], [*hid, out[-1]]
        logits: torch.Tensor = target.get_output_embeddings()(out[-1])
        return logits

    return logits_after


def _reference_drafts(target_dir: str, head_dir: str, prompt: list[int], first: int, k: int) -> list[int]:
    logits_after, drafts = _reference(target_dir, head_dir, prompt, first), []
    for _ in range(k):
        drafts.append(int(logits_after(drafts).argmax()))
    return drafts


def test_first_drafts_match_the_pseudo_code(target_dir: str, tmp_path: Path) -> None:
    head = write_eagle1(tmp_path / "eagle", target_dir, bias=True, seed=1)
    llm = LLM(
        target_dir,
        dtype="float64",
        speculative_config={
            "adaptive_draft_length": False,
            "method": "eagle",
            "model": head,
            "num_speculative_tokens": 3,
        },
    )
    seen = record_drafts(llm)
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=6))[0].outputs[0]
    assert seen[0] == _reference_drafts(target_dir, head, PROMPTS[0], out.token_ids[0], 3)


def test_every_tree_node_is_ranked_on_its_own_path(target_dir: str, tmp_path: Path) -> None:
    """A branching tree drafted level by level under tree attention: the head's logits after each parent
    are the pseudo-code's after that parent's path (float64, 1e-9; siblings fed in one forward must not
    see each other), and each node is the rank-th token of its parent's."""
    head = write_eagle1(tmp_path / "eagle", target_dir, bias=True, seed=1)
    spec = {
        "adaptive_draft_length": False,
        "method": "eagle",
        "model": head,
        "num_speculative_tokens": 3,
        "speculative_token_tree": TREE,
    }
    llm = LLM(target_dir, dtype="float64", speculative_config=spec)
    seen, scored = record_drafts(llm, tree=True), []
    drafter: Any = llm.engine.drafter
    logits = drafter.head.logits
    drafter.head.logits = lambda out, step=0: scored.append(logits(out, step)) or scored[-1]
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=6))[0].outputs[0]
    parents, ranks = static_shape(parse_token_tree(TREE))
    logits_after = _reference(target_dir, head, PROMPTS[0], out.token_ids[0])
    want = fill_static(parents, ranks, lambda _, path: logits_after(path))
    assert seen[0] == list(want.tokens)
    for parent, got in zip(dict.fromkeys(parents), scored, strict=False):  # parents in the order asked
        torch.testing.assert_close(
            got[0].double(), logits_after(want.path(parent)).double(), atol=1e-9, rtol=0
        )


@pytest.mark.parametrize(("top_k", "nodes"), [(2, 10), (3, 9)])  # every grown node; a pruned tree
def test_the_dynamic_tree_is_eagle2_on_the_pseudo_code(
    target_dir: str, tmp_path: Path, top_k: int, nodes: int
) -> None:
    """EAGLE-2 grown by the batched drafter (tree attention per level, frontier and ancestors fed) equals
    the host reference ``dynamic_tree`` over the pseudo-code's distributions after each path."""
    head = write_eagle1(tmp_path / "eagle", target_dir, bias=True, seed=2)
    spec = {
        "adaptive_draft_length": False,
        "method": "eagle",
        "model": head,
        "num_speculative_tokens": 3,
        "tree_top_k": top_k,
    }
    llm = LLM(target_dir, dtype="float64", speculative_config={**spec, "tree_nodes": nodes})
    drafter: Any = llm.engine.drafter
    grow, seen = drafter.propose_dynamic_tree, []
    drafter.propose_dynamic_tree = lambda *a: seen.append(grow(*a)) or seen[-1]
    prompts = [PROMPTS[0], PROMPTS[1]]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6))
    assert seen[0].token_ids.shape == (2, nodes)
    for b, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        logits_after = _reference(target_dir, head, prompt, out.outputs[0].token_ids[0])
        want = dynamic_tree(lambda _, path, f=logits_after: torch.softmax(f(path), -1), 3, top_k, nodes)
        assert seen[0].tree_parents[b] == want.parents
        assert seen[0].token_ids[b].tolist() == list(want.tokens)
    assert max(depths_of(want.parents)) > 1 and sorted(set(want.parents)) != [-1]


def test_bad_checkpoint_is_refused(target_dir: str, tmp_path: Path) -> None:
    head = Path(write_eagle1(tmp_path / "eagle", target_dir, bias=False))
    from safetensors.torch import load_file

    tensors = load_file(str(head / "model.safetensors"))
    del tensors["layers.0.mlp.up_proj.weight"]
    tensors["fc.weight"] = tensors["fc.weight"][:, :10].contiguous()
    save_file(tensors, str(head / "model.safetensors"))
    spec = {
        "adaptive_draft_length": False,
        "method": "eagle",
        "model": str(head),
        "num_speculative_tokens": 2,
    }
    with pytest.raises(ValueError, match=r"missing \['layers.0.mlp.up_proj.weight'\].*fc.weight: \[32, 10\]"):
        LLM(target_dir, speculative_config=spec)
