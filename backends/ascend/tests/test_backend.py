"""Probe, import hygiene and the parts the Ascend backend hands out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import ModuleType

import pytest
import torch
from spec_backend_ascend import AscendBackend
from spec_backend_ascend.graph_runner import AclGraphRunner
from spec_backend_ascend.sampler import AscendSamplerOps

from spec_backend.backends import BackendError
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling.ops import SamplerOps
from spec_backend.sampling.torch_ops import TorchSamplerOps
from spec_backend.sampling.triton_ops import TritonSamplerOps


class _OpsBackend(ReferenceBackend):
    """The reference backend with the sampler ops under test (tensors stay on the CPU)."""

    def __init__(self, ops: SamplerOps) -> None:
        self._ops = ops

    def sampler_ops(self) -> SamplerOps:
        return self._ops


def test_probe_with_the_fake_present_is_available(fake_npu: ModuleType) -> None:
    status = AscendBackend().probe()
    assert status.available, str(status)
    assert str(status) == "available"


def test_probe_without_torch_npu_reports_the_reason() -> None:
    assert str(AscendBackend().probe()).startswith("unavailable: torch_npu is not installed")


def test_importing_and_listing_never_imports_torch_npu() -> None:
    """A fresh interpreter: import the package, list and probe every backend, touch the cheap parts."""
    code = textwrap.dedent(
        """
        import sys
        import spec_backend_ascend
        from spec_backend.backends import list_backends
        infos = {i.name: i for i in list_backends()}
        assert not infos["ascend"].available, infos["ascend"].reason
        backend = spec_backend_ascend.AscendBackend()
        backend.token_limits(); backend.capture_policy(32); backend.sampler_tuning(); backend.describe()
        assert "torch_npu" not in sys.modules, "torch_npu was imported"
        print("ok", infos["ascend"].reason)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok torch_npu is not installed")


def test_device_parts_with_the_fake(fake_npu: ModuleType) -> None:
    backend = AscendBackend()
    assert isinstance(backend.graph_runner(lambda x: x, [16, 32]), AclGraphRunner)
    tuning = backend.sampler_tuning()
    assert (tuning.vocab_block, tuning.max_grid, tuning.device_uniforms) == (2048, 40, False)


def test_sampler_ops_need_torch_npu() -> None:
    with pytest.raises(BackendError, match="the ascend backend needs torch_npu"):
        AscendBackend().sampler_ops()


def test_sampler_ops_are_the_shared_triton_kernels_with_npu_top_k_top_p(fake_npu: ModuleType) -> None:
    ops = AscendBackend().sampler_ops()
    assert isinstance(ops, AscendSamplerOps) and isinstance(ops, TritonSamplerOps)
    assert ops.tuning == AscendBackend().sampler_tuning()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen)  # [N, V]
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.9, 1.0])
    top_k = torch.tensor([0, 5, 0, 10, 60, 3])
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.5, 0.9, 1.0])
    fake_npu.reset()
    got = ops.target_probs(logits, temperature, top_k, top_p, True, True)  # [N, V]
    assert ("npu_top_k_top_p", None) in fake_npu.CALLS
    want = TorchSamplerOps().target_probs(logits, temperature, top_k, top_p, True, True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)  # random logits: no ties at the k-th value
    plain = ops.target_probs(logits, temperature, top_k, top_p, False, False)
    torch.testing.assert_close(
        plain, TorchSamplerOps().target_probs(logits, temperature, top_k, top_p, False, False)
    )


def test_rejection_sampler_runs_on_ascend_ops(fake_npu: ModuleType) -> None:
    ops = AscendBackend().sampler_ops()
    meta = SpecDecodeMetadata.from_draft_tokens([[3, 4, 5], [], [7]], torch.device("cpu"))
    logits = torch.randn(4 + 3, 40, generator=torch.Generator().manual_seed(1))  # [T+B, V]
    sampling = SamplingMetadata.from_lists(
        temperature=[0.0, 1.0, 0.8],
        top_k=[0, 0, 5],
        top_p=[1.0, 0.9, 1.0],
        seeds=[1, 2, 3],
        positions=[10, 4, 7],
    )
    ref = RejectionSampler(backend=_OpsBackend(TorchSamplerOps()))(meta, None, logits, sampling)
    out = RejectionSampler(backend=_OpsBackend(ops))(meta, None, logits, sampling)
    assert torch.equal(out, ref)
