"""Bad input gives clear errors; flags, warn-once, synthetic mode, output parsing, no host sync."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from spec_backend.backends.base import TokenLimits
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.config.rejection import RejectionSamplerConfig as Config
from spec_backend.sampling import (
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    SamplerInputError,
    SamplingMetadata,
    SpecDecodeMetadata,
    parse_output,
)
from spec_backend.sampling import sampler as sampler_module

V = 6


def inputs(ks: list[int]) -> tuple[SpecDecodeMetadata, torch.Tensor, torch.Tensor, SamplingMetadata]:
    md = SpecDecodeMetadata.from_draft_tokens([[1] * k for k in ks])
    logits = torch.randn(sum(ks) + len(ks), V)
    return md, logits, torch.full((sum(ks), V), 1.0 / V), SamplingMetadata.random(len(ks), seed=0)


def test_shape_errors() -> None:
    md, logits, dprobs, sampling = inputs([2, 3])
    s = RejectionSampler()
    with pytest.raises(SamplerInputError, match=r"logits has 6 rows .* expected T\+B=7"):
        s(md, dprobs, logits[:6], sampling)
    with pytest.raises(SamplerInputError, match=r"logits must be 2-D"):
        s(md, dprobs, logits[None], sampling)
    with pytest.raises(
        SamplerInputError, match=r"draft_probs has shape \[5, 5\], expected \[T, V\]=\[5, 6\]"
    ):
        s(md, dprobs[:, :5], logits, sampling)
    with pytest.raises(SamplerInputError, match=r"SamplingMetadata has B=3 .* B=2"):
        s(md, dprobs, logits, SamplingMetadata.greedy(3))
    with pytest.raises(SamplerInputError, match=r"draft_token_ids contains id 9, outside the vocabulary"):
        s(SpecDecodeMetadata.from_draft_tokens([[9], [0, 1, 2, 3]]), dprobs, logits, sampling)


def test_metadata_errors() -> None:
    md = SpecDecodeMetadata.from_draft_tokens([[1, 2], [3]])
    with pytest.raises(
        SamplerInputError, match=r"SpecDecodeMetadata.draft_token_ids has shape \[2\], expected \[3\]"
    ):
        SpecDecodeMetadata(
            md.draft_token_ids[:2], [2, 1], md.cu_num_draft_tokens, md.target_logits_indices,
            md.bonus_logits_indices, md.logits_indices,
        )  # fmt: skip
    with pytest.raises(SamplerInputError, match=r"max_spec_len=5 but max\(num_draft_tokens\)=2"):
        SpecDecodeMetadata(
            md.draft_token_ids, [2, 1], md.cu_num_draft_tokens, md.target_logits_indices,
            md.bonus_logits_indices, md.logits_indices, max_spec_len=5,
        )  # fmt: skip
    with pytest.raises(
        SamplerInputError, match=r"ints in \[0, 2\*\*31 - 1\] or PLACEHOLDER_TOKEN_ID \(-1\), got -3"
    ):
        SpecDecodeMetadata.from_draft_tokens([[1, -3]])


def test_sampling_metadata_errors() -> None:
    with pytest.raises(SamplerInputError, match=r"temperature must be finite and >= 0, got \[1.0, -0.5\]"):
        SamplingMetadata.from_lists([1.0, -0.5])
    with pytest.raises(SamplerInputError, match=r"temperature must be finite"):
        SamplingMetadata.from_lists([float("nan")])
    with pytest.raises(SamplerInputError, match=r"top_p must be in \(0, 1\], got \[0.0\]"):
        SamplingMetadata.from_lists([1.0], top_p=[0.0])
    with pytest.raises(SamplerInputError, match=r"top_p must be in \(0, 1\], got \[1.5\]"):
        SamplingMetadata.from_lists([1.0], top_p=[1.5])
    with pytest.raises(SamplerInputError, match=r"top_k must be >= 0"):
        SamplingMetadata.from_lists([1.0], top_k=[-1])
    with pytest.raises(
        SamplerInputError, match=r"SamplingMetadata.top_p has shape \[3\], expected \[B\] with B=2"
    ):
        SamplingMetadata(torch.ones(2), torch.zeros(2, dtype=torch.int64), torch.ones(3))
    with pytest.raises(SamplerInputError, match=r"seeds has 1 entries, expected B=2"):
        SamplingMetadata.from_lists([1.0, 1.0], seeds=[1])


class SmallBackend(ReferenceBackend):
    def token_limits(self) -> TokenLimits:
        return TokenLimits(max_speculative_tokens=4)


def test_k_limits() -> None:
    md, logits, dprobs, sampling = inputs([128, 1])
    assert RejectionSampler()(md, dprobs, logits, sampling).shape == (2, 129)
    md, logits, dprobs, sampling = inputs([1, 129])
    with pytest.raises(SamplerInputError, match=r"request 1 has K=129 draft tokens .* limit of 128"):
        RejectionSampler()(md, dprobs, logits, sampling)
    md, logits, dprobs, sampling = inputs([5])
    with pytest.raises(SamplerInputError, match=r"K=5 .* limit of 4 speculative tokens .* 'reference'"):
        RejectionSampler(backend=SmallBackend())(md, dprobs, logits, sampling)


def test_debug_checks_nan_and_ids() -> None:
    md, logits, dprobs, sampling = inputs([2, 1])
    logits[2, 3] = float("nan")
    with pytest.raises(SamplerInputError, match=r"logits contains NaN in row\(s\) \[2\]"):
        RejectionSampler(debug=True)(md, dprobs, logits, sampling)
    RejectionSampler()(md, dprobs, logits, sampling)  # not checked on the hot path (documented)
    md, logits, dprobs, sampling = inputs([2, 1])
    md.max_draft_token_id = None  # as if built from device tensors
    md.draft_token_ids[0] = 17
    with pytest.raises(
        SamplerInputError, match=r"draft_token_ids contains id 17, outside the vocabulary \[0, V=6\)"
    ):
        RejectionSampler(debug=True)(md, dprobs, logits, sampling)


def test_constructor_errors() -> None:
    with pytest.raises(
        ValueError, match=r"unknown rejection sampler method 'typical'; allowed: standard, synthetic"
    ):
        RejectionSampler(method="typical")
    with pytest.raises(ValueError, match=r"needs synthetic_acceptance_rates"):
        RejectionSampler(method="synthetic")
    with pytest.raises(ValueError, match=r"must be non-increasing, got \[0.5, 0.7\]"):
        RejectionSampler(method="synthetic", synthetic_acceptance_rates=[0.5, 0.7])
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        RejectionSampler(method="synthetic", synthetic_acceptance_rates=[1.5])
    with pytest.raises(ValueError, match=r"only used with method='synthetic'"):
        RejectionSampler(synthetic_acceptance_rates=[0.5])
    with pytest.raises(ValueError, match=r"cannot be combined"):
        RejectionSampler(
            Config(enable_block_verify=True), method="synthetic", synthetic_acceptance_rates=[0.5]
        )
    md, logits, dprobs, sampling = inputs([3])
    with pytest.raises(
        SamplerInputError, match=r"K=3 draft tokens but synthetic_acceptance_rates has only 2"
    ):
        RejectionSampler(method="synthetic", synthetic_acceptance_rates=[0.5, 0.2])(
            md, dprobs, logits, sampling
        )


@pytest.fixture
def fresh_warnings() -> Iterator[None]:
    saved = set(sampler_module._WARNED)
    sampler_module._WARNED.clear()
    yield
    sampler_module._WARNED.clear()
    sampler_module._WARNED.update(saved)


@pytest.mark.parametrize(
    ("config", "method", "mode", "lossless"),
    [
        (Config(), "standard", "standard", True),
        (Config(enable_block_verify=True), "standard", "block-lossless", True),
        (
            Config(enable_block_verify=True, block_verify_mode="cumulative"),
            "standard",
            "block-cumulative",
            False,
        ),
        (Config(enable_entropy_verify=True), "standard", "entropy", False),
        (
            Config(enable_entropy_verify=True, enable_block_verify=True),
            "standard",
            "block-lossless+entropy",
            False,
        ),
        (Config(), "synthetic", "synthetic", False),
    ],
)
def test_flags_and_warn_once(
    fresh_warnings: None,
    caplog: pytest.LogCaptureFixture,
    config: Config,
    method: str,
    mode: str,
    lossless: bool,
) -> None:
    rates = [0.5] if method == "synthetic" else None
    with caplog.at_level(logging.WARNING, logger="spec_backend.sampling"):
        s = RejectionSampler(config, method=method, synthetic_acceptance_rates=rates)
        RejectionSampler(config, method=method, synthetic_acceptance_rates=rates)
    assert s.mode_name == mode and s.lossless is lossless
    lossy = [r for r in caplog.records if "LOSSY" in r.getMessage()]
    assert len(lossy) == (0 if lossless else 1)
    if lossy:
        assert repr(mode) in lossy[0].getMessage()


def test_synthetic_accept_count_distribution() -> None:
    rates = [0.8, 0.5, 0.3, 0.1]
    n, ks = 8000, [4, 2]
    md = SpecDecodeMetadata.from_draft_tokens([[1] * ks[b % 2] for b in range(n)])
    logits = torch.randn(md.num_tokens + n, V)
    temps = [0.0 if b % 4 == 0 else 1.0 for b in range(n)]
    out = RejectionSampler(method="synthetic", synthetic_acceptance_rates=rates)(
        md, None, logits, SamplingMetadata.from_lists(temps, seeds=list(range(n)), positions=[0] * n)
    )
    _, accepted = parse_output(out)
    counts = torch.tensor(accepted)
    for k, sel in ((4, slice(0, n, 2)), (2, slice(1, n, 2))):
        c = counts[sel]
        m = c.numel()
        for i in range(k):
            # P(count >= i+1) = rates[i]; tolerance 5 standard errors (sqrt(p(1-p)/m) <= 0.0079)
            assert abs(float((c >= i + 1).double().mean()) - rates[i]) < 5 * (0.25 / m) ** 0.5
        assert int(c.max()) <= k
    # greedy rows emit the target argmax after the accepted drafts
    row_logits = torch.split(logits, [ks[b % 2] + 1 for b in range(n)])
    for b in range(0, 40, 4):
        a = accepted[b]
        assert int(out[b, a]) == int(torch.argmax(row_logits[b][a]))


def test_empty_batch() -> None:
    out = RejectionSampler()(
        SpecDecodeMetadata.from_draft_tokens([]), None, torch.zeros(0, V), SamplingMetadata.greedy(0)
    )
    assert out.shape == (0, 1) and out.dtype == torch.int32


def test_parse_output() -> None:
    out = torch.tensor(
        [[3, 4, 5], [7, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID], [1, 99, PLACEHOLDER_TOKEN_ID]]
    )
    assert parse_output(out) == ([[3, 4, 5], [7], [1, 99]], [2, 0, 1])
    assert parse_output(out, vocab_size=50) == ([[3, 4, 5], [7], [1]], [2, 0, 0])
    with pytest.raises(ValueError, match=r"output must be 2-D"):
        parse_output(out[0])


@pytest.mark.parametrize(
    "config",
    [
        Config(),
        Config(enable_block_verify=True),
        Config(enable_block_verify=True, enable_entropy_verify=True),
    ],
)
def test_hot_path_never_reads_device_values(monkeypatch: pytest.MonkeyPatch, config: Config) -> None:
    md, logits, dprobs, _ = inputs([3, 0, 2])
    sampling = SamplingMetadata.from_lists(
        [0.0, 1.0, 0.7], top_k=[0, 2, 0], top_p=[1.0, 1.0, 0.9], seeds=[1, None, 2]
    )
    sampler = RejectionSampler(config)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("host sync on the hot path")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    out = sampler(md, dprobs, logits, sampling)
    monkeypatch.undo()
    assert out.shape == (3, 4)


def test_sampling_metadata_dtypes_are_named_errors() -> None:
    """Wrong dtypes fail at construction, naming the field, instead of crashing inside the RNG."""
    t = torch.ones(2)
    cases = {
        "top_k": (dict(top_k=torch.tensor([1.5, 2.0])), "integer dtype, got torch.float32"),
        "top_p": (dict(top_p=torch.tensor([1, 1])), "floating dtype, got torch.int64"),
        "seeds": (dict(seeds=torch.tensor([1.0, 2.0])), "integer dtype, got torch.float32"),
        "positions": (dict(positions=torch.tensor([0.5, 1.0])), "integer dtype, got torch.float32"),
        "temperature": (dict(temperature=torch.tensor([1, 1])), "floating dtype, got torch.int64"),
    }
    for name, (kwargs, message) in cases.items():
        args = {"temperature": t, **kwargs}
        with pytest.raises(SamplerInputError, match=rf"SamplingMetadata.{name} must have an? .*{message}"):
            SamplingMetadata(**args)
    with pytest.raises(SamplerInputError, match=r"SamplingMetadata.seeds must have an integer dtype"):
        SamplingMetadata(temperature=t, seeds=torch.tensor([True, False]))
    with pytest.raises(SamplerInputError, match=r"seeds must be in \[0, 2\*\*63 - 1\], or -1 for unseeded"):
        SamplingMetadata(temperature=t, seeds=torch.tensor([-5, 0]))


def test_sampling_metadata_python_values_are_checked_before_any_tensor() -> None:
    with pytest.raises(SamplerInputError, match=r"top_k\[1\] must be an int, got float: 2.5"):
        SamplingMetadata.from_lists([1.0, 1.0], top_k=[1, 2.5])
    with pytest.raises(SamplerInputError, match=r"temperature\[0\] must be a number, got str"):
        SamplingMetadata.from_lists(["1"])  # type: ignore[list-item]
    for bad in (2**63, -1, -(2**70), 1.0, True):
        with pytest.raises(SamplerInputError, match=r"seeds\[0\] must be None \(unseeded\) or an int in \[0"):
            SamplingMetadata.from_lists([1.0], seeds=[bad])  # type: ignore[list-item]
    md = SamplingMetadata.from_lists([1.0, 1.0], seeds=[2**63 - 1, None])
    assert md.seeds is not None and md.seeds.tolist() == [2**63 - 1, -1]


def test_top_k_and_top_p_none_mean_off() -> None:
    """As in vLLM's SamplingMetadata: ``top_k=None`` / ``top_p=None`` switch the filters off."""
    md, logits, _, _ = inputs([2, 1])
    none = SamplingMetadata(
        temperature=torch.ones(2), top_k=None, top_p=None, seeds=torch.tensor([4, 5]),
        positions=torch.tensor([0, 9]),
    )  # fmt: skip
    off = SamplingMetadata.from_lists(
        [1.0, 1.0], top_k=[0, 0], top_p=[1.0, 1.0], seeds=[4, 5], positions=[0, 9]
    )
    assert not none.apply_top_k and not none.apply_top_p
    assert torch.equal(RejectionSampler()(md, None, logits, none), RejectionSampler()(md, None, logits, off))


def test_debug_checks_reject_non_finite_inputs() -> None:
    """+inf logits, rows without a finite entry and non-finite draft probabilities are errors in debug
    mode (before, a single +inf at id 7 yielded token 0 in random mode); -inf (masked tokens) is fine."""
    md, logits, dprobs, sampling = inputs([2, 1])
    s = RejectionSampler(debug=True)
    bad = logits.clone()
    bad[1, 3] = float("inf")
    with pytest.raises(SamplerInputError, match=r"logits contains \+inf in row\(s\) \[1\]"):
        s(md, dprobs, bad, sampling)
    bad = logits.clone()
    bad[4] = float("-inf")
    with pytest.raises(SamplerInputError, match=r"logits has no finite entry in row\(s\) \[4\]"):
        s(md, dprobs, bad, sampling)
    for value in (float("inf"), float("nan"), -0.5):
        q = dprobs.clone()
        q[0, 2] = value
        with pytest.raises(SamplerInputError, match=r"draft_probs contains NaN, infinite or negative"):
            s(md, q, logits, sampling)
    masked = logits.clone()
    masked[:, 0] = float("-inf")
    assert s(md, dprobs, masked, sampling).shape == (2, 3)
