"""``dspark`` from DeepSpec's and speculators' checkpoint formats: greedy identity, every step's drafts and
confidences against DeepSpec's pseudo-code (``dspark_oracle``), a head that predicts the target exactly
(and its negative control), mutations of each head caught, detection and refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dspark_oracle import dspark_drafts
from engine_fixtures import GREEDY, PROMPTS, check_greedy_identity, draft_history, one_thread  # noqa: F401
from safetensors.torch import load_file, save_file

from spec_backend.engine import LLM, SamplingParams
from spec_backend.proposers.dspark import DSparkDrafter
from spec_backend.testing.fixtures.dspark_checkpoints import (
    make_bigram_target,
    write_dspark,
    write_exact_dspark,
)
from spec_backend.tools.tiny import make_tiny_model

#: (format, sample_from_anchor, Markov head, draft vocabulary)
LAYOUTS = [
    ("deepspec", True, "vanilla", None),
    ("speculators", True, "gated", 64),
    ("speculators", None, "rnn", None),  # no sample_from_anchor key: the DFlash layout
]


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("deep"), "llama", num_hidden_layers=6, seed=5)


@pytest.fixture(scope="module")
def plain(deep_target: str) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in LLM(deep_target, dtype="float64").generate(PROMPTS, GREEDY)]


def _head(tmp: Path, target: str, layout: tuple[str, bool | None, str, int | None], **kw: Any) -> str:
    fmt, anchor, markov, vocab = layout
    return write_dspark(
        tmp / "dspark", target, fmt=fmt, sample_from_anchor=anchor, markov=markov, draft_vocab=vocab, **kw
    )


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}-{x[2]}")
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_identity(
    deep_target: str, plain: list[list[int]], tmp_path: Path, layout: Any, k: int
) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "dspark",
        "model": _head(tmp_path, deep_target, layout),
        "num_speculative_tokens": k,
    }
    llm = check_greedy_identity(deep_target, plain, spec, DSparkDrafter)
    assert llm.metrics.total.verify_lengths, "the confidences chose no verify length"


def test_greedy_identity_on_the_cpu_backend(deep_target: str, plain: list[list[int]], tmp_path: Path) -> None:
    spec = {
        "adaptive_draft_length": False,
        "method": "dspark",
        "model": _head(tmp_path, deep_target, LAYOUTS[0]),
        "num_speculative_tokens": 4,
    }
    llm = LLM(deep_target, dtype="float64", backend="cpu", speculative_config=spec)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    assert llm.metrics.total.num_draft_tokens > 0


def _history(
    llm: LLM, prompt: list[int], steps: int
) -> tuple[list[int], list[tuple[int, list[int], list[float]]]]:
    """Greedy ``prompt`` alone: the tokens, and per step (committed count, drafts, confidences)."""
    drafter: Any = llm.engine.drafter
    propose, seen = drafter.propose, []

    def spy(inputs: Any) -> Any:
        out = propose(inputs)
        n = out.num_draft_tokens[0]  # within the budget
        conf = out.confidence[0, :n].tolist() if out.confidence is not None else []
        seen.append((inputs.requests[0].num_tokens, out.token_ids[0, :n].tolist(), conf))
        return out

    drafter.propose = spy
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=steps))[0].outputs[0]
    return prompt + out.token_ids, seen


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}-{x[2]}")
def test_every_steps_drafts_and_confidences_match_deepspecs_pseudo_code(
    deep_target: str, tmp_path: Path, layout: Any
) -> None:
    head = _head(tmp_path, deep_target, layout, seed=3, block_size=5)
    k = 4
    llm = LLM(deep_target, dtype="float64", speculative_config={"model": head, "num_speculative_tokens": k})
    for prompt in ([40], PROMPTS[2]):
        tokens, seen = _history(llm, prompt, 10)
        assert len(seen) >= 3
        for n, drafts, conf in seen:
            want, want_conf = dspark_drafts(deep_target, head, tokens[:n], k)
            assert drafts == want[: len(drafts)], f"drafts after {n} tokens"  # budgets shrink at the end
            assert conf == pytest.approx(want_conf[: len(conf)], rel=2e-6), f"confidences after {n} tokens"


def test_the_threshold_rule_verifies_up_to_the_first_unconfident_draft(
    deep_target: str, tmp_path: Path
) -> None:
    head = _head(tmp_path, deep_target, LAYOUTS[0], seed=3, block_size=5)
    spec = {"model": head, "num_speculative_tokens": 4, "confidence_threshold": 0.6}
    llm = LLM(deep_target, dtype="float64", speculative_config=spec)
    chosen: list[int] = []
    verify = llm.engine.verify_lengths

    def spy(requests: Any, out: Any, budgets: Any) -> Any:
        lengths = verify(requests, out, budgets)
        if len(requests) == 1:
            conf = out.confidence[0].tolist()
            want = next((i for i, c in enumerate(conf) if c < 0.6), len(conf))
            assert lengths[0] == min(want, budgets[0]), (conf, lengths)
            chosen.append(lengths[0])
        return lengths

    llm.engine.verify_lengths = spy  # type: ignore[method-assign]
    llm.generate([PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=24))
    assert len(set(chosen)) > 1, f"the rule never varied the length: {chosen}"


@pytest.fixture(scope="module")
def bigram(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_bigram_target(tmp_path_factory.mktemp("bigram"))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_head_that_predicts_the_target_is_always_accepted(
    bigram: str, tmp_path: Path, temperature: float
) -> None:
    spec = {"model": write_exact_dspark(tmp_path / "exact", bigram), "num_speculative_tokens": 4}
    spec["rejection_sample_method"] = "probabilistic"
    llm = LLM(bigram, dtype="float64", speculative_config=spec)
    params = SamplingParams(temperature=temperature, max_tokens=24, seed=1)
    llm.generate(PROMPTS, params)
    total = llm.metrics.total
    assert total.num_draft_tokens > 20 and total.num_accepted_tokens == total.num_draft_tokens
    wrong = LLM(
        bigram,
        dtype="float64",
        speculative_config={**spec, "model": write_exact_dspark(tmp_path / "w", bigram, shift=1)},
    )
    wrong.generate(PROMPTS, params)  # negative control: the Markov head reads the wrong previous token
    assert wrong.metrics.total.num_accepted_tokens < 0.6 * wrong.metrics.total.num_draft_tokens  # 0.41 at T=1


def _drafts_after_mutation(target: str, head: str, mutate: Any) -> list[list[int]]:
    tensors = load_file(os.path.join(head, "model.safetensors"))
    mutate(tensors)
    save_file(tensors, os.path.join(head, "model.safetensors"))
    llm = LLM(target, dtype="float64", speculative_config={"model": head, "num_speculative_tokens": 3})
    return [d for _, d, _ in _history(llm, PROMPTS[2], 12)[1]]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}-{x[2]}")
def test_each_markov_head_changes_the_drafts(deep_target: str, tmp_path: Path, layout: Any) -> None:
    """Negative control: with the Markov bias removed (``markov_w2`` zero), drafts are the backbone's
    argmax alone, and they differ."""
    head = _head(tmp_path, deep_target, layout, seed=3)
    before = _drafts_after_mutation(deep_target, head, lambda t: None)
    after = _drafts_after_mutation(deep_target, head, lambda t: t["markov_head.markov_w2.weight"].zero_())
    assert before != after


def _drafts(target: str, head: Path) -> list[list[int]]:
    """Every step's drafts of a greedy run of ``PROMPTS[2]`` with the head at ``head`` (K=3)."""
    llm = LLM(target, dtype="float64", speculative_config={"model": str(head), "num_speculative_tokens": 3})
    return [d for _, d, _ in _history(llm, PROMPTS[2], 12)[1]]


def test_the_anchor_layout_is_read_from_the_checkpoint(deep_target: str, tmp_path: Path) -> None:
    """The same weights read in the other layout draft something else (the misreading vLLM once had)."""
    head = Path(_head(tmp_path, deep_target, ("speculators", True, "vanilla", None), seed=3))
    anchor = _drafts(deep_target, head)
    config = json.loads((head / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**config, "sample_from_anchor": False}))
    shifted = _drafts(deep_target, head)
    assert anchor != shifted


def test_a_changed_confidence_head_changes_the_lengths(deep_target: str, tmp_path: Path) -> None:
    head = _head(tmp_path, deep_target, LAYOUTS[0], seed=3)
    spec = {"model": head, "num_speculative_tokens": 3, "confidence_threshold": 0.6}
    lengths = []
    for bias in (1.0, -5.0):  # -5: every confidence below 0.6, nothing verified
        tensors = load_file(os.path.join(head, "model.safetensors"))
        tensors["confidence_head.proj.bias"].fill_(bias)
        save_file(tensors, os.path.join(head, "model.safetensors"))
        llm = LLM(deep_target, dtype="float64", speculative_config=spec)
        llm.generate(PROMPTS, GREEDY)
        lengths.append(llm.metrics.total.verify_lengths)
    assert sum(lengths[0][1:]) > 0 and lengths[1][1:] == [] and lengths[1][0] > 0


def test_the_checkpoint_alone_selects_dspark_and_its_block(deep_target: str, tmp_path: Path) -> None:
    deepspec = write_dspark(tmp_path / "a", deep_target, block_size=5)  # a name that matches no pattern
    llm = LLM(deep_target, speculative_config={"model": deepspec})
    assert llm.speculative_config is not None and llm.speculative_config.method == "dspark"
    assert llm.speculative_config.num_speculative_tokens == 5 and isinstance(
        llm.engine.drafter, DSparkDrafter
    )
    old = write_dspark(tmp_path / "b", deep_target, fmt="speculators", sample_from_anchor=None, block_size=5)
    llm = LLM(deep_target, speculative_config={"model": old})
    assert llm.speculative_config is not None and llm.speculative_config.num_speculative_tokens == 4


def _refused(target: str, spec: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LLM(target, speculative_config=spec)


def test_bad_checkpoints_and_options_are_refused(deep_target: str, tmp_path: Path) -> None:
    head = Path(write_dspark(tmp_path / "h", deep_target, block_size=4))
    config = json.loads((head / "config.json").read_text())
    spec = {
        "adaptive_draft_length": False,
        "method": "dspark",
        "model": str(head),
        "num_speculative_tokens": 3,
    }
    _refused(
        deep_target,
        {**spec, "num_speculative_tokens": 5},
        r"num_speculative_tokens=5 exceeds .* \(4: block_size 4",
    )
    _refused(
        deep_target,
        {**spec, "confidence_threshold": 1.5},
        r"confidence_threshold must be in \[0, 1\], got 1.5",
    )
    _refused(
        deep_target,
        {**spec, "confidence_verification": "throughput", "confidence_threshold": 0.5},
        "acts only with",
    )
    _refused(
        deep_target,
        {
            "adaptive_draft_length": False,
            "method": "ngram",
            "num_speculative_tokens": 2,
            "confidence_verification": "off",
        },
        "needs a drafter with a confidence head",
    )
    for key, value, match in (
        ("architectures", ["Gemma4DSparkModel"], "architectures\\[0\\]='Gemma4DSparkModel'"),
        ("num_target_layers", 40, "num_target_layers=40; this target has 6 layers"),
        ("markov_head_type", "lstm", "markov_head_type must be one of"),
        ("target_layer_ids", [0, 9], r"target_layer_ids \[0, 9\] must be layer ids in -1..5"),
    ):
        (head / "config.json").write_text(json.dumps({**config, key: value}))
        _refused(deep_target, spec, match)
    (head / "config.json").write_text(json.dumps({**config, "enable_confidence_head": False}))
    tensors = load_file(str(head / "model.safetensors"))
    save_file(
        {k: t for k, t in tensors.items() if not k.startswith("confidence_head")},
        str(head / "model.safetensors"),
    )
    _refused(
        deep_target, {**spec, "confidence_verification": "threshold", "confidence_threshold": 0.5}, "has none"
    )
    llm = LLM(deep_target, speculative_config=spec)  # no head: every draft is verified
    assert llm.engine.confidence is None
    (head / "config.json").write_text(json.dumps({**config, "enable_confidence_head": True}))
    _refused(deep_target, spec, r"missing \['confidence_head.proj.bias', 'confidence_head.proj.weight'\]")


def test_throughput_is_the_one_policy_and_seeded_requests_keep_every_draft(
    deep_target: str, tmp_path: Path
) -> None:
    head = _head(tmp_path, deep_target, LAYOUTS[0], seed=3)
    spec = {"model": head, "num_speculative_tokens": 3, "adaptive_draft_length": True}
    spec["rejection_sample_method"] = "probabilistic"
    llm = LLM(deep_target, dtype="float64", speculative_config=spec)
    assert llm.engine.adaptive is None and llm.engine.confidence is not None  # one policy
    unset = {k: v for k, v in spec.items() if k != "adaptive_draft_length"}
    assert LLM(deep_target, speculative_config=unset).engine.adaptive is None  # not on by default beside it
    seen: list[tuple[bool, int, int]] = []  # (seeded, verified, available)
    verify = llm.engine.verify_lengths

    def spy(requests: Any, out: Any, budgets: Any) -> Any:
        lengths = verify(requests, out, budgets)
        for r, n, b, length in zip(requests, out.num_draft_tokens, budgets, lengths, strict=True):
            seen.append((r.params.seed is not None, length, min(n, b)))
        return lengths

    llm.engine.verify_lengths = spy  # type: ignore[method-assign]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=30) for s in (1, None, 2, None)]
    llm.generate(PROMPTS, params)
    seeded = [(v, a) for s, v, a in seen if s]
    assert seeded and all(v == a for v, a in seeded)
    assert any(v < a for s, v, a in seen if not s), "unseeded requests were never cut by confidence"
