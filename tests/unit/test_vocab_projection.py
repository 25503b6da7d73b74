"""The tall-skinny projection equals F.linear at every row count, and the cpu backend installs it where
the rows set is not empty (pinned here: ``SPEC_BACKEND_FEW_ROWS=tall``; measured: ``test_few_rows``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from spec_backend.backends.base import ModelOptions
from spec_backend.cpu import CpuBackend
from spec_backend.cpu.few_rows import ROWS_ENV
from spec_backend.cpu.vocab_projection import (
    TallSkinnyProjection,
    install_small_batch_linears,
    install_tall_skinny_projection,
)


@pytest.fixture(autouse=True)
def _tall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROWS_ENV, "tall")


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 40, 63, 64, 65, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_linear_for_every_row_count(rows: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    linear = nn.Linear(32, 1000, bias=bias, dtype=torch.float64)
    hidden = torch.randn(1, rows, 32, generator=gen, dtype=torch.float64)  # [B, Q, H]
    got = TallSkinnyProjection(linear, frozenset(range(1, 65)))(hidden)  # [B, Q, V]
    assert got.shape == (1, rows, 1000)
    torch.testing.assert_close(got, F.linear(hidden, linear.weight, linear.bias), rtol=1e-12, atol=1e-12)


def test_cpu_backend_installs_it_keeping_tied_weights(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from spec_backend.tools.tiny import make_tiny_model

    folder = make_tiny_model(tmp_path / "tiny", tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        before = model(input_ids=ids).logits  # [1, 5, V]
        CpuBackend().prepare_model(model, ModelOptions())
        head = model.get_output_embeddings()
        assert isinstance(head, TallSkinnyProjection)
        assert head.weight is model.get_input_embeddings().weight  # still tied
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_models_without_a_linear_head_are_left_alone() -> None:
    class NoHead(nn.Module):
        def get_output_embeddings(self) -> None:
            return None

    assert install_tall_skinny_projection(NoHead()) is False


def test_cpu_backend_swaps_the_decoders_linears_and_keeps_logits(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from spec_backend.tools.tiny import make_tiny_model

    folder = make_tiny_model(tmp_path / "tiny", num_hidden_layers=2)
    model = AutoModelForCausalLM.from_pretrained(folder)
    layer = model.model.layers[0]
    weight = layer.mlp.down_proj.weight
    with torch.no_grad():
        before = [model(input_ids=torch.tensor([[3, 1, 4, 1, 5][:n]])).logits for n in (1, 3, 5)]
        CpuBackend().prepare_model(model, ModelOptions())
        assert isinstance(layer.mlp.down_proj, TallSkinnyProjection)
        assert layer.mlp.down_proj.rows == frozenset(range(1, 17))
        assert layer.mlp.down_proj.weight is weight  # the same parameter, not a copy
        assert not any(type(m) is nn.Linear for m in model.modules())  # 7 per layer + the head
        after = [model(input_ids=torch.tensor([[3, 1, 4, 1, 5][:n]])).logits for n in (1, 3, 5)]
    for a, b in zip(after, before, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_linear_subclasses_are_left_alone() -> None:
    class Quantized(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(4, 4), Quantized(4, 4))
    assert install_small_batch_linears(model) == 1
    assert isinstance(model[0], TallSkinnyProjection) and type(model[1]) is Quantized
