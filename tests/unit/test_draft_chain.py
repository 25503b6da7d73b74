"""``DraftChain.draw_greedy``: the argmax over a head's own (reduced) vocabulary, mapped to target ids, is
the draft that the argmax over the target vocabulary (``-inf`` outside the draft vocabulary) gives; it
serves point-mass drafting only."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from spec_backend.models.draft_vocab import to_target_logits
from spec_backend.proposers.draft_sampling import DraftChain


@dataclass
class _Request:
    request_id: str = "r"
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    output_token_ids: list[int] = field(default_factory=list)
    seed: int = 0
    temperature: float = 0.0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


def test_greedy_draft_over_the_draft_vocabulary_is_the_full_vocabulary_argmax() -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = torch.randperm(200, generator=gen)[:40].sort().values  # [Vd] target ids
    logits = torch.randn(3, 40, generator=gen)  # [B, Vd]
    requests = [_Request(request_id=str(i)) for i in range(3)]
    reduced, full = DraftChain(requests, False, logits.device), DraftChain(requests, False, logits.device)
    got = reduced.draw_greedy(logits, vocab)  # [B]
    assert torch.equal(got, full.draw(to_target_logits(logits, vocab, 200)))
    assert torch.equal(got, vocab[logits.argmax(-1)]) and bool((got != logits.argmax(-1)).any())
    assert torch.equal(reduced.draw_greedy(logits, None), logits.argmax(-1))  # the target's vocabulary
    assert torch.equal(reduced.output([2, 2, 2]).token_ids, torch.stack([got, logits.argmax(-1)], dim=1))
    with pytest.raises(ValueError, match="draw_greedy serves point-mass drafting"):
        DraftChain(requests, True, logits.device).draw_greedy(logits, vocab)


def test_sampled_draft_distribution_is_the_tempered_softmax() -> None:
    """Drafts drawn at a temperature carry ``q = softmax(logits / T)`` over the full vocabulary (no top-k
    or top-p: the drafter applies neither), bit for bit; a greedy request's ``q`` is one-hot."""
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(1))  # [B, V]
    requests = [_Request(request_id="hot", temperature=0.7), _Request(request_id="cold", temperature=0.0)]
    chain = DraftChain(requests, True, logits.device)
    ids = chain.draw(logits)
    q = chain.probs[0]  # [B, V]
    assert torch.equal(q[0], torch.softmax(logits[0] / torch.tensor(0.7), dim=-1))
    assert int(ids[1]) == int(logits[1].argmax()) and float(q[1, ids[1]]) == 1.0 and float(q[1].sum()) == 1.0
