"""``mlp_speculator`` from IBM's format (tied and untied weights, ``speculator.`` prefix): greedy identity,
the first drafts against the published step written out by hand, and refusals."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import GREEDY, PROMPTS, check_greedy_identity, one_thread, record_drafts  # noqa: F401 - autouse
from safetensors.torch import load_file

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.mlp_speculator import MLPSpeculatorDrafter
from spec_backend.testing.fixtures import draft_checkpoints

H, V, INNER, N = 32, 128, 24, 3


def write_mlp(path: Path, tied: bool, prefix: str = "speculator.", seed: int = 0) -> str:
    return draft_checkpoints.write_mlp_speculator(path, H, V, INNER, N, tied, prefix, seed)


def _spec(path: str, k: int) -> dict[str, Any]:
    return {
        "adaptive_draft_length": False,
        "method": "mlp_speculator",
        "model": path,
        "num_speculative_tokens": k,
    }


@pytest.mark.parametrize(("tied", "k"), [(False, 3), (True, 3), (False, 1)])
def test_greedy_identity(
    target_dir: str, expected: list[list[int]], tmp_path: Path, tied: bool, k: int
) -> None:
    spec = _spec(write_mlp(tmp_path / "mlp", tied), k)
    check_greedy_identity(target_dir, expected, spec, MLPSpeculatorDrafter)


@pytest.mark.parametrize("tied", [False, True])
def test_first_drafts_follow_the_published_step(target_dir: str, tmp_path: Path, tied: bool) -> None:
    from transformers import AutoModelForCausalLM

    path = write_mlp(tmp_path / "mlp", tied, seed=3)
    w = {
        k.removeprefix("speculator."): v.double()
        for k, v in load_file(str(Path(path, "model.safetensors"))).items()
    }
    llm = LLM(target_dir, dtype="float64", speculative_config=_spec(path, N))
    seen = record_drafts(llm)
    first = (
        llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=6))[0].outputs[0].token_ids[0]
    )
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        s = target(torch.tensor([PROMPTS[0]]), output_hidden_states=True).hidden_states[-1][0, -1]  # [H]
    sw = 0.5 ** (0.5 / N)
    ew = math.sqrt((1 - sw**2) * INNER / 2)

    def rms(x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean() + 1e-6)

    if tied:  # scale_input is on in the tied checkpoint
        s = rms(s) / math.sqrt(2)
    tok, want = first, []
    for i in range(N):
        j, p = (0, min(i, 1)) if tied else (i, i)
        s = w[f"proj.{p}.weight"] @ s + w[f"emb.{j}.weight"][tok] * (ew / sw)
        s = torch.nn.functional.gelu(rms(s) * w[f"ln.{j}.weight"] + w[f"ln.{j}.bias"])
        tok = int((w[f"head.{j}.weight"] @ s).argmax())
        want.append(tok)
    assert seen[0] == want


def test_refusals(target_dir: str, tmp_path: Path) -> None:
    path = write_mlp(tmp_path / "mlp", tied=False)
    with pytest.raises(
        ValueError, match="num_speculative_tokens=4 must be a multiple of the draft model's n_predict=3"
    ):
        LLM(target_dir, speculative_config=_spec(path, 4))  # vLLM's rule, from the checkpoint's config.json
    with pytest.raises(ValueError, match="num_speculative_tokens=6 exceeds the MLPSpeculator's n_predict=3"):
        LLM(target_dir, speculative_config=_spec(path, 6))  # a multiple, but these heads are not reused
    cfg = json.loads(Path(path, "config.json").read_text())
    Path(path, "config.json").write_text(json.dumps({**cfg, "emb_dim": 64}))
    with pytest.raises(ValueError, match="needs emb_dim=32, vocab_size=128"):
        LLM(target_dir, speculative_config=_spec(path, 2))
