"""The rows set of few-row float32 products (``cpu/few_rows``): the rule on given times, the override, the
measurement made once per process for a group's shapes, and the installers following the set."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from spec_backend.cpu import few_rows
from spec_backend.cpu.few_rows import DECODER_ROWS, HEAD_ROWS, MARGIN, ROWS_ENV, choose, rows_set, tall_skinny
from spec_backend.cpu.vocab_projection import (
    TallSkinnyProjection,
    install_small_batch_linears,
    install_tall_skinny_projection,
)


def test_rule_takes_clear_wins_and_steps_between_candidates() -> None:
    """A candidate joins at <= MARGIN of F.linear's time (near parity does not); counts between candidates
    follow the one below; past the last, F.linear."""
    times = {1: (1.0, 0.5), 2: (1.0, MARGIN), 4: (1.0, MARGIN + 0.01), 8: (1.0, 0.2), 16: (1.0, 1.5)}
    assert choose(times, [1, 2, 4, 8, 16]) == frozenset({1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15})
    assert choose({1: (1.0, 0.1)}, [1]) == frozenset({1})
    assert choose({m: (1.0, 2.0) for m in HEAD_ROWS}, HEAD_ROWS) == frozenset()


def test_tall_skinny_product_equals_linear() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 16, generator=gen, dtype=torch.float64)
    for m in (1, 2, 3, 8):
        rows = torch.randn(m, 16, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(tall_skinny(rows, weight), rows @ weight.T, rtol=1e-12, atol=1e-12)


def test_override_pins_the_set(monkeypatch: pytest.MonkeyPatch) -> None:
    weights = [torch.randn(8, 8)]
    monkeypatch.setenv(ROWS_ENV, "linear")
    assert rows_set(weights, DECODER_ROWS).rows == frozenset()
    monkeypatch.setenv(ROWS_ENV, "tall")
    assert rows_set(weights, DECODER_ROWS).rows == frozenset(range(1, 17))
    monkeypatch.setenv(ROWS_ENV, "fastest")
    with pytest.raises(
        ValueError, match=r"SPEC_BACKEND_FEW_ROWS must be one of measure, linear, tall; got 'fastest'"
    ):
        rows_set(weights, DECODER_ROWS)


def test_measured_once_per_process_for_a_groups_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call times every candidate with both products and keeps the choice; a second group of the
    same shapes (another engine on the same model) gets the same choice without timing anything."""
    monkeypatch.delenv(ROWS_ENV, raising=False)
    monkeypatch.setattr(few_rows, "_CHOICES", {})
    weights = [torch.randn(24, 8), torch.randn(8, 24)]
    first = rows_set(weights, (1, 2, 3))
    assert first.reason == "measured" and [m for m, _, _ in first.times] == [1, 2, 3]
    assert all(a > 0 and b > 0 for _, a, b in first.times)
    assert first.rows == choose({m: (a, b) for m, a, b in first.times}, (1, 2, 3))
    monkeypatch.setattr(few_rows, "_measure", None)  # measuring again would fail
    assert rows_set([torch.randn(24, 8), torch.randn(8, 24)], (1, 2, 3)) is first


def test_installers_follow_the_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty set leaves every layer an nn.Linear; otherwise float32 layers become TallSkinnyProjection
    with the set (sharing their parameters), the head with its own, and other dtypes stay."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).double())
    monkeypatch.setenv(ROWS_ENV, "linear")
    assert install_small_batch_linears(model) == 0 and type(model[0]) is nn.Linear
    monkeypatch.setenv(ROWS_ENV, "tall")
    weight = model[0].weight
    assert install_small_batch_linears(model) == 1
    assert isinstance(model[0], TallSkinnyProjection) and model[0].weight is weight
    assert model[0].rows == frozenset(range(1, max(DECODER_ROWS) + 1)) and type(model[1]) is nn.Linear

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(8, 32, bias=False)

        def get_output_embeddings(self) -> nn.Module:
            return self.head

        def set_output_embeddings(self, module: nn.Module) -> None:
            self.head = module

    owner = Head()
    assert install_tall_skinny_projection(owner)
    assert isinstance(owner.head, TallSkinnyProjection) and owner.head.rows == frozenset(range(1, 65))
    monkeypatch.setenv(ROWS_ENV, "linear")
    assert not install_tall_skinny_projection(Head())
