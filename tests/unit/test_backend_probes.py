"""Probes are cheap and never raise; the cuda probe never imports torch_npu; limits are enforced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from spec_backend_ascend import GRAPH_STREAM_BUDGET, MAX_QUERY_TOKENS_PER_REQUEST, AscendBackend, StreamLedger
from spec_backend_cuda import CudaBackend, memory_capped_capture_size

from spec_backend.backends import BackendError, load_backend
from spec_backend.backends.reference import ReferenceBackend


@pytest.fixture
def broken_torch_npu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch_npu that fails like it does without CANN."""
    (tmp_path / "torch_npu.py").write_text(
        "raise OSError('libhccl.so: cannot open shared object file: No such file or directory')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)


def test_ascend_probe_turns_import_failure_into_unavailable(broken_torch_npu: None) -> None:
    status = AscendBackend().probe()
    assert not status.available
    assert str(status).startswith("unavailable: torch_npu failed to import: OSError: libhccl.so")


def test_cuda_probe_never_imports_torch_npu(broken_torch_npu: None) -> None:
    CudaBackend().probe()
    assert "torch_npu" not in sys.modules


def test_probes_without_hardware() -> None:
    assert ReferenceBackend().probe().available
    assert "no CUDA" in str(CudaBackend().probe()) or "without CUDA" in str(CudaBackend().probe())
    assert "torch_npu is not installed" in str(AscendBackend().probe())


def test_ascend_token_limit_rejects_k_16_and_accepts_k_15() -> None:
    backend = AscendBackend()
    assert MAX_QUERY_TOKENS_PER_REQUEST == 16
    backend.check_num_speculative_tokens(15)
    with pytest.raises(ValueError, match=r"backend 'ascend' allows at most 16 query tokens .* K\+1=17"):
        backend.check_num_speculative_tokens(16)


def test_sampler_limit_of_128_draft_tokens() -> None:
    ReferenceBackend().check_num_speculative_tokens(128)
    with pytest.raises(ValueError, match=r"num_speculative_tokens=129 exceeds .* at most 128"):
        ReferenceBackend().check_num_speculative_tokens(129)


def test_cuda_parts_that_need_a_device_refuse_loudly() -> None:
    """Without a GPU, CUDA graph capture names CUDA and the way out; the device-agnostic parts work.

    The CUDA backend's own tests (backends/cuda/tests) cover each part; this is the cross-backend view.
    """
    backend = CudaBackend()
    assert callable(backend.attention_function())
    assert type(backend.sampler_ops()).__name__ == "TritonSamplerOps"
    if torch.cuda.is_available():
        return
    runner = backend.graph_runner(lambda x: x, [2])
    with pytest.raises(BackendError, match="needs an NVIDIA GPU with CUDA"):
        runner.capture({"x": torch.zeros(2)})


def test_capture_policies() -> None:
    assert memory_capped_capture_size(None) == 512
    assert memory_capped_capture_size(2 << 30) == 128  # 2 GiB free -> 128 tokens
    assert memory_capped_capture_size(80 << 30) == 512
    assert memory_capped_capture_size(0) == 16
    # whole-forward graphs: one stream each out of 1800, whatever the depth (a heuristic)
    assert AscendBackend().capture_policy(num_hidden_layers=59).graph_budget == GRAPH_STREAM_BUDGET == 1800
    ledger = StreamLedger(total=10, per_graph=2)
    ledger.reserve(3)
    assert ledger.graphs_left == 2
    with pytest.raises(ValueError, match="3 graphs do not fit the 2 left in the stream budget"):
        ledger.reserve(3)
    with pytest.raises(ValueError, match="need total >= 0 and per_graph >= 1, got 10, 0"):
        StreamLedger(total=10, per_graph=0)
    assert not load_backend("reference").capture_policy().enabled
    assert AscendBackend().sampler_tuning().vocab_block == 2048


def test_ragged_mask_is_built_once_per_step_and_never_stale() -> None:
    from spec_backend.backends.attention import ragged_causal_mask
    from spec_backend.step import RaggedAttentionMetadata

    meta = RaggedAttentionMetadata(query_lens=torch.tensor([2, 1]), kv_lens=torch.tensor([5, 3]))
    first = ragged_causal_mask(meta, 2, 5)  # [B, 1, Q, L]
    assert ragged_causal_mask(meta, 2, 5) is first  # the next layer reuses it
    # request 0: queries at positions 3 and 4; request 1: one query at position 2 (its padding row is
    # ignored by the engine; it always sees key 0 so its softmax stays finite)
    assert first[0, 0].tolist() == [[True] * 4 + [False], [True] * 5]
    assert first[1, 0, 0].tolist() == [True] * 3 + [False] * 2
    assert first[1, 0, 1, 0]
    meta.kv_lens.copy_(torch.tensor([4, 3]))  # static buffers updated in place: a new mask
    updated = ragged_causal_mask(meta, 2, 5)
    assert updated is not first
    assert updated[0, 0].tolist() == [[True] * 3 + [False] * 2, [True] * 4 + [False]]


def test_ragged_mask_cache_under_inference_mode_uses_invalidate() -> None:
    from spec_backend.backends.attention import ragged_causal_mask
    from spec_backend.step import RaggedAttentionMetadata

    with torch.inference_mode():
        meta = RaggedAttentionMetadata(query_lens=torch.tensor([1]), kv_lens=torch.tensor([3]))
        first = ragged_causal_mask(meta, 1, 3)
        assert ragged_causal_mask(meta, 1, 3) is first
        meta.kv_lens.fill_(2)
        meta.invalidate()
        assert ragged_causal_mask(meta, 1, 3)[0, 0, 0].tolist() == [True, True, False]
