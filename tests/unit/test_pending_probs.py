"""Pending drafts keep each slot's draft probabilities when a later batch stores wider drafts: the
buffers widen, the earlier rows stay (a regression: widening dropped every slot's probabilities and
the next store re-allocated them as zeros, so a trie of draft paths stored after a narrower one verified
against zero draft mass). A greedy request drafted without probabilities decodes beside sampled ones
that have them (a regression: the whole step raised); a sampled one without them is still refused."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from spec_backend.engine.pending import PendingDrafts
from spec_backend.proposers.contract import DraftOutput


def _request(temperature: float = 1.0) -> Any:
    return SimpleNamespace(finished=False, output_token_ids=[5], temperature=temperature)


def test_a_wider_store_keeps_the_narrower_slots_probabilities() -> None:
    pending = PendingDrafts(2, torch.device("cpu"))
    for _ in range(2):
        pending.add_slot()
    vocab = 8
    narrow = torch.softmax(torch.randn(1, 2, vocab), dim=-1)  # [1, 2, V]
    wide = torch.softmax(torch.randn(1, 4, vocab), dim=-1)  # [1, 4, V]
    pending.store(0, DraftOutput(torch.tensor([[1, 2]]), (2,), draft_probs=narrow), [2], vocab)
    pending.store(1, DraftOutput(torch.tensor([[3, 4, 5, 6]]), (4,), draft_probs=wide), [4], vocab)
    first = pending.take(0, [_request()], torch.device("cpu"))
    second = pending.take(1, [_request()], torch.device("cpu"))
    assert first.probs is not None and second.probs is not None
    torch.testing.assert_close(first.probs[0, :2], narrow[0], rtol=0, atol=0)
    torch.testing.assert_close(second.probs[0, :4], wide[0], rtol=0, atol=0)
    assert first.tokens.tolist() == [[5, 1, 2]] and second.tokens.tolist() == [[5, 3, 4, 5, 6]]


def test_greedy_slots_without_probabilities_decode_beside_sampled_ones() -> None:
    pending = PendingDrafts(2, torch.device("cpu"))
    for _ in range(2):
        pending.add_slot()
    vocab = 8
    stale = torch.softmax(torch.randn(1, 2, vocab), dim=-1)
    pending.store(0, DraftOutput(torch.tensor([[1, 2]]), (2,), draft_probs=stale), [2], vocab)  # an old draft
    pending.take(0, [_request()], torch.device("cpu"))
    pending.store(0, DraftOutput(torch.tensor([[1, 2]]), (2,)), [2], vocab)  # greedy: no probabilities
    sampled = torch.softmax(torch.randn(1, 2, vocab), dim=-1)
    pending.store(1, DraftOutput(torch.tensor([[3, 4]]), (2,), draft_probs=sampled), [2], vocab)
    both = pending.take(0, [_request(0.0), _request()], torch.device("cpu"))
    assert both.probs is not None
    assert torch.equal(both.probs[0], torch.zeros(2, vocab))  # never the previous occupant's rows
    torch.testing.assert_close(both.probs[1], sampled[0], rtol=0, atol=0)
    pending.store(0, DraftOutput(torch.tensor([[1, 2]]), (2,)), [2], vocab)
    pending.store(1, DraftOutput(torch.tensor([[3, 4]]), (2,), draft_probs=sampled), [2], vocab)
    with pytest.raises(ValueError, match="draft probabilities for some sampled requests of a batch only"):
        pending.take(0, [_request(), _request()], torch.device("cpu"))
