"""DeepSeek-V3 (multi-head latent attention, mixture of experts) with the drafters it can have (issue 39):
a draft model, and its own MTP layer in the published layout (``model.layers.{L}.{enorm, hnorm,
eh_proj, shared_head.norm}`` and an MLA decoder block). ngram, plain greedy against transformers and
batch-independent sampling are in ``test_models_sliding.py``.

Both drafters are built to agree with the target often (``make_bigram_draft``; an MTP layer whose
projection passes the next token's embedding through a block that adds nothing), so drafts are accepted
and rejected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import GREEDY, PROMPTS, one_thread  # noqa: F401  (one_thread: autouse)
from safetensors.torch import load_file, save_file

from spec_backend.engine import LLM
from spec_backend.testing.fixtures.families import FAMILIES, make_bigram_draft, make_family_model


def _with_mtp(directory: Path) -> str:
    """The tiny DeepSeek-V3 family model with one MTP layer after its ``L`` decoder layers."""
    config, model_cls = FAMILIES["deepseek_v3"]()
    layers = int(config.num_hidden_layers)
    config.num_hidden_layers = layers + 1
    torch.manual_seed(0)
    model = model_cls(config).float()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(directory))
    tensors = load_file(str(directory / "model.safetensors"))
    hidden, block = int(config.hidden_size), f"model.layers.{layers}."
    for name in [n for n in tensors if n.startswith(block) and ("o_proj" in n or "down_proj" in n)]:
        tensors[name].zero_()  # the block adds nothing to its input
    tensors |= {
        block + "enorm.weight": torch.ones(hidden),
        block + "hnorm.weight": torch.ones(hidden),
        block + "eh_proj.weight": torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1),
        block + "shared_head.norm.weight": tensors["model.norm.weight"].clone(),
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(
        json.dumps({**raw, "num_hidden_layers": layers, "num_nextn_predict_layers": 1})
    )
    return str(directory)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("deepseek")
    target = make_family_model(root / "target", "deepseek_v3")
    return {
        "target": target,
        "draft": make_bigram_draft(target, root / "draft"),
        "mtp": _with_mtp(root / "mtp"),
    }


def greedy(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("method", ["draft_model", "mtp"])
def test_greedy_speculative_equals_plain(method: str, dirs: dict[str, str]) -> None:
    path = dirs["mtp" if method == "mtp" else "target"]
    spec: dict[str, Any] = (
        {"adaptive_draft_length": False, "method": "mtp", "num_speculative_tokens": 2}
        if method == "mtp"
        else {
            "adaptive_draft_length": False,
            "method": "draft_model",
            "model": dirs["draft"],
            "num_speculative_tokens": 3,
        }
    )
    plain = greedy(LLM(path, dtype="float32", log_stats_interval=None))
    llm = LLM(path, dtype="float32", speculative_config=spec, log_stats_interval=None)
    assert greedy(llm) == plain
    total = llm.metrics.total
    assert 0 < total.num_accepted_tokens < total.num_draft_tokens
