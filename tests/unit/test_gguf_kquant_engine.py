"""The engine on GGUF files of llama.cpp's k-quant mixes and Q8_0 (``cpu/kquant_linear``), written offline
in the file format (``tools/tiny_gguf``) and loaded as users load theirs (``LLM("model.gguf")``): which
layers run from the file's blocks, the exact mixes equal to the reference backend's float32 model, and
greedy speculative output equal to plain output on every mix."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_fixtures import fixed_ngram, one_thread, require_native_kernels  # noqa: F401 - autouse

from spec_backend import paths
from spec_backend.cpu.fast_path import PATH_ENV
from spec_backend.cpu.int4_linear import Int4Linear
from spec_backend.cpu.kquant_linear import K8Linear
from spec_backend.cpu.native_layer import NativeDecoderLayer
from spec_backend.engine import LLM, SamplingParams
from spec_backend.tools.tiny_gguf import write_tiny_llama_gguf

#: mix -> (decoder layers fused into one native call, Q4 layers left on the Q4_1 kernel, k8 layers left by
#: type) for 2 decoder layers and the untied head; fused layers hold their products' weights themselves
EXPECTED = {
    "Q4_K_M": (0, 10, {"Q6_K": 5}),  # q|k|v mixes Q4_K with Q6_K: not one product, not fused
    "Q5_K_M": (2, 0, {"Q6_K": 1}),
    "Q6_K": (2, 0, {"Q6_K": 1}),
    "Q8_0": (2, 0, {"Q8_0": 1}),
    # q_proj float32 (a transposed tall-skinny product beside packed layers: the attention must take it)
    "legacy": (0, 4, {"Q5_0": 4, "Q5_1": 4, "Q8_0": 1}),
}
NGRAM = fixed_ngram(3, 3)
#: prompts that repeat themselves, so ngram drafts are both accepted and rejected
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], [100, 200, 300, 100, 200, 300, 100, 200, 9, 9, 9, 9]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    require_native_kernels()
    folder = tmp_path_factory.mktemp("kquants")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(paths.CACHE_ENV, str(folder / "cache"))  # the de-quantized copies
        yield {mix: write_tiny_llama_gguf(folder / f"tiny-{mix}.gguf", mix) for mix in EXPECTED}


def _kinds(llm: LLM) -> tuple[int, int, dict[str, int]]:
    modules = list(llm.model.modules())
    k8 = Counter(m.kind for m in modules if isinstance(m, K8Linear))
    fused = sum(isinstance(m, NativeDecoderLayer) for m in modules)
    return fused, sum(isinstance(m, Int4Linear) for m in modules), dict(k8)


def _greedy(llm: LLM, **extra: int) -> list[tuple[int, ...]]:
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, **extra))
    return [tuple(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("mix", sorted(EXPECTED))
def test_every_projection_runs_from_the_files_blocks_and_speculation_is_lossless(
    files: dict[str, Path], mix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PATH_ENV, "native")  # the measurement could pick float32 on a loaded machine
    plain = LLM(str(files[mix]), log_stats_interval=None)
    assert _kinds(plain) == EXPECTED[mix]
    head = plain.model.get_output_embeddings()
    assert isinstance(head, K8Linear) and head.weight.shape == (plain.model.config.vocab_size, 256)
    spec = LLM(str(files[mix]), speculative_config=NGRAM, log_stats_interval=None)
    assert _greedy(spec) == _greedy(plain)
    total = spec.metrics.total  # the drafts were neither all accepted nor all rejected
    assert 0 < total.num_accepted_tokens < total.num_draft_tokens


@pytest.mark.parametrize("mix", ["Q5_K_M", "Q6_K", "Q8_0"])
def test_exact_mixes_equal_the_float32_model(
    files: dict[str, Path], mix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The k8 kernel is exact up to summation order: prompt log-probabilities within 1e-4 of the
    reference backend's de-quantized float32 model (noise floor: float32 sums of 256-512 products, about
    1e-6 here), the same greedy tokens. Negative control: the Q4_K_M mix (int8 activations) moves them by
    more than the bound."""
    monkeypatch.setenv(PATH_ENV, "native")
    reference = LLM(str(files[mix]), backend="reference", log_stats_interval=None)
    ours = LLM(str(files[mix]), log_stats_interval=None)
    assert _greedy(ours) == _greedy(reference)
    assert _logprob_gap(ours, reference) <= 1e-4


def test_the_lossy_mix_is_told_apart(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PATH_ENV, "native")
    reference = LLM(str(files["Q4_K_M"]), backend="reference", log_stats_interval=None)
    assert _logprob_gap(LLM(str(files["Q4_K_M"]), log_stats_interval=None), reference) > 1e-4


def test_the_float32_path_keeps_the_de_quantized_weights(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PATH_ENV, "float32")
    assert _kinds(LLM(str(files["Q6_K"]), log_stats_interval=None)) == (0, 0, {})


def _logprob_gap(a: LLM, b: LLM) -> float:
    """The largest difference of the prompt tokens' log-probabilities between two engines."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    gap = 0.0
    for x, y in zip(a.generate(PROMPTS, params), b.generate(PROMPTS, params), strict=True):
        assert x.prompt_logprobs is not None and y.prompt_logprobs is not None
        for p, q in zip(x.prompt_logprobs[1:], y.prompt_logprobs[1:], strict=True):
            assert p is not None and q is not None and p.keys() == q.keys()
            gap = max(gap, max(abs(p[t].logprob - q[t].logprob) for t in p))
    return gap


def test_the_measurement_times_every_path_from_the_files_blocks(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Unpinned, the load-time measurement builds each candidate path from the file's blocks and times it;
    a failure there would be logged as "not measured"."""
    monkeypatch.delenv(PATH_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="spec_backend.backends"):
        LLM(str(files["Q5_K_M"]), log_stats_interval=None)
    line = next(r.getMessage() for r in caplog.records if "path for this model" in r.getMessage())
    assert "not measured" not in line, line
    assert all(
        re.search(rf"{path} \d+\.\d+/\d+\.\d+", line) for path in ("native", "int4-bf16", "float32")
    ), line
