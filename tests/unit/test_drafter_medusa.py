"""``medusa`` from vLLM's and FasterDecoding's safetensors layouts: greedy identity, oracle drafts, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, check_greedy_identity, one_thread, record_drafts  # noqa: F401 - autouse

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.medusa import MedusaDrafter
from spec_backend.testing.fixtures import draft_checkpoints

H, V, HEADS = 32, 128, 3


def write_medusa(path: Path, layout: str, seed: int = 0) -> str:
    return draft_checkpoints.write_medusa(path, H, V, HEADS, layout, seed)


@pytest.mark.parametrize(("layout", "k"), [("vllm", 3), ("fasterdecoding", 1), ("fasterdecoding", 3)])
def test_greedy_identity(
    target_dir: str, expected: list[list[int]], tmp_path: Path, layout: str, k: int
) -> None:
    heads = write_medusa(tmp_path / "medusa", layout)
    spec = {"adaptive_draft_length": False, "method": "medusa", "model": heads, "num_speculative_tokens": k}
    check_greedy_identity(target_dir, expected, spec, MedusaDrafter)


def test_first_drafts_are_the_heads_on_the_last_prompt_state(target_dir: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    heads = write_medusa(tmp_path / "medusa", "vllm", seed=2)
    w = {k: t.double() for k, t in load_file(str(Path(heads, "model.safetensors"))).items()}
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        h = target(torch.tensor([PROMPTS[0]]), output_hidden_states=True).hidden_states[-1][0, -1]  # [H]
    want = []
    for i in range(HEADS):
        x = h + torch.nn.functional.silu(
            w[f"blocks.{i}.layers.0.weight"] @ h + w[f"blocks.{i}.layers.0.bias"]
        )
        want.append(int((w[f"lm_heads.{i}.weight"] @ x).argmax()))
    llm = LLM(
        target_dir,
        dtype="float64",
        speculative_config={
            "adaptive_draft_length": False,
            "method": "medusa",
            "model": heads,
            "num_speculative_tokens": HEADS,
        },
    )
    seen = record_drafts(llm)
    llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=6))
    assert seen[0] == want


def test_errors(target_dir: str, tmp_path: Path) -> None:
    heads = write_medusa(tmp_path / "medusa", "vllm")
    with pytest.raises(ValueError, match=r"num_speculative_tokens=4 exceeds the checkpoint's 3 Medusa heads"):
        LLM(
            target_dir,
            speculative_config={
                "adaptive_draft_length": False,
                "method": "medusa",
                "model": heads,
                "num_speculative_tokens": 4,
            },
        )
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1}))
    (pickled / "medusa_lm_head.pt").write_bytes(b"not loaded")
    with pytest.raises(
        ValueError, match=r"no \.safetensors weights \(found pickles \['medusa_lm_head\.pt'\]"
    ):
        LLM(
            target_dir,
            speculative_config={
                "adaptive_draft_length": False,
                "method": "medusa",
                "model": str(pickled),
                "num_speculative_tokens": 2,
            },
        )
