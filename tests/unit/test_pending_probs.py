"""Pending drafts keep each slot's draft probabilities when a later batch stores wider drafts: the
buffers widen, the earlier rows stay (a regression: widening dropped every slot's probabilities and
the next store re-allocated them as zeros, so a trie of draft paths stored after a narrower one verified
against zero draft mass)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from spec_backend.engine.pending import PendingDrafts
from spec_backend.proposers.contract import DraftOutput


def _request() -> Any:
    return SimpleNamespace(finished=False, output_token_ids=[5])


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
