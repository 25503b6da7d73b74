"""Sliding-window layers keep a ring bounded by their window (issue 39; ``runtime.window_cache``): with
prefix caching off, Gemma 3, Mistral with a sliding window and GPT-OSS run on rings of
``window - 1 + K + 2`` positions per slot, prompts longer than the ring included, and give the tokens of
the full cache, plain and speculative, eager and captured. The negative control shows the attention
must see the ring's own lengths."""

from __future__ import annotations

from typing import Any

import pytest
from engine_fixtures import GREEDY, PROMPTS, CapturingReference, fixed_ngram, one_thread  # noqa: F401  (one_thread: autouse)

from spec_backend.engine import LLM
from spec_backend.runtime.kv_cache import RaggedKVLayer
from spec_backend.runtime.window_cache import WindowKVLayer
from spec_backend.step import RaggedAttentionMetadata
from spec_backend.testing.fixtures.families import WINDOW, make_family_model

WINDOWED = ["gemma3", "mistral", "gpt_oss"]
NGRAM = fixed_ngram(3, 2)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("windows")
    return {name: make_family_model(root / name, name) for name in WINDOWED}


def greedy(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)]


def _llm(path: str, spec: dict[str, Any] | None = None, bounded: bool = True, **kwargs: Any) -> LLM:
    return LLM(
        path, dtype="float32", speculative_config=spec, log_stats_interval=None,
        enable_prefix_caching=not bounded, **kwargs,
    )  # fmt: skip


def _spec(method: str, path: str) -> dict[str, Any]:
    return (
        NGRAM
        if method == "ngram"
        else {
            "adaptive_draft_length": False,
            "method": "draft_model",
            "model": path,
            "num_speculative_tokens": 3,
        }
    )


@pytest.mark.parametrize("family", WINDOWED)
def test_window_layers_keep_rings_and_full_layers_keep_every_position(
    family: str, dirs: dict[str, str]
) -> None:
    """Prefix caching off: each sliding layer is a ring of ``WINDOW - 1 + K + 2`` positions (plus the
    discard column), each full layer keeps ``max_model_len + K``; the slot costs less. Prefix caching on
    (it needs every position): every layer keeps every position."""
    bounded = _llm(dirs[family], NGRAM).engine.runner.cache
    full = _llm(dirs[family], NGRAM, bounded=False).engine.runner.cache
    windows = dict(bounded.layout.windows)
    assert windows and set(windows.values()) == {WINDOW}
    for i, layer in enumerate(bounded.layers):
        if i in windows:
            assert isinstance(layer, WindowKVLayer) and layer.key_ring.shape[2] == WINDOW - 1 + 3 + 2 + 1
        else:
            assert isinstance(layer, RaggedKVLayer) and layer.keys is not None
            assert layer.keys.shape[2] == bounded.max_len + 3
    assert all(isinstance(layer, RaggedKVLayer) for layer in full.layers)
    assert bounded.layout.bytes_per_slot(512, 3) < full.layout.bytes_per_slot(512, 3)


@pytest.mark.parametrize("family", WINDOWED)
@pytest.mark.parametrize("method", [None, "ngram", "draft_model"])
def test_rings_give_the_full_cache_tokens(family: str, method: str | None, dirs: dict[str, str]) -> None:
    """Plain and speculative greedy output on rings equals plain output on the full cache (itself equal
    to transformers' generate, ``test_models_sliding.py``); prompts of 12 and 19 tokens overflow the
    10-position rings in their prefill."""
    path = dirs[family]
    want = greedy(_llm(path, bounded=False))
    llm = _llm(path, _spec(method, path) if method else None)
    assert greedy(llm) == want
    if method is not None:
        assert llm.metrics.total.num_accepted_tokens > 0


def test_negative_control_the_attention_must_see_the_rings_lengths(
    dirs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attention that took the step's full-cache lengths for a ring's keys would mis-place every key
    past the ring's first position: the tokens change."""
    want = greedy(_llm(dirs["mistral"], bounded=False))
    monkeypatch.setattr(RaggedAttentionMetadata, "for_layer", lambda self, module: self)
    assert greedy(_llm(dirs["mistral"])) != want


def test_a_rollback_beyond_the_rings_reach_is_refused(dirs: dict[str, str]) -> None:
    cache = _llm(dirs["mistral"], NGRAM).engine.runner.cache  # K = 3: reach 5
    slot = cache.add_slot()
    cache.lengths[slot] = 20
    cache.truncate(slot, 15)
    with pytest.raises(RuntimeError, match="ring reaches 5 positions back, asked to roll back 6"):
        cache.truncate(slot, 9)


@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])
def test_captured_steps_on_rings(family: str, dirs: dict[str, str]) -> None:
    """Verify steps replayed from captured graphs (the ring views and their lengths built inside the
    graph) give the full cache's tokens."""
    want = greedy(_llm(dirs[family], bounded=False))
    backend = CapturingReference()
    llm = _llm(dirs[family], _spec("draft_model", dirs[family]), backend=backend)
    assert greedy(llm) == want
    assert sum(r.replays for r in backend.runners) > 0
