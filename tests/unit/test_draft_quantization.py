"""``speculative_config['quantization']`` on the embedded engine: the draft weights of ``draft_model`` and
of the EAGLE-family heads run weight-only int8 / int4 on the reference backend (their linear layers are
packed), the output stays the target's (greedy identity, as for any drafter), and the settings the engine
cannot honour are refused by name instead of being ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_fixtures import check_greedy_identity, one_thread  # noqa: F401 - autouse

from spec_backend.cpu.int4_linear import Int4Linear, PackedLinear
from spec_backend.cpu.int8_linear import Int8Linear
from spec_backend.engine import LLM
from spec_backend.proposers.draft_model import DraftModelDrafter
from spec_backend.proposers.eagle import EagleDrafter
from spec_backend.testing.fixtures import draft_checkpoints
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3

KINDS = {"int4": Int4Linear, "int8": Int8Linear}


def packed(module: Any) -> list[PackedLinear]:
    return [m for m in module.modules() if isinstance(m, PackedLinear)]


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_eagle3_head(target_dir: str, expected: list[list[int]], tmp_path: Path, kind: str) -> None:
    head = write_eagle3(tmp_path / "e3", target_dir, "speculators", aux_ids=[0, 1, 2])
    spec = {
        "adaptive_draft_length": False,
        "method": "eagle3",
        "model": head,
        "num_speculative_tokens": 3,
        "quantization": kind,
    }
    llm = check_greedy_identity(target_dir, expected, spec, EagleDrafter)
    layers = packed(llm.engine.drafter.head)
    assert len(layers) == 9 and all(type(m) is KINDS[kind] for m in layers)  # fc, q k v o, MLP, lm_head
    assert not packed(llm.model)  # the target is not quantized by the draft's setting


def test_unquantized_head_is_the_default(target_dir: str, expected: list[list[int]], tmp_path: Path) -> None:
    head = write_eagle3(tmp_path / "e3", target_dir, "speculators", aux_ids=[0, 1, 2])
    spec = {"adaptive_draft_length": False, "method": "eagle3", "model": head, "num_speculative_tokens": 3}
    assert not packed(check_greedy_identity(target_dir, expected, spec, EagleDrafter).engine.drafter.head)


def test_quantized_draft_model(target_dir: str, expected: list[list[int]]) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": target_dir,
        "num_speculative_tokens": 3,
        "quantization": "int8",
    }
    llm = check_greedy_identity(target_dir, expected, spec, DraftModelDrafter)
    layers = packed(llm.engine.drafter.model)
    assert len(layers) == 2 * 7 and all(type(m) is Int8Linear for m in layers)
    assert llm.metrics.total.num_accepted_tokens > 0  # the target drafting for itself, rounded: accepted
    assert not packed(llm.model)


REFUSALS = {
    "eagle3": r"speculative_config\['quantization'\]='awq' is not available on backend 'cpu': "
    r"allowed are None or one of \['int4', 'int8'\]",
    "medusa": r"\['quantization'\]='int8' applies to the draft weights of draft_model, eagle, .*"
    r"method='medusa' runs its draft weights unquantized",
}


@pytest.mark.parametrize("method", list(REFUSALS))
def test_unknown_mode_and_unsupported_methods_are_refused(
    target_dir: str, tmp_path: Path, method: str
) -> None:
    if method == "eagle3":
        model, mode = write_eagle3(tmp_path / "e3", target_dir, "speculators", aux_ids=[0, 1, 2]), "awq"
    else:
        model, mode = draft_checkpoints.write_medusa(tmp_path / "medusa", 32, 128, 2, "vllm"), "int8"
    spec = {
        "adaptive_draft_length": False,
        "method": method,
        "model": model,
        "num_speculative_tokens": 2,
        "quantization": mode,
    }
    with pytest.raises(ValueError, match=REFUSALS[method]):
        LLM(target_dir, speculative_config=spec)
