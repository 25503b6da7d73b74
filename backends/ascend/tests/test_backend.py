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
from spec_backend.sampling.triton.ops import TritonSamplerOps


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


def _npu_calls(fake: ModuleType) -> int:
    return sum(1 for c in fake.CALLS if c[0] == "npu_top_k_top_p")


def test_sampler_ops_are_the_shared_triton_kernels_with_npu_top_k_top_p(fake_npu: ModuleType) -> None:
    ops = AscendBackend().sampler_ops()
    assert isinstance(ops, AscendSamplerOps) and isinstance(ops, TritonSamplerOps)
    assert ops.tuning == AscendBackend().sampler_tuning()
    ref = TorchSamplerOps()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen)  # [N, V]
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.9, 1.0])
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.5, 0.9, 1.0])
    cases = [  # (top_k, the sampler's max_top_k, whether the NPU op runs)
        (torch.tensor([0, 5, 2, 10, 60, 3]), 60, True),  # every sampled row applies top-k, k <= 1024
        (torch.tensor([0, 5, 0, 10, 60, 3]), None, False),  # a sampled row with top-k off (vLLM: k = V)
        (torch.tensor([0, 5, 2, 10, 2000, 3]), 2000, True),  # k >= V = 50: top-k off there, k = V fits
    ]
    for top_k, max_top_k, npu in cases:
        fake_npu.reset()
        got = ops.target_probs(logits, temperature, top_k, top_p, True, True, max_top_k=max_top_k)
        assert _npu_calls(fake_npu) == int(npu)
        want = ref.target_probs(logits, temperature, top_k, top_p, True, True)
        sampled = temperature > 0  # greedy rows' probabilities are never used
        torch.testing.assert_close(got[sampled], want[sampled], rtol=0, atol=1e-6)
    fake_npu.reset()
    top_p_only = ops.target_probs(logits, temperature, torch.zeros(6, dtype=torch.long), top_p, False, True)
    assert _npu_calls(fake_npu) == 1
    want = ref.target_probs(logits, temperature, torch.zeros(6, dtype=torch.long), top_p, False, True)
    torch.testing.assert_close(top_p_only, want, rtol=0, atol=1e-6)
    plain = ops.target_probs(logits, temperature, top_p.long(), top_p, False, False)
    torch.testing.assert_close(
        plain, ref.target_probs(logits, temperature, top_p.long(), top_p, False, False)
    )


def test_k_above_the_documented_1024_takes_the_torch_filter(fake_npu: ModuleType) -> None:
    ops = AscendBackend().sampler_ops()
    logits = torch.randn(2, 3000, generator=torch.Generator().manual_seed(2))
    temperature, top_p = torch.ones(2), torch.ones(2)
    top_k = torch.tensor([1500, 20])
    fake_npu.reset()
    got = ops.target_probs(logits, temperature, top_k, top_p, True, False, max_top_k=1500)
    assert _npu_calls(fake_npu) == 0
    torch.testing.assert_close(
        got, TorchSamplerOps().target_probs(logits, temperature, top_k, top_p, True, False)
    )
    with pytest.raises(RuntimeError, match=r"k must lie in \[1, 1024\]"):  # what the op documents
        fake_npu.npu_top_k_top_p(logits, None, top_k.to(torch.int32))


def test_npu_top_k_keeps_ties_at_the_kth_value_like_the_reference(fake_npu: ModuleType) -> None:
    """The documented rule masks values below the k-th largest: ties at it are kept (3 tokens for k=2)."""
    logits = torch.tensor([[3.0, 2.0, 2.0, 1.0, 0.5], [1.0, 1.0, 1.0, 0.0, 0.0]])
    k = torch.tensor([2, 1], dtype=torch.int32)
    masked = fake_npu.npu_top_k_top_p(logits, None, k)
    assert torch.isfinite(masked).tolist() == [
        [True, True, True, False, False],
        [True, True, True, False, False],
    ]
    ops = AscendBackend().sampler_ops()
    args = (logits, torch.ones(2), k.long(), torch.ones(2), True, False)
    assert torch.equal(ops.target_probs(*args, max_top_k=2), TorchSamplerOps().target_probs(*args))


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
