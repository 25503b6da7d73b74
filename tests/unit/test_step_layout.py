"""The step's index tensors built from host counts (``build_step_batch``, ``spec_decode_metadata``) and the
ragged causal mask, against definitions written out element by element on random layouts."""

from __future__ import annotations

import random

import pytest
import torch

from spec_backend.backends.attention import ragged_causal_mask
from spec_backend.sampling.metadata import SpecDecodeMetadata
from spec_backend.step import RaggedAttentionMetadata, build_step_batch


def _layouts(seed: int, n: int) -> list[tuple[list[int], list[int], int]]:
    """(query lens, cached lens, padded width Q) per case: padding or none, one request or several."""
    rng, out = random.Random(seed), []
    for _ in range(n):
        batch = rng.randint(1, 5)
        lens = [rng.randint(1, 6) for _ in range(batch)]
        if rng.random() < 0.4:
            lens = [lens[0]] * batch  # every request the same width: the unpadded layout
        width = max(lens) + (rng.randint(0, 2) if rng.random() < 0.3 else 0)
        out.append((lens, [rng.randint(0, 20) for _ in range(batch)], width))
    return out


@pytest.mark.parametrize("case", _layouts(0, 60))
def test_step_batch_indices_follow_the_request_major_order(case: tuple[list[int], list[int], int]) -> None:
    lens, cached, width = case
    tokens = torch.randint(0, 500, (len(lens), width))  # [B, Q]
    tokens[0, 1:] = -1 if lens[0] > 1 else tokens[0, 1:]  # placeholder drafts are fed as token 0
    batch = build_step_batch(3, tokens, lens, cached, [q - 1 for q in lens])
    rows = [b for b, q in enumerate(lens) for _ in range(q)]
    cols = [i for q in lens for i in range(q)]
    assert batch.rows.tolist() == rows and batch.cols.tolist() == cols
    assert batch.input_ids.tolist() == [max(int(tokens[b, i]), 0) for b, i in zip(rows, cols, strict=True)]
    drafts = [int(tokens[b, i]) for b, i in zip(rows, cols, strict=True) if i >= 1]
    assert batch.draft_token_ids.dtype == torch.int32 and batch.draft_token_ids.tolist() == drafts
    assert batch.positions.tolist() == [cached[b] + i for b, i in zip(rows, cols, strict=True)]
    assert batch.slot_ids.tolist() == [3 + b for b in range(len(lens))]
    assert batch.seq_lens.tolist() == [c + q for c, q in zip(cached, lens, strict=True)]
    assert batch.query_start_loc.tolist() == [sum(lens[:b]) for b in range(len(lens) + 1)]


@pytest.mark.parametrize("case", _layouts(1, 60))
def test_verify_metadata_is_the_layout_of_per_request_draft_lists(
    case: tuple[list[int], list[int], int],
) -> None:
    """Whatever the mix of requests with and without drafts, the step's view equals what
    ``SpecDecodeMetadata.from_draft_tokens`` builds from the same drafts as lists."""
    lens, cached, width = case
    lens = [q if random.Random(sum(cached)).random() < 0.7 else 1 for q in lens]  # some without drafts
    tokens = torch.randint(0, 500, (len(lens), width))  # [B, Q]
    got = build_step_batch(0, tokens, lens, cached, [q - 1 for q in lens]).spec_decode_metadata()
    want = SpecDecodeMetadata.from_draft_tokens([tokens[b, 1:q].tolist() for b, q in enumerate(lens)])
    for name in ("draft_token_ids", "cu_num_draft_tokens", "target_logits_indices", "bonus_logits_indices"):
        assert getattr(got, name).dtype == torch.int32, name
        assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
    assert got.logits_indices.tolist() == list(range(sum(lens)))
    assert got.request_index is not None and want.request_index is not None
    assert got.slot_index is not None and want.slot_index is not None
    assert got.request_index.tolist() == want.request_index.tolist()
    assert got.slot_index.tolist() == want.slot_index.tolist()
    assert got.num_draft_tokens == [q - 1 for q in lens] and got.max_spec_len == max(lens) - 1
    assert got.standard_layout


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_a_plain_steps_layout_is_built_once_per_batch_size(batch: int) -> None:
    """Steps without drafts (plain decoding) share their batch size's layout, equal to the one built
    from empty draft lists (before, every plain step rebuilt it: host tensors, copies, checks)."""
    tokens = torch.randint(0, 500, (batch, 1))  # [B, 1]
    views = [build_step_batch(0, tokens, [1] * batch, [3] * batch, [0] * batch).spec_decode_metadata()]
    views.append(
        build_step_batch(0, tokens + 1, [1] * batch, [4] * batch, [0] * batch).spec_decode_metadata()
    )
    want = SpecDecodeMetadata.from_draft_tokens([[] for _ in range(batch)])
    assert views[0] is views[1]
    for name in ("draft_token_ids", "cu_num_draft_tokens", "target_logits_indices", "bonus_logits_indices"):
        assert getattr(views[0], name).tolist() == getattr(want, name).tolist(), name
    assert views[0].logits_indices.tolist() == list(range(batch)) and views[0].max_spec_len == 0
    assert views[0].request_index is not None and views[0].request_index.numel() == 0
    assert views[0].num_draft_tokens == [0] * batch and views[0].standard_layout


def _mask_by_definition(
    query_lens: list[int], kv_lens: list[int], q_len: int, kv_len: int
) -> list[list[list[bool]]]:
    """Query ``i`` of request ``b`` (at position ``kv - q + i``) sees keys up to its position; a padding
    query (``i >= q``) sees every valid key, and key 0 always (its softmax must stay finite)."""
    out = []
    for q, kv in zip(query_lens, kv_lens, strict=True):
        out.append(
            [
                [(k <= kv - q + i and k < kv) if i < q else (k < kv or k == 0) for k in range(kv_len)]
                for i in range(q_len)
            ]
        )
    return out


@pytest.mark.parametrize("seed", range(4))
def test_causal_mask_follows_its_definition(seed: int) -> None:
    """Rows without keys, padding queries, key views wider than every request: 400 random layouts."""
    rng = random.Random(seed)
    for _ in range(100):
        batch = rng.randint(1, 4)
        query_lens = [rng.randint(0, 5) for _ in range(batch)]
        kv_lens = [q + rng.randint(0, 6) for q in query_lens]
        q_len, kv_len = max([*query_lens, 1]) + rng.randint(0, 2), max([*kv_lens, 1]) + rng.randint(0, 3)
        meta = RaggedAttentionMetadata(query_lens=torch.tensor(query_lens), kv_lens=torch.tensor(kv_lens))
        mask = ragged_causal_mask(meta, q_len, kv_len)  # [B, 1, Q, L]
        assert mask.shape == (batch, 1, q_len, kv_len) and mask.dtype == torch.bool
        assert mask[:, 0].tolist() == _mask_by_definition(query_lens, kv_lens, q_len, kv_len)


def test_host_drafts_pack_into_placeholder_padded_rows() -> None:
    from spec_backend.proposers.contract import pack_drafts

    got = pack_drafts([[5, 6], [], [7, 8, 9]], 3, torch.device("cpu"))  # [B, K]
    assert got.dtype == torch.int64 and got.tolist() == [[5, 6, -1], [-1, -1, -1], [7, 8, 9]]
    assert pack_drafts([[]], 0, torch.device("cpu")).tolist() == [[-1]]  # one column at least
    assert pack_drafts([], 2, torch.device("cpu")).shape == (0, 2)
    with pytest.raises(ValueError, match="request 1 has 3 drafts, more than the 2 columns allowed"):
        pack_drafts([[1], [1, 2, 3]], 2, torch.device("cpu"))
