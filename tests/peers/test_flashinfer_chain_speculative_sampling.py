"""Port of FlashInfer's chain speculative sampling test onto our sampler.

Peer: ``tests/utils/test_sampling.py::test_chain_speculative_sampling`` of FlashInfer (file last changed
at ``b418bc3fa381e9351a4f48d33a8618240b071c6f``; repository HEAD ``fb28d7242b35``). Its inputs, its
10 trials per case and its structural assertions are kept.

Peer concepts on our API:

* ``chain_speculative_sampling(draft_probs [B, S, V], draft_token_ids [B, S], target_probs [B, S+1, V])``
  -> ``RejectionSampler`` with ``draft_probs`` [B*S, V], the drafts as per-request lists, and logits
  = log(target_probs) [B*(S+1), V] (-inf where a probability is 0) at temperature 1: FlashInfer's S+1
  target rows per request are exactly our S draft rows followed by the bonus row.
* ``output_token_ids`` [B, S+1] (-1 padded) -> our output, same shape and padding.
* ``emitted_num`` (accepted drafts that were emitted) -> the length of the output's leading run equal to
  the drafts. Under token-level verification a recovered token never equals the draft it replaces (a
  rejection needs p(x) < q(x), so the residual max(p - q, 0) is 0 at x): the run counts the accepted
  drafts, and the peer's ``emitted_num + 1 == (output != -1).sum(1)`` keeps its meaning: an accepted
  prefix, then exactly one recovered or bonus token. (``accepted_num``, which the peer does not assert
  on, has no counterpart.)
* FlashInfer's draws come from curand; ours from unseeded requests (a fresh seed per call).

Reduced sizes: the peer's grid does not fit this 2-core, 23 GB CPU machine. Its largest case holds
989 x 8 x 128256 = 1.0e9 floats per tensor (4 GB; draft, target, logits and processed probabilities do not
fit in memory together), and the whole grid x 10 trials would take about half an hour. So batch_size
{1, 99, 989} -> {1, 9, 99} and vocab_size {111, 32000, 128256} -> {111, 3200, 12826}, each divided by 10
(1 and 111 kept). The grid's shape (3 batch sizes x 3 vocabularies x S in {1, 3, 5, 7} x one-hot or not
= 72 cases) and the 10 trials are kept; the largest case (99 x 8 x 12826) still spans several
exponential-race tiles and verification groups of the reference backend. The file runs in about 15 s.
"""

from __future__ import annotations

import pytest
import torch
from peer_helpers import log_probs, verify

from spec_backend.backends.reference import ReferenceBackend
from spec_backend.sampling import RejectionSampler

TRIALS = 10


def _chain_speculative_sampling(
    sampler: RejectionSampler, draft_probs: torch.Tensor, draft_ids: torch.Tensor, target_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:  # output [B, S+1], emitted drafts [B]
    batch, spec, vocab = draft_probs.shape
    logits = log_probs(target_probs).reshape(batch * (spec + 1), vocab)
    out = verify(sampler, draft_ids.tolist(), logits, [1.0] * batch, draft_probs.reshape(batch * spec, vocab))
    same = (out[:, :spec] == draft_ids).to(torch.int64)  # [B, S]
    emitted = torch.cumprod(same, dim=1).sum(dim=1)  # leading run of drafts
    return out, emitted


@pytest.mark.parametrize("onehot_target", [False, True])
@pytest.mark.parametrize("num_speculate_tokens", [1, 3, 5, 7])
@pytest.mark.parametrize("vocab_size", [111, 3200, 12826])
@pytest.mark.parametrize("batch_size", [1, 9, 99])
def test_chain_speculative_sampling(
    batch_size: int, vocab_size: int, num_speculate_tokens: int, onehot_target: bool
) -> None:
    spec = num_speculate_tokens
    draft_probs = torch.rand(batch_size, spec, vocab_size)
    draft_probs = draft_probs / draft_probs.sum(dim=-1, keepdim=True)
    draft_ids = torch.randint(vocab_size, (batch_size, spec))
    if not onehot_target:
        target_probs = torch.rand(batch_size, spec + 1, vocab_size)
        target_probs = target_probs / target_probs.sum(dim=-1, keepdim=True)
    else:  # the target agrees with every draft, and picks a random bonus token
        target_ids = torch.randint(vocab_size, (batch_size, spec + 1))
        target_ids[:, :spec] = draft_ids
        target_probs = torch.zeros(batch_size, spec + 1, vocab_size)
        target_probs.scatter_(2, target_ids.unsqueeze(-1), 1.0)
    sampler = RejectionSampler(backend=ReferenceBackend())
    for _ in range(TRIALS):
        out, emitted = _chain_speculative_sampling(sampler, draft_probs, draft_ids, target_probs)
        if onehot_target:
            assert torch.all(out == target_ids)
        else:
            assert torch.all(out[out >= 0] < vocab_size)
            assert out.shape == (batch_size, spec + 1)
            mismatch = out[:, :-1] != draft_ids
            for row in range(batch_size):
                where = torch.nonzero(mismatch[row], as_tuple=True)[0]
                if len(where) > 0:
                    assert torch.all(where[1:] == where[:-1] + 1)  # the mismatches are contiguous
                    assert torch.all(out[row, where[0] + 1 :] == -1)  # and -1 after the first one
        assert torch.all(emitted + 1 == (out != -1).sum(dim=1))
