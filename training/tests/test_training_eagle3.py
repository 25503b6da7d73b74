"""The EAGLE-3 trainer end to end on a tiny target: extract → draft vocabulary → TTT training → serve.

Hidden states come from the engine's own ``extract_hidden_states``; the head is trained against the
target's next-token distribution and saved in the ``speculators`` format, which the loader reads without
being told the method. Behaviour checked: the loss falls, the served head keeps greedy output identical,
and it is accepted more often than the same head before training (the untrained head is the negative
control: same shapes, same initialisation, no optimiser steps).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend_train.data import extract
from spec_backend_train.eagle3 import (
    Eagle3Trainer,
    TrainConfig,
    epoch_order,
    head_tensors,
    lr_factor,
    ttt_mask,
)
from spec_backend_train.vocab import draft_vocabulary

from spec_backend.engine import LLM, SamplingParams
from spec_backend.tools.tiny import make_tiny_model

AUX = (1, 2, 3)


def test_draft_vocabulary_keeps_the_most_frequent_ids() -> None:
    counts = torch.tensor([5, 0, 9, 9, 1, 7])
    d2t, t2d = draft_vocabulary(counts, 3)
    assert (torch.arange(3) + d2t).tolist() == [2, 3, 5] and t2d.tolist() == [0, 0, 1, 1, 0, 1]
    d2t, _ = draft_vocabulary(counts, 4)  # tie between ids 0 (5) and ... none: 5 > 1
    assert (torch.arange(4) + d2t).tolist() == [0, 2, 3, 5]
    with pytest.raises(ValueError, match=r"size must be in \[1, 6\]"):
        draft_vocabulary(counts, 7)


def test_ttt_mask_lets_each_row_see_its_context_and_its_own_chain() -> None:
    mask = ttt_mask(3, 2)[0, 0].int().tolist()
    assert mask == [
        [1, 0, 0, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0, 0, 1],
    ]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str], list[list[int]]]:
    root = tmp_path_factory.mktemp("train")
    target = make_tiny_model(root / "target", "llama", num_hidden_layers=6, seed=11)
    gen = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(0, 128, (6,), generator=gen).tolist() for _ in range(40)]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=40) for s in range(len(prefixes))]
    texts = [
        p + o.outputs[0].token_ids
        for p, o in zip(prefixes, LLM(target).generate(prefixes, params), strict=True)
    ]
    files = extract(target, texts[:32], str(root / "states"), [*AUX, 6])  # the target's own text
    return target, files, prefixes[32:]


def _acceptance(target: str, head: str, prompts: list[list[int]]) -> float:
    llm = LLM(target, dtype="float32", speculative_config={"model": head}, log_stats_interval=None)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24))
    total = llm.metrics.total
    return total.num_accepted_tokens / max(1, total.num_drafts)


def test_a_trained_head_is_accepted_more_than_an_untrained_one(
    pipeline: tuple[str, list[str], list[list[int]]], tmp_path: Path
) -> None:
    target, files, held_out = pipeline
    from spec_backend_train.data import load

    counts = torch.zeros(128, dtype=torch.int64)
    for path in files:
        counts += torch.bincount(load(path)[0], minlength=128)
    d2t, t2d = draft_vocabulary(counts, 96)
    config = TrainConfig(AUX, d2t, t2d, ttt_steps=3, lr=3e-3, seed=0)
    untrained = Eagle3Trainer(target, config).save(str(tmp_path / "untrained"))
    trainer = Eagle3Trainer(target, config)
    losses = trainer.train(files, epochs=6)
    first, last = sum(losses[:32]) / 32, sum(losses[-32:]) / 32
    assert last < 0.75 * first, f"loss {first:.3f} -> {last:.3f}"
    trained = trainer.save(str(tmp_path / "trained"))

    plain = LLM(target, dtype="float32").generate(held_out, SamplingParams(temperature=0.0, max_tokens=24))
    llm = LLM(target, dtype="float32", speculative_config={"model": trained})
    spec = llm.speculative_config
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("eagle3", 3)
    out = llm.generate(held_out, SamplingParams(temperature=0.0, max_tokens=24))
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in plain]
    after, before = _acceptance(target, trained, held_out), _acceptance(target, untrained, held_out)
    assert after > before + 0.3, f"accepted drafts per step: trained {after:.2f}, untrained {before:.2f}"


def test_learning_rate_warms_up_then_decays_to_a_tenth() -> None:
    factor = lr_factor(120, warmup=20)
    assert [factor(s) for s in (0, 9, 19)] == [pytest.approx(x) for x in (0.05, 0.5, 1.0)]
    assert factor(20) == pytest.approx(1.0) and factor(70) == pytest.approx(0.55)
    assert factor(120) == pytest.approx(0.1) and factor(500) == pytest.approx(0.1)
    assert lr_factor(0)(0) == lr_factor(0)(10_000) == 1.0  # no total: constant


def test_teacher_is_the_targets_distribution_over_the_draft_vocabulary(
    pipeline: tuple[str, list[str], list[list[int]]],
) -> None:
    from spec_backend_train.data import load

    target, files, _ = pipeline
    d2t, t2d = draft_vocabulary(torch.arange(128), 50)  # the 50 highest ids
    trainer = Eagle3Trainer(target, TrainConfig(AUX, d2t, t2d))
    _, hidden = load(files[0])  # [T, 4, H]; column 3 is layer 6 = the last layer's pre-norm output
    model = trainer.target
    logits = model.get_output_embeddings()(model.model.norm(hidden[:, 3].float()))  # [T, 128]
    expected = torch.softmax(logits[:, 78:], dim=-1)  # [T, 50]
    torch.testing.assert_close(trainer.teacher(hidden[:, 3].float()), expected)


def test_shuffled_epochs_are_reproducible_and_differ_from_file_order(
    pipeline: tuple[str, list[str], list[list[int]]],
) -> None:
    assert epoch_order(6, None, 3) == list(range(6))
    first, second = epoch_order(6, 5, 0), epoch_order(6, 5, 1)
    assert sorted(first) == sorted(second) == list(range(6)) and first != second
    assert first == epoch_order(6, 5, 0) and first != list(range(6))
    target, files, _ = pipeline
    d2t, t2d = draft_vocabulary(torch.ones(128, dtype=torch.int64), 128)
    config = TrainConfig(AUX, d2t, t2d, ttt_steps=1, seed=3)
    shuffled = [Eagle3Trainer(target, config).train(files[:6], epochs=2, shuffle=5) for _ in range(2)]
    in_order = Eagle3Trainer(target, config).train(files[:6], epochs=2)
    assert shuffled[0] == shuffled[1] and shuffled[0] != in_order  # same seed, same run


def test_a_head_started_from_the_target_reproduces_the_targets_next_layer(
    pipeline: tuple[str, list[str], list[list[int]]], tmp_path: Path
) -> None:
    from spec_backend_train.data import load
    from transformers import DynamicCache

    target, files, _ = pipeline
    tokens, _ = load(files[0])
    (path,) = extract(target, [tokens.tolist()], str(tmp_path), [1, 2, 3, 4, 6])
    _, hidden = load(path)  # [T, 5, H]: inputs of layers 1, 2, 3, 4 and the last output
    d2t, t2d = draft_vocabulary(torch.ones(128, dtype=torch.int64), 128)
    length = tokens.numel()
    for start, expected_close in ((True, True), (False, False)):  # negative control: random weights
        config = TrainConfig(AUX, d2t, t2d, state_ids=(1, 2, 3, 4, 6), init_from_target=start)
        head = Eagle3Trainer(target, config).head
        with torch.no_grad():
            g = head.combine(hidden[:, :3].flatten(1))[None]  # [1, T, H]
            out = head(tokens[None], g, torch.arange(length)[None], DynamicCache(), None, ttt_mask(length, 0))
        close = torch.allclose(out[0], hidden[:, 3], rtol=1e-4, atol=1e-4)  # layer 3's output
        assert close == expected_close
    with pytest.raises(ValueError, match="copy_target_layer needs fc"):
        Eagle3Trainer(target, TrainConfig(AUX, d2t, t2d, norm_before_fc=True, init_from_target=True))


def test_training_continues_from_a_saved_head(
    pipeline: tuple[str, list[str], list[list[int]]], tmp_path: Path
) -> None:
    from dataclasses import replace

    target, files, _ = pipeline
    d2t, t2d = draft_vocabulary(torch.arange(128), 96)
    config = TrainConfig(AUX, d2t, t2d, ttt_steps=1, lr=3e-3, seed=0)
    trained = Eagle3Trainer(target, config)
    trained.train(files[:4], epochs=1)
    folder = trained.save(str(tmp_path / "head"))  # float32: the weights come back exactly

    resumed = head_tensors(Eagle3Trainer(target, replace(config, init_head=folder)).head)
    fresh = head_tensors(Eagle3Trainer(target, config).head)
    want = head_tensors(trained.head)
    assert resumed.keys() == want.keys() and all(torch.equal(resumed[n], want[n]) for n in want)
    assert not all(torch.equal(fresh[n], want[n]) for n in want)  # negative control: training moved them
    other, _ = draft_vocabulary(torch.arange(128).flip(0), 96)  # the 96 lowest ids
    with pytest.raises(ValueError, match="another draft vocabulary"):
        Eagle3Trainer(target, replace(config, d2t=other, init_head=folder))
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors"):
        Eagle3Trainer(target, replace(config, init_head=str(tmp_path)))
