"""The CUDA backend on a machine without a GPU: probe, limits, capture policy, tuning, sampler ops
(the shared triton kernels under ``TRITON_INTERPRET=1`` with the CUDA tile size)."""

from __future__ import annotations

import pytest
import torch
from spec_backend_cuda import VOCAB_BLOCK, CudaBackend, memory_capped_capture_size

from spec_backend.backends import load_backend
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata


def test_loaded_through_its_entry_point() -> None:
    assert isinstance(load_backend("cuda"), CudaBackend)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the probe on a machine without CUDA")
def test_probe_reports_why_it_is_unavailable() -> None:
    status = CudaBackend().probe()
    assert not status.available and "CUDA" in status.reason and torch.__version__ in status.reason


def test_probe_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> bool:
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    status = CudaBackend().probe()
    assert not status.available and "CUDA probe failed: RuntimeError: driver exploded" in status.reason


def test_token_limits_and_capture_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = CudaBackend()
    assert backend.token_limits().max_query_tokens_per_request is None
    backend.check_num_speculative_tokens(128)
    with pytest.raises(ValueError, match="exceeds the limit of backend 'cuda'"):
        backend.check_num_speculative_tokens(129)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    policy = backend.capture_policy()
    assert policy.max_capture_size == 512 and policy.graph_budget is None and policy.enabled
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (3 << 30, 80 << 30))
    assert backend.capture_policy().max_capture_size == 192 == memory_capped_capture_size(3 << 30)


def test_sampler_tuning_and_ops() -> None:
    pytest.importorskip("triton")
    from spec_backend.sampling.triton.ops import TritonSamplerOps

    backend = CudaBackend()
    tuning = backend.sampler_tuning()
    assert tuning.vocab_block == VOCAB_BLOCK == 4096 and tuning.max_grid is None and tuning.device_uniforms
    assert (tuning.vocab_splits, tuning.fused_verify, tuning.fused_block) == (32, True, 1024)  # measured
    ops = backend.sampler_ops()
    assert isinstance(ops, TritonSamplerOps) and ops.tuning == tuning


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rejection_sampler_with_cuda_ops_equals_the_reference(temperature: float) -> None:
    """Seeded requests give the reference backend's tokens (kernels interpreted on CPU, V=48)."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(3)
    drafts = [[5, 7], [1], [9, 9]]
    meta = SpecDecodeMetadata.from_draft_tokens(drafts, device)
    logits = (torch.randn(8, 48, generator=gen) * 3).to(device)  # [T + B, V]
    sampling = SamplingMetadata.from_lists(
        [temperature] * 3, seeds=[11, 12, 13], positions=[4, 9, 2], device=device
    )
    out = RejectionSampler(backend=CudaBackend())(meta, None, logits, sampling)
    cpu_meta = SpecDecodeMetadata.from_draft_tokens(drafts, "cpu")
    cpu_sampling = SamplingMetadata.from_lists([temperature] * 3, seeds=[11, 12, 13], positions=[4, 9, 2])
    ref = RejectionSampler(backend=ReferenceBackend())(cpu_meta, None, logits.cpu(), cpu_sampling)
    assert torch.equal(out.cpu(), ref)


def test_gpus_older_than_ampere_fall_back_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    """flash-attn needs compute capability 8.0: a Turing GPU (7.5) runs SDPA, and the probe says so."""
    from spec_backend_cuda import attention

    assert (
        attention.flash_capability_reason((8, 0)) is None
        and attention.flash_capability_reason((9, 0)) is None
    )
    assert attention.flash_capability_reason((7, 5)) == (
        "compute capability 7.5 (flash-attn needs 8.0, Ampere, or newer)"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    try:
        for capability, note in (
            (
                (7, 5),
                "attention runs on SDPA: compute capability 7.5 (flash-attn needs 8.0, Ampere, or newer)",
            ),
            ((9, 0), ""),
        ):
            attention.device_capability.cache_clear()
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0, c=capability: c)
            status = CudaBackend().probe()
            assert status.available and status.reason == note
        assert str(status) == "available"
    finally:
        attention.device_capability.cache_clear()
