"""GPU tier: the architectures whose cache is not plain keys and values, through real CUDA graphs.

Hybrid linear-attention targets (Qwen3.5: Gated DeltaNet; Bamba: Mamba-2) keep recurrent state that
a rollback recomputes from buffers the captured step fills by tensor copies, and sliding-window layers
(Gemma 3, prefix caching off) keep window rings whose views and lengths the captured step builds. A real
graph replay runs no Python, so these are the runs the CPU tier's simulated driver cannot stand in for:
greedy speculative output with graphs on equals the reference backend's plain output, float32.
Mixture-of-experts targets (Qwen3-MoE, GPT-OSS, and Qwen3-Next, a hybrid with experts) run transformers'
experts implementation: captured in bfloat16; in float32, where torch's ``grouped_mm`` may copy from the
host, either captured and equal to the reference or refused by name at ``LLM(...)``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from spec_backend_cuda import CudaBackend
from test_gpu_engine import PROMPTS

pytestmark = pytest.mark.cuda
os.environ.setdefault("HF_HUB_OFFLINE", "1")

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}


def _generate(
    path: str, backend: object, spec: dict[str, Any] | None, prefix: bool | None, dtype: str = "float32"
) -> list[list[int]]:
    from spec_backend.engine import LLM, SamplingParams

    llm = LLM(
        path, speculative_config=spec, backend=backend, dtype=dtype, log_stats_interval=None,  # type: ignore[arg-type]
        enable_prefix_caching=prefix,
    )  # fmt: skip
    assert llm.engine.captured is not None or not isinstance(backend, CudaBackend)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16))
    assert all(o.outputs[0].finish_reason != "error" for o in outs), [o.outputs[0].error for o in outs]
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "qwen3_next"])
def test_mixture_of_experts_targets_capture(family: str, tmp_path: Any) -> None:
    pytest.importorskip("transformers")
    from spec_backend.backends.reference import ReferenceBackend
    from spec_backend.runtime.captured import GraphCaptureError
    from spec_backend.testing.fixtures.families import make_family_model

    path = make_family_model(tmp_path / family, family)
    outs = _generate(path, CudaBackend(), NGRAM, prefix=False, dtype="bfloat16")
    assert all(len(o) == 16 for o in outs)
    try:
        got = _generate(path, CudaBackend(), NGRAM, prefix=False)
    except GraphCaptureError as exc:
        assert "enforce_eager=True" in str(exc)
        return
    assert got == _generate(path, ReferenceBackend(), None, prefix=None)


@pytest.mark.parametrize("family", ["qwen3_5", "bamba", "gemma3"])
def test_captured_speculation_equals_reference_plain(family: str, tmp_path: Any) -> None:
    pytest.importorskip("transformers")
    from spec_backend.backends.reference import ReferenceBackend
    from spec_backend.testing.fixtures.families import make_bigram_draft, make_family_model

    path = make_family_model(tmp_path / family, family)
    want = _generate(path, ReferenceBackend(), None, prefix=None)  # the full cache for window layers
    draft = {
        "method": "draft_model",
        "model": make_bigram_draft(path, tmp_path / "draft"),
        "num_speculative_tokens": 3,
    }
    for spec in (NGRAM, draft):
        assert _generate(path, CudaBackend(), spec, prefix=False) == want, spec["method"]
