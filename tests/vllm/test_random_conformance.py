"""Sampled requests through vLLM's V1 RejectionSampler with our verifier (Monte-Carlo, fixed seeds).

Full vLLM path: vLLM divides the target logits by the temperature and samples the bonus token; our
verifier does the rest. Checks: the first emitted token follows the target softmax(l/T) in the
lossless modes (chi-square, noise floor: a correct sampler fails with probability 1e-4), lossless
block verification emits no fewer tokens than standard, and a lossy mode is detected (negative
control). vLLM's ``expand_batch_to_tokens`` is a triton kernel with one program per request, far too
slow in the interpreter at N=4000, so it is replaced here by an exact torch equivalent.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from scipy.stats import chisquare
from vllm_helpers import rsc, sampling_metadata, spec_metadata, vllm_rejection_sampler

pytestmark = [pytest.mark.vllm, pytest.mark.statistical]

N, K, VOCAB, TEMP = 4000, 2, 6, 0.7
P_FLOOR = 1e-4
TARGET = torch.tensor(
    [[2.0, 1.0, 0.5, 0.0, -1.0, -0.5], [0.0, 1.5, 0.2, 1.0, -1.0, 0.3], [1.0, 0.0, 0.0, 0.5, 0.5, -2.0]]
)  # rows: draft slot 0, slot 1, bonus
DRAFT = torch.tensor(
    [[0.05, 0.1, 0.15, 0.1, 0.5, 0.1], [0.1, 0.3, 0.2, 0.2, 0.1, 0.1]]
)  # q for slots 0, 1: q0 puts mass where p0 has little


def _torch_expand(
    x: torch.Tensor, cu: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    counts = torch.diff(cu.to(torch.int64), prepend=cu.new_zeros(1, dtype=torch.int64))
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


@pytest.fixture(autouse=True)
def _fast_expand(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.v1.sample.rejection_sampler as rsm

    monkeypatch.setattr(rsm, "expand_batch_to_tokens", _torch_expand)


def _run(flags: dict[str, Any], seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(DRAFT[j], N, replacement=True, generator=g) for j in range(K)], 1)
    meta = spec_metadata(drafts.tolist())
    logits = TARGET.repeat(N, 1)  # [N * (K + 1), V]
    draft_probs = DRAFT.repeat(N, 1)  # [N * K, V]
    sampler = vllm_rejection_sampler(rsc(**flags))
    return sampler(meta, draft_probs, logits, sampling_metadata([TEMP] * N)).sampled_token_ids


def _first_token_p_value(out: torch.Tensor) -> float:
    counts = torch.bincount(out[:, 0].to(torch.int64), minlength=VOCAB).double()
    expected = torch.softmax(TARGET[0].double() / TEMP, -1) * N
    return float(chisquare(counts.numpy(), expected.numpy()).pvalue)


@pytest.fixture(scope="module")
def outputs() -> dict[str, torch.Tensor]:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    modes = {
        "standard": {},
        "block-lossless": {"enable_block_verify": True},
        "entropy": {"enable_entropy_verify": True, "posterior_alpha": 2.0, "posterior_threshold": 0.5},
    }
    return {name: _run(flags, seed=1234) for name, flags in modes.items()}


@pytest.mark.parametrize("mode", ["standard", "block-lossless"])
def test_lossless_first_token_follows_target(outputs: dict[str, torch.Tensor], mode: str) -> None:
    out = outputs[mode]
    assert out.shape == (N, K + 1) and out.dtype == torch.int32
    assert _first_token_p_value(out) > P_FLOOR


def test_block_emits_no_fewer_tokens_than_standard(outputs: dict[str, torch.Tensor]) -> None:
    lengths = {m: (outputs[m] != -1).sum(1).double() for m in ("standard", "block-lossless")}
    se = (lengths["standard"].var() / N + lengths["block-lossless"].var() / N).sqrt()
    assert lengths["block-lossless"].mean() >= lengths["standard"].mean() - 4 * se


def test_lossy_entropy_mode_is_detected(outputs: dict[str, torch.Tensor]) -> None:
    """Negative control: the same test must reject a lossy rule, or it proves nothing."""
    assert _first_token_p_value(outputs["entropy"]) < 1e-6


def test_seeded_requests_reproduce() -> None:
    """vLLM's per-request generators drive our randomness: same seeds, same tokens."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    sampler = vllm_rejection_sampler(rsc(enable_block_verify=True))
    drafts = [[1, 3], [4, 0], [2, 2]]
    logits = TARGET.repeat(3, 1)

    def once() -> torch.Tensor:
        gens = {i: torch.Generator().manual_seed(100 + i) for i in range(3)}
        sm = sampling_metadata([1.0, 0.9, 1.2], generators=gens)
        return sampler(spec_metadata(drafts), DRAFT.repeat(3, 1), logits.clone(), sm).sampled_token_ids

    first = once()
    assert torch.equal(first, once())
    runs = {tuple(once().flatten().tolist()) for _ in range(3)}
    assert len(runs) == 1
