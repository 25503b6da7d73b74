"""Random verification: seeding, point-mass drafts, edge cases, top-k/top-p, block verification, modes."""

from __future__ import annotations

import itertools

import pytest
import torch
from sampler_modes import CONFIG_MODES

from spec_backend.config.rejection import RejectionSamplerConfig as Config
from spec_backend.sampling import PLACEHOLDER_TOKEN_ID, RejectionSampler, SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling.probs import entropy_thresholds, target_probs
from spec_backend.sampling.torch_ops import (
    TorchSamplerOps,
    block_thresholds,
    block_weights,
    draft_ratios,
    request_layout,
    residual_mass,
)

V = 7
MODES = CONFIG_MODES


def batch(
    ks: list[int], seed: int = 0, peaked: float = 1.0
) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(sum(k + 1 for k in ks), V, generator=gen) * peaked
    drafts = [torch.randint(0, V, (k,), generator=gen).tolist() for k in ks]
    draft_probs = torch.softmax(torch.randn(sum(ks), V, generator=gen), dim=-1)
    return drafts, logits, draft_probs


def rows_of(ks: list[int], t: torch.Tensor) -> list[torch.Tensor]:
    out, row = [], 0
    for k in ks:
        out.append(t[row : row + k])
        row += k
    return out


def cat_rows(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, width)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_seeded_request_is_batch_independent(mode: str) -> None:
    ks = [3, 0, 5, 2, 4]
    drafts, logits, dprobs = batch(ks)
    seeds, positions = [11, None, 7, 11, 3], [100, 5, 42, 100, 0]
    sampling = SamplingMetadata.from_lists([1.0, 0.8, 0.6, 1.0, 1.5], seeds=seeds, positions=positions)
    sampler = RejectionSampler(MODES[mode])
    md = SpecDecodeMetadata.from_draft_tokens(drafts)
    out = sampler(md, dprobs, logits, sampling)
    assert torch.equal(out, sampler(md, dprobs, logits, sampling)) or seeds.count(
        None
    )  # unseeded row may vary
    # shuffle the batch and add a new request: seeded rows keep their tokens
    order = [4, 2, 0, 3]
    lrows, drows = rows_of([k + 1 for k in ks], logits), rows_of(ks, dprobs)
    extra_logits, extra_drafts = torch.randn(3, V), torch.softmax(torch.randn(2, V), -1)
    new_drafts = [drafts[b] for b in order] + [[1, 2]]
    new_logits = torch.cat([lrows[b] for b in order] + [extra_logits])
    new_dprobs = cat_rows([drows[b] for b in order] + [extra_drafts], V)
    new_sampling = SamplingMetadata.from_lists(
        [[1.0, 0.8, 0.6, 1.0, 1.5][b] for b in order] + [1.0],
        seeds=[seeds[b] for b in order] + [5],
        positions=[positions[b] for b in order] + [9],
    )
    out2 = sampler(SpecDecodeMetadata.from_draft_tokens(new_drafts), new_dprobs, new_logits, new_sampling)
    width = out.shape[1]
    for i, b in enumerate(order):
        assert out2[i, :width].tolist() == out[b].tolist()


def test_seed_and_position_change_the_draw_and_unseeded_follows_torch_seed() -> None:
    ks = [0] * 64
    _, logits, _ = batch(ks)
    md = SpecDecodeMetadata.from_draft_tokens([[] for _ in ks])
    sampler = RejectionSampler()
    a = sampler(md, None, logits, SamplingMetadata.random(64, seed=1, position=3))
    b = sampler(md, None, logits, SamplingMetadata.random(64, seed=2, position=3))
    c = sampler(md, None, logits, SamplingMetadata.random(64, seed=1, position=4))
    assert not torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(0)
    d = sampler(md, None, logits, SamplingMetadata.random(64))
    e = sampler(md, None, logits, SamplingMetadata.random(64))
    torch.manual_seed(0)
    assert not torch.equal(d, e)
    assert torch.equal(d, sampler(md, None, logits, SamplingMetadata.random(64)))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_point_mass_equals_onehot_draft_probs(mode: str) -> None:
    ks = [4, 1, 0, 6, 3]
    drafts, logits, _ = batch(ks, seed=2)
    md = SpecDecodeMetadata.from_draft_tokens(drafts)
    onehot = torch.nn.functional.one_hot(md.draft_token_ids.long(), V).float()
    sampling = SamplingMetadata.from_lists(
        [1.0, 0.5, 1.0, 2.0, 0.0], seeds=[1, 2, 3, 4, 5], positions=[0] * 5
    )
    sampler = RejectionSampler(MODES[mode])
    assert torch.equal(sampler(md, None, logits, sampling), sampler(md, onehot, logits, sampling))


@pytest.mark.parametrize("base", ["standard", "block-cumulative", "block-lossless"])
def test_entropy_with_neutral_thresholds_reduces_to_base_mode(base: str) -> None:
    ks = [5, 2, 3]
    drafts, logits, dprobs = batch(ks, seed=4)
    md = SpecDecodeMetadata.from_draft_tokens(drafts)
    sampling = SamplingMetadata.from_lists([1.0] * 3, seeds=[1, 2, 3], positions=[10, 20, 30])
    cfg = MODES[base]
    neutral = Config(
        **{
            **cfg.model_dump(),
            "enable_entropy_verify": True,
            "posterior_alpha": 0.0,
            "posterior_threshold": 1.0,
        }
    )
    a = RejectionSampler(cfg)(md, dprobs, logits, sampling)
    assert torch.equal(a, RejectionSampler(neutral)(md, dprobs, logits, sampling))


def _one_request(p_x: float, q_x: float, method_cfg: Config, trials: int = 200) -> list[int]:
    """Accepted counts for one K=1 draft x=0 with p(x), q(x) forced, over many seeds."""
    logits = torch.log(torch.tensor([[p_x, 1.0 - p_x, 0.0], [0.5, 0.5, 0.0]])).repeat(trials, 1)
    dprobs = torch.tensor([[q_x, 1.0 - q_x, 0.0]]).repeat(trials, 1)
    md = SpecDecodeMetadata.from_draft_tokens([[0]] * trials)
    sampling = SamplingMetadata.from_lists([1.0] * trials, seeds=list(range(trials)), positions=[0] * trials)
    out = RejectionSampler(method_cfg)(md, dprobs, logits, sampling)
    return [int(r[1] != PLACEHOLDER_TOKEN_ID) for r in out.tolist()]


@pytest.mark.parametrize("mode", ["standard", "block-lossless", "block-cumulative", "entropy"])
def test_edge_cases_zero_probabilities(mode: str) -> None:
    """The lossless modes keep the exact limit min(1, p/q) = 1 at q(x) = 0 < p(x); vllm-ascend's
    compatibility rules never accept a draft whose draft probability is 0 (``draft_prob > 0`` there)."""
    at_q_zero = _one_request(0.3, 0.0, MODES[mode])
    if mode in ("standard", "block-lossless"):
        assert all(at_q_zero), "q(x)=0 < p(x): ratio inf, always accepted"
    else:
        assert not any(at_q_zero), "vllm-ascend: q(x)=0 is never accepted"
    assert not any(_one_request(0.0, 0.6, MODES[mode])), "p(x)=0: always rejected"


def test_zero_residual_falls_back_to_target() -> None:
    ops = TorchSamplerOps()
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    token = ops.sample_residual(
        p,
        torch.tensor([0]),
        None,
        torch.tensor([2]),
        torch.tensor([0]),
        torch.ones(1, dtype=torch.float64),
        torch.tensor([1]),
        torch.tensor([0]),
    )
    assert token.tolist() == [2]
    # p == q given as probabilities: residual mass zero, so the token comes from p's support
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    tokens = ops.sample_residual(
        q.repeat(50, 1),
        torch.arange(50),
        q,
        torch.tensor([0]),
        torch.zeros(50, dtype=torch.int64),
        torch.ones(50, dtype=torch.float64),
        torch.arange(50),
        torch.zeros(50, dtype=torch.int64),
    )
    assert set(tokens.tolist()) == {0, 1}


def test_top_k_and_top_p() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0, 3.0], [4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 5.0]])
    probs = target_probs(
        logits, torch.tensor([1.0, 1.0, 0.0]), torch.tensor([2, 0, 9]), torch.tensor([1.0, 0.7, 1.0])
    )
    assert torch.allclose(probs.sum(-1), torch.ones(3))
    assert (probs[0] > 0).tolist() == [False, True, False, False, True]  # top-2 with a tie at 3.0
    # softmax([4,3,2,1,0]) = [0.636, 0.234, ...]: top_p=0.7 keeps 2 tokens, top_p=0.6 keeps 1
    assert (probs[1] > 0).tolist() == [True, True, False, False, False]
    assert torch.allclose(probs[1, :2], torch.softmax(logits[1, :2], -1))
    one = target_probs(logits[1:2], torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0.6]))
    assert one[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert torch.allclose(probs[2], torch.softmax(logits[2], -1))  # greedy row: temperature 1, k >= V off
    hot = target_probs(logits[1:2], torch.tensor([0.5]), torch.tensor([0]), torch.tensor([1.0]), False, False)
    assert torch.allclose(hot, torch.softmax(logits[1:2] / 0.5, -1))
    both = target_probs(logits[1:2], torch.tensor([1.0]), torch.tensor([3]), torch.tensor([0.9]))
    # top-3 renormalised: [0.665, 0.245, 0.090]; mass before the 3rd is 0.91 >= 0.9, so 2 are kept
    assert (both[0] > 0).tolist() == [True, True, False, False, False]


def test_top_k_one_samples_argmax() -> None:
    ks = [2, 0, 3]
    drafts, logits, _ = batch(ks, seed=6)
    md = SpecDecodeMetadata.from_draft_tokens(drafts)
    sampling = SamplingMetadata.from_lists([1.0] * 3, top_k=[1] * 3, seeds=[1, 2, 3], positions=[0] * 3)
    greedy = RejectionSampler()(md, None, logits, SamplingMetadata.greedy(3))
    assert torch.equal(RejectionSampler()(md, None, logits, sampling), greedy)


def test_entropy_thresholds_use_raw_logits() -> None:
    uniform = torch.zeros(1, 8)
    tau = entropy_thresholds(uniform, alpha=0.5, threshold=0.95)
    assert torch.allclose(tau, torch.tensor([8.0**-0.5], dtype=torch.float64))
    peaked = torch.tensor([[0.0, -torch.inf, -torch.inf]])
    assert torch.allclose(entropy_thresholds(peaked, 0.5, 0.95), torch.tensor([0.95], dtype=torch.float64))


def test_block_verification_toy_example_from_the_paper() -> None:
    """Sun et al. 2024: q = (1/3, 2/3), p = (2/3, 1/3), K = 2: E[accepted] 10/9 standard, 11/9 block."""
    q, p, k = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3]), 2
    cu, rows = torch.tensor([k]), torch.arange(k)
    index, valid, num = request_layout(cu, k)
    std = block = 0.0
    for xs in itertools.product(range(2), repeat=k):
        prob = float(q[list(xs)].prod())
        ids, tp, dp = torch.tensor(xs), p.expand(k + 1, 2), q.expand(k, 2)
        rho = draft_ratios(ids, dp, tp, rows)
        w = block_weights(rho, index, valid)
        h = block_thresholds(w, residual_mass(tp, rows, dp, ids, w[0, :k]), index, valid, num)[0]
        block += prob * float(2 * h[1] + (1 - h[1]) * h[0])
        a = rho.clamp(max=1.0)
        std += prob * float(a[0] + a[0] * a[1])
    assert std == pytest.approx(10 / 9, abs=1e-6)
    assert block == pytest.approx(11 / 9, abs=1e-6)


@pytest.mark.parametrize("mode", ["standard", "block-lossless"])
def test_lossless_modes_first_token_marginal(mode: str) -> None:
    """Small Monte-Carlo sanity check (the full conformance suite lives in spec_backend.testing)."""
    gen = torch.Generator().manual_seed(0)
    k, n = 3, 20_000
    p = torch.softmax(torch.randn(k + 1, 4, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(k, 4, generator=gen) * 1.5, -1)
    drafts = torch.stack([torch.multinomial(q[j], n, replacement=True, generator=gen) for j in range(k)], 1)
    md = SpecDecodeMetadata.from_draft_tokens(drafts.tolist())
    sampling = SamplingMetadata.from_lists([1.0] * n, seeds=list(range(n)), positions=[0] * n)
    out = RejectionSampler(MODES[mode])(md, q.repeat(n, 1), p.log().repeat(n, 1), sampling)
    freq = torch.bincount(out[:, 0].long(), minlength=4).double() / n
    se = (p[0] * (1 - p[0]) / n).sqrt().double()
    assert bool(((freq - p[0].double()).abs() < 5 * se + 1e-4).all()), (freq, p[0])
