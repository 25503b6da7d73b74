"""FLy verification (vLLM 0.33's ``rejection_sample_method="fly"``): a differential test against a
transcription of vLLM's rule, its configuration rules, and its lossy label.

The transcription follows ``vllm/v1/spec_decode/fly.py`` (MRv1): a natively rejected draft i is accepted
when it is a real token whose target probability (sampled requests: and draft probability) is positive
(greedy: raw logit finite), a full window of W drafts follows it and they are all natively accepted, and
the target's top-k entropy at i reaches the threshold; the native rule then runs on the result.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("triton")

from triton_backend import TritonReferenceBackend

from spec_backend import SpeculativeConfig
from spec_backend.backends.base import SamplerTuning
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.config.rejection import RejectionSamplerConfig as Config
from spec_backend.sampling import FlyConfig, RejectionSampler, SamplingMetadata, SpecDecodeMetadata, rng
from spec_backend.sampling.fly import top_k_entropy
from spec_backend.sampling.probs import target_probs

V = 10
P = -1


def _vllm_count(native: list[bool], eligible: list[bool], entropy: list[float], fly: FlyConfig) -> int:
    """Accepted drafts of one request under vLLM's FLy pre-pass followed by the native rule."""
    n, w = len(native), fly.window_size
    accepted = [
        native[i]
        or (
            eligible[i]
            and i + w < n
            and entropy[i] >= fly.entropy_threshold
            and all(native[i + 1 : i + 1 + w])
        )
        for i in range(n)
    ]
    count = 0
    while count < n and accepted[count]:
        count += 1
    return count


def _batch(ks: list[int], seed: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(sum(ks) + len(ks), V, generator=gen) * 1.2  # flat: rescues need entropy
    logits[torch.rand(logits.shape, generator=gen) < 0.08] = float("-inf")
    dprobs = torch.softmax(torch.randn(sum(ks), V, generator=gen), dim=-1)  # [T, V] all positive
    drafts, row = [], 0
    for k in ks:
        d = [
            int(logits[row + j].argmax())
            if torch.rand(1, generator=gen) < 0.6
            else int(torch.randint(0, V, (1,), generator=gen))
            for j in range(k)
        ]
        if k > 2 and torch.rand(1, generator=gen) < 0.25:
            d[int(torch.randint(0, k, (1,), generator=gen))] = P
        drafts.append(d)
        row += k + 1
    return drafts, logits, dprobs


def _expected(drafts: list[list[int]], logits: torch.Tensor, dprobs: torch.Tensor | None,
              temps: list[float], seeds: list[int], fly: FlyConfig) -> list[int]:  # fmt: skip
    out, row, t = [], 0, 0
    for b, d in enumerate(drafts):
        rows = torch.arange(row, row + len(d))
        greedy = temps[b] == 0
        temp = torch.full((len(d),), 1.0 if greedy else temps[b])
        probs = target_probs(logits[rows], temp, torch.zeros(len(d), dtype=torch.long), torch.ones(len(d)))
        ent = top_k_entropy(probs, fly.entropy_top_k).tolist()
        slots = torch.arange(len(d))
        u = rng.uniform_f64(
            torch.full_like(slots, seeds[b]), torch.full_like(slots, 5 * b), slots, 1
        ).tolist()
        native, eligible = [], []
        for j, x in enumerate(d):
            if x == P:
                native.append(False)
                eligible.append(False)
                continue
            p_x, q_x = float(probs[j, x]), float(dprobs[t + j, x]) if dprobs is not None else 1.0
            native.append(x == int(logits[row + j].argmax()) if greedy else u[j] < p_x / q_x)
            eligible.append(bool(logits[row + j, x] > float("-inf")) if greedy else (p_x > 0 and q_x > 0))
        out.append(_vllm_count(native, eligible, ent, fly))
        row, t = row + len(d) + 1, t + len(d)
    return out


@pytest.mark.parametrize("ops", ["torch", "triton"])
@pytest.mark.parametrize("with_q", [0, 1])
@pytest.mark.parametrize("fly", [FlyConfig(1, 0.0, 3), FlyConfig(2, 0.5, 3), FlyConfig(3, 0.2, 1)], ids=str)
def test_fly_equals_vllms_rule(ops: str, with_q: int, fly: FlyConfig) -> None:
    backend = ReferenceBackend() if ops == "torch" else TritonReferenceBackend(SamplerTuning(16, None, True))
    sampler = RejectionSampler(method="fly", fly=fly, backend=backend)
    ks, temps = [6, 4, 7, 3, 0, 5, 8], [0.0, 1.0, 0.7, 0.0, 1.0, 1.3, 0.0]
    rescued = 0
    for seed in range(5 if ops == "torch" else 1):
        drafts, logits, dprobs = _batch(ks, seed)
        seeds = [seed * 100 + b for b in range(len(ks))]
        sampling = SamplingMetadata.from_lists(temps, seeds=seeds, positions=[5 * b for b in range(len(ks))])
        q = dprobs if with_q else None
        out = sampler(SpecDecodeMetadata.from_draft_tokens(drafts), q, logits, sampling).tolist()
        got = [sum(1 for t in r if t != P) - 1 for r in out]
        want = _expected(drafts, logits, q, temps, seeds, fly)
        assert got == want, (seed, drafts)
        std = RejectionSampler(backend=backend)(
            SpecDecodeMetadata.from_draft_tokens(drafts), q, logits, sampling
        )
        rescued += sum(
            g > s for g, s in zip(got, [sum(1 for t in r if t != P) - 1 for r in std.tolist()], strict=True)
        )
        for b, r in enumerate(out):  # accepted tokens are the drafts; greedy rows then emit the argmax
            emitted = [t for t in r if t != P]
            assert emitted[:-1] == drafts[b][: len(emitted) - 1]
    assert ops == "triton" or rescued > 0  # negative control: FLy accepted more than standard somewhere


def test_fly_greedy_rescue_example() -> None:
    """vLLM's first FLy test: drafts [1, 2, 3, 4], argmax [9, 2, 3, 4], W = 2, threshold 0: all accepted."""
    logits = torch.full((5, V), -100.0)
    for row, tok in enumerate([9, 2, 3, 4, 5]):
        logits[row, tok] = 100.0
    md = SpecDecodeMetadata.from_draft_tokens([[1, 2, 3, 4]])
    greedy = SamplingMetadata.greedy(1)
    assert RejectionSampler()(md, None, logits, greedy).tolist() == [[9, P, P, P, P]]
    fly = RejectionSampler(method="fly", fly=FlyConfig(2, 0.0, 3))
    assert fly(md, None, logits, greedy).tolist() == [[1, 2, 3, 4, 5]]
    strict = RejectionSampler(method="fly", fly=FlyConfig(2, 1e-3, 3))  # H = 0 < threshold: no rescue
    assert strict(md, None, logits, greedy).tolist() == [[9, P, P, P, P]]


def test_fly_configuration_rules(caplog: pytest.LogCaptureFixture) -> None:
    base = {"method": "ngram", "rejection_sample_method": "fly"}
    with caplog.at_level(logging.WARNING, logger="spec_backend.config"):
        cfg = SpeculativeConfig.model_validate({**base, "num_speculative_tokens": 9})
    assert "LOSSY" in caplog.text
    assert cfg.fly == FlyConfig(6, 0.3, 3) and cfg.fly_window_size == 6  # min(6, K - 1)
    assert SpeculativeConfig.model_validate({**base, "num_speculative_tokens": 3}).fly == FlyConfig(2, 0.3, 3)
    assert cfg.sampler_method == "fly"
    for extra, message in (
        ({"num_speculative_tokens": 1}, r"needs num_speculative_tokens >= 2.*got 1"),
        ({"num_speculative_tokens": 3, "fly_window_size": 3}, r"fly_window_size must be smaller .*=3, got 3"),
        ({"num_speculative_tokens": 3, "fly_window_size": 0}, r"fly_window_size"),
        ({"num_speculative_tokens": 3, "fly_entropy_top_k": 0}, r"fly_entropy_top_k"),
        ({"num_speculative_tokens": 3, "fly_entropy_threshold": -0.1}, r"fly_entropy_threshold"),
    ):
        with pytest.raises(ValueError, match=message):
            SpeculativeConfig.model_validate({**base, **extra})
    with pytest.raises(ValueError, match=r"'fly' has its own acceptance rule .*enable_block_verify=True"):
        from spec_backend.config import effective_rejection_sampler_config

        effective_rejection_sampler_config(cfg, Config(enable_block_verify=True))


def test_fly_sampler_arguments_and_label() -> None:
    with pytest.raises(ValueError, match=r"method='fly' needs fly=FlyConfig"):
        RejectionSampler(method="fly")
    with pytest.raises(ValueError, match=r"method='fly' needs fly=FlyConfig.*method='standard'"):
        RejectionSampler(fly=FlyConfig(2))
    with pytest.raises(
        ValueError, match=r"'fly' cannot be combined with enable_block_verify / enable_entropy"
    ):
        RejectionSampler(Config(enable_entropy_verify=True), method="fly", fly=FlyConfig(2))
    with pytest.raises(ValueError, match=r"fly_window_size must be an int >= 1, got 0"):
        FlyConfig(0)
    sampler = RejectionSampler(method="fly", fly=FlyConfig(2))
    assert sampler.mode_name == "fly" and not sampler.lossless
