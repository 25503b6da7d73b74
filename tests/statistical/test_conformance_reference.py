"""The conformance suite on the reference backend, plus negative controls proving the suite has teeth.

Deterministic (fixed seeds). Noise floor of the Monte-Carlo tier: χ² p-value >= 1e-5 per group (see
``spec_backend.testing.montecarlo``). Runtime: ~1.5-2 min on 2 CPU cores.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from spec_backend.backends import load_backend
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.config.rejection import RejectionSamplerConfig
from spec_backend.sampling import RejectionSampler, SamplingMetadata
from spec_backend.sampling.torch_ops import TorchSamplerOps
from spec_backend.testing import (
    MODES,
    ConformanceError,
    build_sampler,
    check_lossless_label,
    check_monte_carlo,
    check_sampler,
    monte_carlo,
    run_conformance,
)
from spec_backend.testing.exact_checks import argmax_first_rate, exact_check_list
from spec_backend.testing.properties import check_batch_independence, check_determinism

pytestmark = pytest.mark.statistical


def _assert_all(results: list[Any]) -> None:
    failed = [str(r) for r in results if not r.passed]
    assert not failed, "\n".join(failed)


# --- exact tier -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "check"), exact_check_list(), ids=[n for n, _ in exact_check_list()])
def test_exact_tier(name: str, check: Any) -> None:
    check().check()


def test_issue_numbers() -> None:
    """The issue's example: 76% (cumulative, K = 3) and 79% (entropy, θ = .95, α = .4) instead of 50%."""
    assert argmax_first_rate("standard") == pytest.approx(0.5, abs=1e-12)
    assert argmax_first_rate("block-lossless") == pytest.approx(0.5, abs=1e-12)
    assert argmax_first_rate("block-cumulative") == pytest.approx(0.7634, abs=1e-4)
    assert argmax_first_rate("entropy") == pytest.approx(0.7895, abs=1e-4)


# --- the reference backend's sampler, every mode ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_reference_sampler_conforms(mode: str) -> None:
    sampler = build_sampler(mode, load_backend("reference"))
    _assert_all(check_sampler(sampler, mode))


def test_run_conformance_report() -> None:
    report = run_conformance("reference", modes=("standard", "block-cumulative"), samples=4000, exact=False)
    report.assert_passed()
    names = [c.name for c in report.checks]
    assert "label/lossy_measured[block-cumulative]" in names
    assert any(n.startswith("properties/greedy_exact[standard]") for n in names)


# --- negative controls: the suite must FAIL on these -------------------------------------------------------


class MislabelledSampler(RejectionSampler):
    """A lossy mode that claims to be lossless."""

    @property
    def lossless(self) -> bool:
        return True


class ImpostorSampler(RejectionSampler):
    """Runs vllm-ascend's cumulative rule but reports itself as the standard mode."""

    @property
    def mode_name(self) -> str:
        return "standard"

    @property
    def lossless(self) -> bool:
        return True


class OverCautiousSampler(RejectionSampler):
    """A lossless mode labelled lossy: the label does not match the measured behaviour either."""

    @property
    def lossless(self) -> bool:
        return False


CUMULATIVE = RejectionSamplerConfig(enable_block_verify=True, block_verify_mode="cumulative")


def _failed(results: list[Any], prefix: str) -> list[str]:
    return [r.name for r in results if r.name.startswith(prefix) and not r.passed]


@pytest.mark.parametrize(
    "config",
    [CUMULATIVE, RejectionSamplerConfig(enable_entropy_verify=True)],
    ids=["cumulative", "entropy"],
)
def test_mislabelled_lossy_sampler_fails(config: RejectionSamplerConfig) -> None:
    sampler = MislabelledSampler(config)
    results = monte_carlo(sampler, samples=5000)
    label = check_lossless_label(sampler, results, "mislabelled")
    assert "label/exact[mislabelled]" in _failed(label, "label/exact")
    assert "label/lossless_measured[mislabelled/issue_greedy_v4_k3]" in _failed(
        label, "label/lossless_measured"
    )
    with pytest.raises(ConformanceError):
        for result in label:
            result.check()


def test_impostor_fails_spec_and_label() -> None:
    sampler = ImpostorSampler(CUMULATIVE)
    results = monte_carlo(sampler, samples=5000)
    assert _failed(check_monte_carlo(sampler, results, "impostor"), "montecarlo/spec")
    assert _failed(check_lossless_label(sampler, results, "impostor"), "label/lossless_measured")


def test_over_cautious_label_fails() -> None:
    sampler = OverCautiousSampler()
    results = monte_carlo(sampler, samples=5000)
    assert _failed(check_lossless_label(sampler, results, "cautious"), "label/")


class _UnscaledResidualOps(TorchSamplerOps):
    """Bug: block verification's residual ignores the weight b_τ (samples norm(max(p − q, 0)))."""

    def sample_residual(
        self,
        target_probs: Any,
        target_rows: Any,
        draft_probs: Any,
        draft_ids: Any,
        draft_rows: Any,
        scale: Any,
        seeds: Any,
        positions: Any,
    ) -> Any:
        ones = torch.ones_like(scale)
        return super().sample_residual(
            target_probs, target_rows, draft_probs, draft_ids, draft_rows, ones, seeds, positions
        )


class _TargetOnRejectOps(TorchSamplerOps):
    """Bug: on rejection, sample the target p instead of the residual max(p − q, 0)."""

    def sample_residual(
        self,
        target_probs: Any,
        target_rows: Any,
        draft_probs: Any,
        draft_ids: Any,
        draft_rows: Any,
        scale: Any,
        seeds: Any,
        positions: Any,
    ) -> Any:
        none = torch.full_like(draft_rows, -1)
        return super().sample_residual(
            target_probs, target_rows, draft_probs, draft_ids, none, scale, seeds, positions
        )


class _LastBlockThresholdOps(TorchSamplerOps):
    """Bug: block verification's last threshold h_K = 1 instead of b_K (always keeps a full block)."""

    def block_verify(
        self,
        draft_ids: Any,
        draft_probs: Any,
        target_probs: Any,
        target_rows: Any,
        uniforms: Any,
        thresholds: Any,
        cu_num_draft_tokens: Any,
        max_spec_len: int,
    ) -> Any:
        counts = torch.diff(cu_num_draft_tokens.to(torch.int64), prepend=cu_num_draft_tokens.new_zeros(1))
        last = cu_num_draft_tokens.to(torch.int64) - 1  # [B] flat index of each request's last draft
        u = uniforms.clone()
        u[last[counts > 0]] = 0.0  # η_K = 0 passes any h_K > 0: τ = K whenever b_K > 0
        return super().block_verify(
            draft_ids,
            draft_probs,
            target_probs,
            target_rows,
            u,
            thresholds,
            cu_num_draft_tokens,
            max_spec_len,
        )


def _backend_with(ops: TorchSamplerOps) -> ReferenceBackend:
    class BuggyBackend(ReferenceBackend):
        name = "buggy-reference"

        def sampler_ops(self) -> Any:
            return ops

    return BuggyBackend()


@pytest.mark.parametrize(
    ("ops", "mode"),
    [
        (_UnscaledResidualOps(), "block-lossless"),
        (_TargetOnRejectOps(), "standard"),
        (_LastBlockThresholdOps(), "block-lossless"),
    ],
    ids=["block-residual-ignores-b", "standard-samples-p-on-reject", "block-h_K-is-1"],
)
def test_buggy_kernels_are_caught(ops: TorchSamplerOps, mode: str) -> None:
    sampler = build_sampler(mode, _backend_with(ops))
    results = monte_carlo(sampler, samples=20000)
    spec_failures = _failed(check_monte_carlo(sampler, results, mode), "montecarlo/spec")
    label_failures = _failed(check_lossless_label(sampler, results, mode), "label/lossless_measured")
    assert spec_failures, "the Monte-Carlo tier did not notice a broken kernel"
    assert label_failures, "the lossless label check did not notice a broken kernel"


class _UnseededSampler(RejectionSampler):
    """Bug: drops the per-request seeds (fresh randomness every call)."""

    def __call__(self, metadata: Any, draft_probs: Any, logits: Any, sampling: Any) -> torch.Tensor:
        unseeded = SamplingMetadata(
            sampling.temperature, sampling.top_k, sampling.top_p, None, sampling.positions
        )
        return super().__call__(metadata, draft_probs, logits, unseeded)


class _SlotSeededSampler(RejectionSampler):
    """Bug: keys the randomness by the request's slot in the batch instead of its seed."""

    def __call__(self, metadata: Any, draft_probs: Any, logits: Any, sampling: Any) -> torch.Tensor:
        slots = torch.arange(sampling.temperature.shape[0], dtype=torch.int64)
        slotted = SamplingMetadata(
            sampling.temperature, sampling.top_k, sampling.top_p, slots, sampling.positions
        )
        return super().__call__(metadata, draft_probs, logits, slotted)


def test_property_checks_catch_rng_bugs() -> None:
    assert not check_determinism(_UnseededSampler()).passed
    assert not check_batch_independence(_SlotSeededSampler()).passed
    assert check_determinism(RejectionSampler()).passed
