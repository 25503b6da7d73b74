"""``draft_model``: a separate causal LM drafts; greedy output is the target's, token for token."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - one_thread is an autouse fixture

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.draft_model import DraftModelDrafter
from spec_backend.tools.tiny import make_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=20)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("target"), "llama", seed=0)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A different model with the target's vocabulary (another architecture and seed)."""
    return make_tiny_model(tmp_path_factory.mktemp("draft"), "qwen2", seed=5)


@pytest.fixture(scope="module")
def expected(target_dir: str) -> list[list[int]]:
    llm = LLM(target_dir, dtype="float64")
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def _ids(llm: LLM, params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_identity_with_a_different_draft(
    target_dir: str, draft_dir: str, expected: list[list[int]], k: int
) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": draft_dir,
        "num_speculative_tokens": k,
    }
    llm = LLM(target_dir, dtype="float64", speculative_config=spec)
    assert isinstance(llm.engine.drafter, DraftModelDrafter)
    assert _ids(llm) == expected
    stats = llm.metrics.total
    assert stats.num_draft_tokens > 0  # the draft model really drafted
    assert llm.engine.slots.num_slots == 0 and llm.engine.slots.consistent()  # both caches freed


def test_target_as_its_own_draft_accepts_every_draft(target_dir: str, expected: list[list[int]]) -> None:
    llm = LLM(
        target_dir, dtype="float64", speculative_config={"model": target_dir, "num_speculative_tokens": 3}
    )
    assert llm.speculative_config is not None and llm.speculative_config.method == "draft_model"  # inferred
    assert _ids(llm) == expected
    stats = llm.metrics.total
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens


def test_more_requests_than_slots_and_batch_mates_do_not_matter(target_dir: str, draft_dir: str) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": draft_dir,
        "num_speculative_tokens": 3,
    }
    llm = LLM(target_dir, dtype="float64", speculative_config=spec, max_num_seqs=2)
    together = _ids(llm)  # 4 requests through 2 slots: admissions and slot moves in both caches
    alone = [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS]
    assert together == alone


def test_seeded_sampling_is_reproducible_with_probabilistic_drafts(target_dir: str, draft_dir: str) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": draft_dir,
        "num_speculative_tokens": 3,
        "rejection_sample_method": "probabilistic",
    }
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=12) for s in range(4)]
    llm = LLM(target_dir, dtype="float64", speculative_config=spec)
    first = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    again = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[::-1], params[::-1])][::-1]
    assert first == again  # seeds, not batch order, decide the tokens
    assert llm.metrics.total.num_draft_tokens > 0


def test_vocabulary_mismatch_names_both(target_dir: str, tmp_path: object) -> None:
    other = make_tiny_model(str(tmp_path), "llama", vocab_size=96)
    with pytest.raises(ValueError, match=r"target vocab_size=128, draft vocab_size=96"):
        LLM(
            target_dir,
            speculative_config={
                "adaptive_draft_length": False,
                "method": "draft_model",
                "model": other,
                "num_speculative_tokens": 2,
            },
        )


def test_tokenizer_mismatch_is_refused(tmp_path_factory: pytest.TempPathFactory) -> None:
    target = make_tiny_model(tmp_path_factory.mktemp("tt"), vocab_size=256, with_tokenizer=True)
    draft = make_tiny_model(tmp_path_factory.mktemp("td"), vocab_size=256, with_tokenizer=True)
    vocab_file = os.path.join(draft, "tokenizer.json")
    with open(vocab_file, encoding="utf-8") as f:
        data = json.load(f)
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # same size, two ids swapped
    with open(vocab_file, "w", encoding="utf-8") as f:
        json.dump(data, f)
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": draft,
        "num_speculative_tokens": 2,
    }
    with pytest.raises(ValueError, match="has a different tokenizer from the target"):
        LLM(target, speculative_config=spec)


def test_draft_tensor_parallel_must_be_one(target_dir: str, draft_dir: str) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": draft_dir,
        "num_speculative_tokens": 2,
        "draft_tensor_parallel_size": 2,
    }
    with pytest.raises(ValueError, match="draft_tensor_parallel_size"):
        LLM(target_dir, speculative_config=spec)


def test_kv_budget_counts_the_draft_cache(target_dir: str, draft_dir: str) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": draft_dir,
        "num_speculative_tokens": 2,
    }
    with pytest.raises(
        ValueError, match=r"kv_cache_memory_bytes=1000 cannot hold one request of max_model_len=64"
    ):
        LLM(target_dir, speculative_config=spec, max_model_len=64, kv_cache_memory_bytes=1000)
    # target: 2 layers x 2 heads x dim 8 x (k, v) x 4 bytes = 256 bytes per position, 64 positions;
    # the draft model the same per position, over 64 + K positions (its headroom)
    llm = LLM(
        target_dir, speculative_config=spec, max_model_len=64, max_num_seqs=8, kv_cache_memory_bytes=40_000
    )
    assert llm.engine.max_num_seqs == 40_000 // (256 * 64 + 256 * 66)
