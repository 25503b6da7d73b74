"""torch_ops.exponential_race: the tiled sampler picks exactly the token of the one-shot formula."""

from __future__ import annotations

import pytest
import torch

from spec_backend.sampling import rng
from spec_backend.sampling.torch_ops import exponential_race


def _one_shot(w: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    u = rng.vocab_uniform_f32(seeds, positions, w.shape[1], rng.STREAM_SAMPLE)  # [R, V]
    return torch.argmax(w / -torch.log(u), dim=1)


@pytest.mark.parametrize(("rows", "vocab", "tile"), [(1, 7, 1 << 18), (5, 1000, 512), (3, 2049, 768)])
def test_tiled_race_equals_one_shot(rows: int, vocab: int, tile: int) -> None:
    gen = torch.Generator().manual_seed(rows * vocab)
    for trial in range(20):
        w = torch.rand(rows, vocab, generator=gen) ** 4  # [R, V]
        w[:, trial % 3 :: 3] = 0.0  # zero-weight tokens are never picked
        seeds = torch.randint(0, rng.MAX_SEED, (rows,), generator=gen)
        positions = torch.randint(0, 10_000, (rows,), generator=gen)
        key = rng.row_key(seeds, positions, rng.STREAM_SAMPLE)[:, None]
        got = exponential_race(w, key, tile_elements=tile)  # tiles of >= 256 columns
        assert torch.equal(got, _one_shot(w, seeds, positions))
        assert bool((w.gather(1, got[:, None]) > 0).all())


def test_point_mass_row_always_wins() -> None:
    w = torch.zeros(2, 3000)
    w[0, 2999], w[1, 0] = 1.0, 1e-30  # the last column of the last tile; a tiny but positive weight
    key = rng.row_key(torch.tensor([1, 2]), torch.tensor([0, 0]), rng.STREAM_SAMPLE)[:, None]
    assert exponential_race(w, key).tolist() == [2999, 0]
