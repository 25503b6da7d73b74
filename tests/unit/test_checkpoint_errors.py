"""Draft checkpoints that do not parse, or that do not describe the model they claim to, are refused at
``LLM(...)`` with the folder, the value found and what is needed (issue 36, items 7 and 8).

Every checkpoint is a tiny random one in its method's real on-disk format
(``spec_backend.testing.fixtures.draft_checkpoints``, ``make_tiny_model``), then damaged the way a user's
can be: a truncated ``model.safetensors``, a ``config.json`` that is not JSON, a missing tensor, a config that
disagrees with its tensors, weights stored as integers.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import one_thread  # noqa: F401 - autouse
from safetensors.torch import load_file, save_file

from spec_backend.engine import LLM, ModelLoadError
from spec_backend.testing.fixtures import draft_checkpoints as ckpt
from spec_backend.tools.tiny import make_tiny_model

# conftest's target: a tiny Llama with vocabulary 128, hidden size 32, 2 layers, 512 positions
Writer = Callable[[Path, str], str]
DRAFTS: dict[str, tuple[Writer, dict[str, Any]]] = {
    "draft_model": (lambda p, t: make_tiny_model(p, "qwen2", seed=5), {}),
    "eagle": (lambda p, t: ckpt.write_eagle1(p, t, bias=False), {}),
    "eagle3": (lambda p, t: ckpt.write_eagle3(p, t, "speculators", aux_ids=[0, 1, 2]), {}),
    "dflash": (lambda p, t: ckpt.write_dflash(p, t, layers=1, target_layer_ids=[0, 1]), {}),
    "medusa": (lambda p, t: ckpt.write_medusa(p, 32, 128, 2, "vllm"), {}),
    "mlp_speculator": (lambda p, t: ckpt.write_mlp_speculator(p, 32, 128, 16, 2, tied=False), {}),
}


def _spec(method: str, folder: str) -> dict[str, Any]:
    return {"method": method, "model": folder, "num_speculative_tokens": 2, **DRAFTS[method][1]}


def _edit(folder: str, tensors: dict[str, torch.Tensor | None], config: dict[str, Any] | None = None) -> None:
    """Rewrite ``folder``'s ``model.safetensors`` (``None`` drops a tensor) and update its config."""
    path = os.path.join(folder, "model.safetensors")
    weights = load_file(path)
    for name, value in tensors.items():
        if value is None:
            del weights[name]
        else:
            weights[name] = value
    save_file(weights, path, metadata={"format": "pt"})
    if config:
        cfg = json.loads(Path(folder, "config.json").read_text())
        Path(folder, "config.json").write_text(json.dumps({**cfg, **config}))


@pytest.mark.parametrize("method", list(DRAFTS))
def test_every_method_loads_its_undamaged_checkpoint(target_dir: str, tmp_path: Path, method: str) -> None:
    """The control: the writers' checkpoints load, so each refusal below is the damage's doing."""
    folder = DRAFTS[method][0](tmp_path / method, target_dir)
    assert LLM(target_dir, max_model_len=64, speculative_config=_spec(method, folder)).engine.drafter


@pytest.mark.parametrize("method", list(DRAFTS))
def test_a_truncated_safetensors_file_is_named(target_dir: str, tmp_path: Path, method: str) -> None:
    folder = DRAFTS[method][0](tmp_path / method, target_dir)
    weights = Path(folder, "model.safetensors")
    weights.write_bytes(weights.read_bytes()[:-100])  # an interrupted download
    message = (
        re.escape(repr(folder))
        + r": model\.safetensors is not a readable safetensors file: its tensors need "
        r"\d+ bytes of data after the header, the file holds \d+\. It is truncated or damaged .*"
        r"download or save the checkpoint again"
    )
    with pytest.raises(ModelLoadError, match=message):
        LLM(target_dir, max_model_len=64, speculative_config=_spec(method, folder))


@pytest.mark.parametrize("method", list(DRAFTS))
def test_a_config_that_is_not_json_is_named(target_dir: str, tmp_path: Path, method: str) -> None:
    folder = DRAFTS[method][0](tmp_path / method, target_dir)
    Path(folder, "config.json").write_text('{"hidden_size": 32,')  # cut short
    message = (
        r"speculative_config\['model'\] folder " + re.escape(repr(folder)) + r": config\.json is not valid "
        r"JSON \(Expecting property name enclosed in double quotes at line 1, column 20\); .*download or "
        r"save the checkpoint again"
    )
    with pytest.raises(ModelLoadError, match=message):
        LLM(target_dir, max_model_len=64, speculative_config=_spec(method, folder))


def test_the_head_reader_names_a_config_that_is_not_json(tmp_path: Path) -> None:
    """``read_config`` (every draft head's reader) names the folder even when called directly."""
    from spec_backend.models.checkpoint import read_config

    (tmp_path / "config.json").write_text("not json")
    with pytest.raises(ModelLoadError, match=r"EAGLE checkpoint '.*': config\.json is not valid JSON"):
        read_config("EAGLE", str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match=r"config\.json must hold a JSON object, got list"):
        read_config("EAGLE", str(tmp_path))


def test_a_target_whose_config_is_not_json_is_named(tmp_path: Path) -> None:
    target = make_tiny_model(tmp_path / "target", "llama")
    Path(target, "config.json").write_text("{")
    with pytest.raises(ModelLoadError, match=r"model folder '.*target': config\.json is not valid JSON"):
        LLM(target)


# -- item 8: drafts that parse but do not describe their model -------------------------------------------

#: one floating-point weight of each method's checkpoint: its stored name, and the loader's name for it
FLOAT_WEIGHT = {
    "draft_model": ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
    "eagle": ("fc.weight", "fc.weight"),
    "eagle3": ("fc.weight", "fc.weight"),
    "dflash": ("fc.weight", "fc.weight"),
    "medusa": ("blocks.0.layers.0.weight", "blocks.0.0.weight"),
    "mlp_speculator": ("speculator.proj.0.weight", "proj.0.weight"),
}


@pytest.mark.parametrize("method", list(DRAFTS))
def test_floating_weights_stored_as_integers_are_refused(
    target_dir: str, tmp_path: Path, method: str
) -> None:
    """Loading would cast them (``3`` becomes ``3.0``): the draft would run on garbage, silently."""
    folder = DRAFTS[method][0](tmp_path / method, target_dir)
    name, shown = FLOAT_WEIGHT[method]
    weight = load_file(os.path.join(folder, "model.safetensors"))[name]
    _edit(folder, {name: (weight * 10).round().to(torch.int8)})
    message = (
        re.escape(repr(folder))
        + r" stores floating-point weights as integers: \['"
        + re.escape(shown)
        + r" \(I8\)'\]; the model needs F32, F16 or BF16 tensors there"
    )
    with pytest.raises(ModelLoadError, match=message):
        LLM(target_dir, max_model_len=64, speculative_config=_spec(method, folder))


def test_a_target_with_integer_weights_is_refused(tmp_path: Path) -> None:
    target = make_tiny_model(tmp_path / "target", "llama")
    _edit(target, {"lm_head.weight": torch.zeros(128, 32, dtype=torch.int32)})
    with pytest.raises(ModelLoadError, match=r"integers: \['lm_head\.weight \(I32\)'\]"):
        LLM(target)


def test_integer_tensors_of_the_format_are_accepted(target_dir: str, tmp_path: Path) -> None:
    """EAGLE-3's ``d2t`` (int64) and ``t2d`` (bool) are integers by design."""
    head = ckpt.write_eagle3(tmp_path / "e3", target_dir, "speculators", draft_vocab=48, aux_ids=[0, 1, 2])
    stored = load_file(os.path.join(head, "model.safetensors"))
    assert stored["d2t"].dtype == torch.int64 and stored["t2d"].dtype == torch.bool
    assert LLM(target_dir, speculative_config=_spec("eagle3", head)).engine.drafter is not None


def test_a_draft_model_missing_weights_is_refused(target_dir: str, tmp_path: Path) -> None:
    """transformers would initialise the missing tensors at random and only log it."""
    draft = make_tiny_model(tmp_path / "draft", "qwen2", seed=5)
    _edit(draft, {"model.layers.1.mlp.up_proj.weight": None, "model.norm.weight": None})
    message = (
        r"model folder " + re.escape(repr(draft)) + r" lacks 2 weight\(s\) the model needs: "
        r"\['model\.layers\.1\.mlp\.up_proj\.weight', 'model\.norm\.weight'\]; transformers would fill "
        r"them at random"
    )
    with pytest.raises(ModelLoadError, match=message):
        LLM(target_dir, speculative_config=_spec("draft_model", draft))


def test_a_tied_lm_head_is_not_missing(target_dir: str, tmp_path: Path) -> None:
    draft = make_tiny_model(tmp_path / "draft", "qwen2", seed=5, tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(os.path.join(draft, "model.safetensors"))
    assert LLM(target_dir, speculative_config=_spec("draft_model", draft)).engine.drafter is not None


def test_a_draft_model_with_fewer_positions_than_max_model_len_is_refused(
    target_dir: str, tmp_path: Path
) -> None:
    draft = make_tiny_model(tmp_path / "draft", "qwen2", seed=5, max_position_embeddings=64)
    message = (
        r"the draft model " + re.escape(repr(draft)) + r" has max_position_embeddings=64, fewer than the "
        r"engine's max_model_len=128; use a draft model with at least 128 positions, or pass "
        r"LLM\(max_model_len=64\)"
    )
    with pytest.raises(ValueError, match=message):
        LLM(target_dir, max_model_len=128, speculative_config=_spec("draft_model", draft))
    with pytest.raises(ValueError, match="max_model_len=512"):  # the default: the target's 512 positions
        LLM(target_dir, speculative_config=_spec("draft_model", draft))
    assert LLM(target_dir, max_model_len=64, speculative_config=_spec("draft_model", draft)).engine.drafter


def test_an_eagle_config_whose_vocab_size_is_not_the_targets_is_refused(
    target_dir: str, tmp_path: Path
) -> None:
    head = ckpt.write_eagle1(tmp_path / "eagle", target_dir, bias=False)
    _edit(head, {}, config={"vocab_size": 100})
    with pytest.raises(
        ValueError,
        match=r"EAGLE head '.*' has vocab_size 100 in its config\.json, the target has 128 tokens; an "
        r"EAGLE-1 head drafts with the target's LM head",
    ):
        LLM(target_dir, speculative_config=_spec("eagle", head))


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_shipped_embeddings_must_cover_the_vocabulary(target_dir: str, tmp_path: Path, method: str) -> None:
    """An ``embed_tokens`` with fewer rows than ``vocab_size`` would fail (or read past it) at run time."""
    head = DRAFTS[method][0](tmp_path / method, target_dir)
    _edit(head, {"embed_tokens.weight": torch.randn(100, 32)})
    kind = "EAGLE-3" if method == "eagle3" else "EAGLE"
    message = (
        f"{kind} checkpoint " + re.escape(repr(head)) + r": embed_tokens\.weight has 100 rows "
        r"\(shape \[100, 32\]\) but vocab_size is 128; the config\.json and the weights must describe the "
        r"same vocabulary"
    )
    with pytest.raises(ModelLoadError, match=message):
        LLM(target_dir, speculative_config=_spec(method, head))


def test_eagle3_draft_vocab_size_must_match_its_tensors(target_dir: str, tmp_path: Path) -> None:
    head = ckpt.write_eagle3(tmp_path / "d2t", target_dir, "speculators", draft_vocab=48, aux_ids=[0, 1, 2])
    _edit(head, {"d2t": torch.zeros(40, dtype=torch.int64), "t2d": None})
    with pytest.raises(ModelLoadError, match=r"d2t has 40 rows \(shape \[40\]\) but draft_vocab_size is 48"):
        LLM(target_dir, speculative_config=_spec("eagle3", head))
    head = ckpt.write_eagle3(tmp_path / "lm", target_dir, "speculators", draft_vocab=48, aux_ids=[0, 1, 2])
    _edit(head, {}, config={"draft_vocab_size": 64})
    with pytest.raises(
        ModelLoadError, match=r"lm_head\.weight has 48 rows \(shape \[48, 32\]\) but draft_vocab_size is 64"
    ):
        LLM(target_dir, speculative_config=_spec("eagle3", head))
