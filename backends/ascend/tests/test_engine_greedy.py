"""End to end: greedy speculative generation through the embedded engine with the Ascend attention
(under the fake NPU) produces the reference backend's tokens on a tiny random Llama."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from spec_backend_ascend import AscendBackend
from spec_backend_ascend.sampler import AscendSamplerOps


class CpuEmulatedAscend(AscendBackend):
    """The Ascend backend with tensors on the CPU (the fake NPU computes there); its attention and its
    sampler ops (the shared triton kernels, interpreted here) are the Ascend code."""

    def device(self) -> torch.device:
        return torch.device("cpu")


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_greedy_generation_matches_reference(fake_npu: ModuleType, tmp_path: Path, head_dim: int) -> None:
    """Head dims TND accepts (64, 128) verify through TND; the others (32, 256) through BNSD."""
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.tools.tiny import make_tiny_model

    model = make_tiny_model(
        tmp_path / "tiny", hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim
    )
    prompts = [[5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 3], [7, 1, 2, 7, 1], [11, 12, 13]]
    params = engine.SamplingParams(temperature=0.0, max_tokens=12)
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 2,
        "prompt_lookup_min": 1,
    }
    outputs = {}
    for name, backend in (("reference", "reference"), ("ascend", CpuEmulatedAscend())):
        llm = engine.LLM(model, speculative_config=spec, backend=backend, log_stats_interval=None)
        outputs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    assert outputs["ascend"] == outputs["reference"]
    assert isinstance(CpuEmulatedAscend().sampler_ops(), AscendSamplerOps)
    layouts = {c[1]["input_layout"] for c in fake_npu.CALLS if c[0] == "npu_fused_infer_attention_score"}
    decode = "TND" if head_dim in (64, 128) else "BNSD"
    assert layouts == {decode, "BNSD_BSND"}  # verification steps and the 19-token prefill


def test_dspark_matches_reference_through_the_fake_npu(fake_npu: ModuleType, tmp_path: Path) -> None:
    """DSpark (Markov head, confidence-chosen verify lengths, ragged and 0 included) with the Ascend
    attention and sampler ops gives the reference backend's tokens, which are the plain output."""
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark
    from spec_backend.tools.tiny import make_tiny_model

    model = make_tiny_model(
        tmp_path / "tiny", hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64
    )
    spec = {"model": write_dspark(tmp_path / "dspark", model, block_size=4), "num_speculative_tokens": 4}
    prompts = [[5, 9, 5, 9, 5, 9, 5, 9, 3], [7, 1, 2, 7, 1], [11, 12, 13]]
    params = engine.SamplingParams(temperature=0.0, max_tokens=12)
    plain = engine.LLM(model, backend="reference", log_stats_interval=None).generate(prompts, params)
    outputs = {}
    for name, backend in (("reference", "reference"), ("ascend", CpuEmulatedAscend())):
        llm = engine.LLM(model, speculative_config=spec, backend=backend, log_stats_interval=None)
        outputs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        assert llm.metrics.total.num_draft_tokens > 0 and llm.metrics.total.verify_lengths
    assert outputs["reference"] == [list(o.outputs[0].token_ids) for o in plain]
    assert outputs["ascend"] == outputs["reference"]
    assert any(c[0] == "npu_fused_infer_attention_score" for c in fake_npu.CALLS)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_float16_caches_longer_than_a_page_verify_through_captured_tnd(
    fake_npu: ModuleType, tmp_path: Path, head_dim: int
) -> None:
    """A float16 model (hidden 4·d, 4 heads, 2 KV heads) under ngram K = 3 with prompts longer than one
    128-token page: alone (batch 1: the paged cache used to reach the op as a strided view, refused
    with "key must be contiguous") and batched, the captured TND steps give the reference's tokens."""
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.tools.tiny import make_tiny_model

    model = make_tiny_model(
        tmp_path / "fp16",
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        torch_dtype="float16",
    )
    prompts = [[5 + (i % 9) for i in range(n)] for n in (140, 300, 17)]
    params = engine.SamplingParams(temperature=0.0, max_tokens=10)
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    runs: dict[str, list[list[list[int]]]] = {}
    for name, backend in (("reference", "reference"), ("ascend", CpuEmulatedAscend())):
        llm = engine.LLM(
            model, dtype="float16", speculative_config=spec, backend=backend, log_stats_interval=None
        )
        assert (llm.engine.captured is not None) == (name == "ascend")
        alone = [list(llm.generate([p], params)[0].outputs[0].token_ids) for p in prompts]
        batched = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        assert all(o.outputs[0].finish_reason == "length" for o in llm.generate(prompts, params))
        runs[name] = [alone, batched]
    assert runs["ascend"] == runs["reference"]
    replays = [c for c in fake_npu.CALLS if c[0] == "replay"]
    assert replays, "the verify steps replayed a captured graph"


@pytest.mark.parametrize("rings", [False, True])
def test_sliding_window_model_matches_reference_through_captured_steps(
    fake_npu: ModuleType, tmp_path: Path, rings: bool
) -> None:
    """Gemma 3 (sliding and global layers, window 6) under ngram K = 3: prefills, verify steps and
    decode steps replayed from captured graphs give the reference's tokens on prompts longer than the
    window; its windowed layers run the band mode, its global layers right-down causal. ``rings``: the
    windowed layers keep window rings (prefix caching off), whose views the band mode reads."""
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.testing.fixtures.families import WINDOW, make_family_model

    model = make_family_model(tmp_path / "gemma3", "gemma3")
    prompts = [[5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 3], [7, 1, 2, 7, 1], [11, 12, 13]]
    params = engine.SamplingParams(temperature=0.0, max_tokens=12)
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 2,
        "prompt_lookup_min": 1,
    }
    outputs = {}
    for name, backend in (("reference", "reference"), ("ascend", CpuEmulatedAscend())):
        prefix = name == "reference" or not rings
        llm = engine.LLM(
            model, speculative_config=spec, backend=backend, log_stats_interval=None,
            enable_prefix_caching=prefix,
        )  # fmt: skip
        outputs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
    assert outputs["ascend"] == outputs["reference"]
    calls = [c[1] for c in fake_npu.CALLS if c[0].startswith("npu_fused_infer_attention_score")]
    bands = {c.get("pre_tokens") for c in calls if c["sparse_mode"] == 4}
    assert bands == {WINDOW - 1} and any(c["sparse_mode"] == 3 for c in calls)
    assert [c for c in fake_npu.CALLS if c[0] == "replay"], "the verify steps replayed a captured graph"


def test_a_model_with_attention_sinks_is_refused_at_llm(fake_npu: ModuleType, tmp_path: Path) -> None:
    """GPT-OSS's sinks: the fused op has none, so LLM(...) refuses the model before any forward."""
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.backends.base import BackendError
    from spec_backend.testing.fixtures.families import make_family_model

    model = make_family_model(tmp_path / "gpt_oss", "gpt_oss")
    with pytest.raises(BackendError, match="npu_fused_infer_attention_score has no attention sinks"):
        engine.LLM(model, backend=CpuEmulatedAscend(), log_stats_interval=None)


@pytest.mark.parametrize("method", ["dspark", "eagle3"])
def test_token_trees_run_through_the_fused_op_with_an_explicit_mask(
    fake_npu: ModuleType, tmp_path: Path, method: str
) -> None:
    """A branching tree on Ascend: every tree step (the target's and the EAGLE-3 head's levels) calls
    the fused op in BNSD with sparse_mode 0 and a [B, 1, Q, L] mask; greedy output equals plain."""
    engine = pytest.importorskip("spec_backend.engine")
    from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3
    from spec_backend.testing.fixtures.dspark_checkpoints import write_dspark
    from spec_backend.tools.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    head = (
        write_dspark(tmp_path / "dspark", model, block_size=4)
        if method == "dspark"
        else write_eagle3(tmp_path / "eagle3", model, "speculators", aux_ids=[0, 1, 1])
    )
    spec = {
        "adaptive_draft_length": False,
        "method": method,
        "model": head,
        "num_speculative_tokens": 2,
        "speculative_token_tree": "[(0,), (1,), (0, 0), (1, 0)]",
    }
    prompts = [[5, 9, 5, 9, 5, 9, 3], [7, 1, 2, 7, 1], [11, 12, 13]]
    params = engine.SamplingParams(temperature=0.0, max_tokens=10)
    plain = engine.LLM(model, backend="reference", log_stats_interval=None).generate(prompts, params)
    llm = engine.LLM(model, speculative_config=spec, backend=CpuEmulatedAscend(), log_stats_interval=None)
    out = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in plain]
    calls = [c[1] for c in fake_npu.CALLS if c[0].startswith("npu_fused_infer_attention_score")]
    masked = [c for c in calls if c["sparse_mode"] == 0 and c.get("atten_mask") is not None]
    assert masked and all(c["input_layout"] == "BNSD" and c["atten_mask"].dim() == 4 for c in masked)
    assert llm.metrics.total.num_draft_tokens > 2 * llm.metrics.total.num_drafts
