"""``train-eagle3 --online`` on a tiny target: batched answers, padded batches, the chain metric, a run.

The online trainer batches what the file trainer does one sequence at a time, so each batched piece is
checked against the one-at-a-time form: left-padded answers against each prompt answered alone and the
engine's own greedy output; the padded loss against the per-sequence losses (and, as a negative
control, against the same batch with its padding counted); the chain metric against a direct count.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend_train import online, prompts
from spec_backend_train.eagle3 import Eagle3Trainer, TrainConfig
from spec_backend_train.vocab import draft_vocabulary

from spec_backend.engine import LLM, SamplingParams
from spec_backend.runtime.hidden import HiddenCapture
from spec_backend.runtime.loader import load_model
from spec_backend.runtime.sources import resolve_model
from spec_backend.step import HiddenStateRequest
from spec_backend.tools.tiny import make_tiny_model

AUX, STATES = (1, 2, 3), (1, 2, 3, 6)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny target whose text has structure to learn (larger initial weights than the default: at
    0.02 its distributions are nearly flat, and no head beats chance at their argmax)."""
    folder = tmp_path_factory.mktemp("online") / "target"
    return make_tiny_model(
        folder, "llama", seed=11, with_tokenizer=True, num_hidden_layers=6, initializer_range=0.05
    )


def _model(path: str) -> Any:
    return load_model(resolve_model(path), "sdpa", torch.float32, torch.device("cpu"))


def _trainer(path: str, steps: int = 3) -> tuple[Eagle3Trainer, HiddenCapture]:
    d2t, t2d = draft_vocabulary(torch.arange(128, 0, -1), 96)
    model = _model(path)
    trainer = Eagle3Trainer(path, TrainConfig(AUX, d2t, t2d, steps, 3e-3, 0, STATES), target=model)
    return trainer, HiddenCapture(model, HiddenStateRequest(aux_layer_ids=STATES), 6)


def test_batched_answers_are_each_prompts_own_and_the_engines(target: str) -> None:
    model, asked = _model(target), [[5, 9, 17], [3, 4, 5, 6, 7, 8, 9], [40]]
    batched = online.answer(model, asked, 12, 0.0, 0, eos=2)
    assert batched == [online.answer(model, [p], 12, 0.0, 0, eos=2)[0] for p in asked]  # padding is inert
    plain = LLM(target, dtype="float32").generate(asked, SamplingParams(temperature=0.0, max_tokens=12))
    assert batched == [p + list(o.outputs[0].token_ids) for p, o in zip(asked, plain, strict=True)]
    sampled = [online.answer(model, asked, 12, 0.8, seed, eos=2) for seed in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2] and sampled[0] != batched  # seeded, and not greedy
    assert all(s[: len(p)] == p for s, p in zip(sampled[0], asked, strict=True))


def test_answer_jobs_alternate_greedy_and_sampled_batches_covering_every_prompt() -> None:
    jobs = online.answer_jobs([[1]] * 5, samples=2, batch=2)
    assert [t for _, t in jobs] == [0.0, 0.8, 0.0, 0.8, 0.0, 0.8, 0.8, 0.8, 0.8]
    for temperature, times in ((0.0, 1), (0.8, 2)):
        seen = sorted(i for chunk, t in jobs if t == temperature for i in chunk)
        assert seen == sorted(list(range(5)) * times)


def test_a_padded_batch_has_the_loss_of_its_sequences(target: str) -> None:
    trainer, capture = _trainer(target)
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (9, 23, 16)]
    tokens, lengths = online.padded(seqs, 0)
    with torch.no_grad():
        hidden = online.batch_states(trainer.target, capture, tokens, lengths)  # [3, 23, 4, H]
        batched = float(trainer.loss(tokens, hidden, lengths))
        alone = []
        for seq in seqs:
            one, n = online.padded([seq], 0)
            alone.append(float(trainer.loss(one[0], online.batch_states(trainer.target, capture, one, n)[0])))
        counted = float(trainer.loss(tokens, hidden))  # negative control: the padding as if it were text
    assert batched == pytest.approx(sum(alone) / 3, rel=1e-5)
    assert abs(counted - batched) > 1e-3


def test_chain_acceptance_counts_leading_draft_matches(target: str) -> None:
    trainer, capture = _trainer(target)
    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (14, 20)]
    starts = [4, 9]
    rates = online.chain_acceptance(trainer, capture, seqs, starts, batch=2)
    hits, rows = [0, 0, 0], 0  # the same count, one sequence and one row at a time
    with torch.no_grad():
        for seq, start in zip(seqs, starts, strict=True):
            tokens, n = online.padded([seq], 0)
            hidden = online.batch_states(trainer.target, capture, tokens, n)[0]  # [T, 4, H]
            drafts = [trainer.ids[lg.argmax(-1)][0].tolist() for lg in trainer.unroll(tokens[0], hidden)]
            for t in range(len(seq)):
                if t + 2 >= start and t + 4 < len(seq):
                    rows += 1
                    for j in range(3):
                        if any(drafts[i][t] != seq[t + 2 + i] for i in range(j + 1)):
                            break
                        hits[j] += 1
    assert rows > 0 and rates == pytest.approx([h / rows for h in hits])
    assert rates[0] >= rates[1] >= rates[2]


def test_fit_steps_plans_what_the_time_left_allows() -> None:
    assert online.fit_steps(done=25, seconds_left=100.0, pace=0.5, full=1000) == 225
    assert online.fit_steps(done=25, seconds_left=1000.0, pace=0.5, full=1000) == 1000
    assert online.fit_steps(done=25, seconds_left=-3.0, pace=0.5, full=1000) == 26


def test_prompt_variants_extend_the_instruction_prompts_without_repeats() -> None:
    first = prompts.prompt_variants(1)
    assert first == prompts.instruction_prompts()
    more = prompts.prompt_variants(3)
    assert more[: len(first)] == first and len(set(more)) == len(more) > 2 * len(first)
    assert not set(prompts.prompt_variants(3, held_out=True)) & set(more)
    for variant in (1, 2):  # other dressings keep the subject split
        train = {s for s, _ in prompts.prompt_items(False, variant)}
        assert train and not train & {s for s, _ in prompts.prompt_items(True, variant)}
    with pytest.raises(ValueError, match="variants must be at least 1, got 0"):
        prompts.prompt_variants(0)


def test_online_run_trains_a_servable_head_that_drafts_better_than_untrained(
    target: str, tmp_path: Path
) -> None:
    config = online.OnlineConfig(
        target, str(tmp_path / "head"), dtype="float32", prompts=24, variants=1, samples=3, answer_tokens=30,
        gen_batch=24, batch=8, epochs=8, lr=3e-3, draft_vocab_size=96, ttt_steps=3, eval_prompts=8,
        answers_path=str(tmp_path / "answers.safetensors"),
    )  # fmt: skip
    logs: list[str] = []
    out = online.run(config, logs.append)
    import json

    from safetensors.torch import load_file

    report = json.loads(Path(out, "training.json").read_text())
    assert report["answers"] == 96 and report["steps"] == 8 * 12 and len(report["held_out_chain_int4"]) == 3
    assert report["loss_last_50"] < 0.8 * report["loss_first_50"]
    kept = load_file(str(tmp_path / "answers.safetensors"))
    assert kept["lengths"].numel() == 96 and int(kept["lengths"].sum()) == report["tokens"]
    params, asked = SamplingParams(temperature=0.0, max_tokens=24), [[7, 8, 9, 10], [50, 3]]
    plain = LLM(target, dtype="float32").generate(asked, params)
    llm = LLM(target, dtype="float32", speculative_config={"model": out})
    spec = llm.speculative_config
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("eagle3", 3)
    assert [o.outputs[0].token_ids for o in llm.generate(asked, params)] == [
        o.outputs[0].token_ids for o in plain
    ]
    # the untrained head (the target's layer: it predicts the token already known) against the trained one
    assert sum(report["held_out_chain_after"]) > sum(report["held_out_chain_before"]) + 1.0, report
    total = llm.metrics.total  # and the engine accepts its drafts as the metric says it should
    assert total.num_accepted_tokens / max(1, total.num_drafts) > 1.0


def test_the_step_plan_follows_the_pace_after_a_slow_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the first GPU run planned its steps from steps 5-25 alone (warm-up: 164 ms each
    against 62 ms later) and stopped after 1,135 steps with 40 % of its budget unspent."""
    clock = [0.0]

    class Trainer:  # one second per step for the first 25 steps, then a tenth
        device, target, plans = torch.device("cpu"), None, []

        def reschedule(self, total: int) -> None:
            self.plans.append(total)

        def step(self, *args: Any) -> float:
            clock[0] += 1.0 if len(self.plans) and clock[0] < 25 else 0.1
            return 1.0

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # the module online reads its clock from
    monkeypatch.setattr(online, "batch_states", lambda *args: None)
    trainer = Trainer()
    config = online.OnlineConfig("t", "o", batch=1, epochs=1, budget_s=100.0)
    losses = online.train_batches(trainer, None, [[1, 2, 3, 4, 5]] * 5000, config, 100.0, lambda m: None)
    assert trainer.plans[0] == 5000 and trainer.plans[1] < 200  # planned from the slow start at step 25
    assert 700 < len(losses) < 1000  # then from the real pace: ~25 + (100 - 32.5) / 0.1 steps
    assert trainer.plans[-1] - 1 <= len(losses) <= trainer.plans[-1]  # (or the deadline, one step early)


def test_bad_settings_are_refused_with_the_value_and_what_is_allowed() -> None:
    with pytest.raises(
        ValueError, match=r"batch must be at least 1, got 0; samples must be at least 0, got -1"
    ):
        online.OnlineConfig("t", "o", batch=0, samples=-1)
    with pytest.raises(ValueError, match=r"answer_share must be in \(0, 1\], got 1.5"):
        online.OnlineConfig("t", "o", answer_share=1.5)
    with pytest.raises(
        ValueError, match=r"self_prompts must be at least 0, got -2; families must name some of"
    ):
        online.OnlineConfig("t", "o", self_prompts=-2, families=("topic", "chit"))


def test_the_int4_round_trip_is_what_the_int4_drafter_computes_with() -> None:
    from spec_backend_train.quant import int4_round_trip

    from spec_backend.cpu.int4_linear import Int4Linear, quantize_int4

    g = torch.Generator().manual_seed(5)
    linear = torch.nn.Linear(96, 48, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 96, generator=g) * 0.1)
    found = quantize_int4(linear.weight)
    assert found is not None
    x = torch.randn(6, 96, generator=g)
    with torch.no_grad():
        served = Int4Linear(linear, *found)(x)  # int4 codes, activations rounded by the kernel
        trip, plain = x @ int4_round_trip(linear.weight).T, linear(x)
    # the served layer is far closer to the round trip (activation rounding only) than to the float layer
    assert (served - trip).abs().max() < 0.25 * (served - plain).abs().max()
    with pytest.raises(ValueError, match=r"multiple of 32, got \[4, 40\]"):
        int4_round_trip(torch.zeros(4, 40))


def test_int4_weights_round_trip_inside_and_restore_exactly(target: str) -> None:
    from spec_backend_train.quant import int4_linears, int4_round_trip, int4_weights

    trainer, _ = _trainer(target)
    layers = int4_linears(trainer.head)
    names = {n for n, m in trainer.head.named_modules() if m in layers}
    assert {"fc", "lm_head", "layers.0.self_attn.q_proj", "layers.0.mlp.down_proj"} <= names
    before = [m.weight.detach().clone() for m in layers]
    with int4_weights(layers):
        assert all(torch.equal(m.weight, int4_round_trip(w)) for m, w in zip(layers, before, strict=True))
    assert all(torch.equal(m.weight, w) for m, w in zip(layers, before, strict=True))
    assert not all(torch.equal(int4_round_trip(w), w) for w in before)  # the round trip changes them


def test_quantization_aware_steps_take_the_round_trips_gradient_and_keep_float_weights(target: str) -> None:
    """Straight-through estimator: a QAT step's loss and update are those of the same head with its
    weights rounded, applied to the float weights (which stay off the int4 grid)."""
    from dataclasses import replace

    from spec_backend_train.quant import int4_linears, int4_round_trip

    qat, capture = _trainer(target)
    qat.config = replace(qat.config, qat_int4=True)
    rounded, _ = _trainer(target)
    with torch.no_grad():
        for layer in int4_linears(rounded.head):
            layer.weight.copy_(int4_round_trip(layer.weight))
    tokens, lengths = online.padded([list(range(3, 40)), list(range(50, 70))], 0)
    hidden = online.batch_states(qat.target, capture, tokens, lengths)
    start = {n: p.detach().clone() for n, p in qat.head.named_parameters()}
    assert qat.step(tokens, hidden, lengths) == pytest.approx(rounded.step(tokens, hidden, lengths), rel=1e-6)
    qat_layers, rounded_layers = int4_linears(qat.head), int4_linears(rounded.head)
    names = [n for n, m in qat.head.named_modules() if m in qat_layers]
    for name, a, b in zip(names, qat_layers, rounded_layers, strict=True):
        assert a.weight.grad is not None and b.weight.grad is not None
        assert torch.allclose(a.weight.grad, b.weight.grad, rtol=1e-5, atol=1e-8)  # the round trip's gradient
        moved = a.weight - start[f"{name}.weight"]  # applied by AdamW to the float weights (decay aside)
        assert torch.allclose(moved, b.weight - int4_round_trip(start[f"{name}.weight"]), atol=1e-4)
        assert not torch.equal(int4_round_trip(a.weight), a.weight)


def test_the_cli_hands_every_online_flag_to_the_run(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: ``--qat-int4`` reached the config but not the parser, so ``train-eagle3 --online``
    failed on every call (``'Namespace' object has no attribute 'qat_int4'``)."""
    from spec_backend.cli import main

    seen: list[online.OnlineConfig] = []

    def run(config: online.OnlineConfig) -> str:
        seen.append(config)
        return config.out_dir

    monkeypatch.setattr(online, "run", run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # --device is checked before the run
    flags = ["--variants", "8", "--samples", "0", "--gen-batch", "512", "--batch", "32", "--budget", "60"]
    out = str(tmp_path / "o")
    command = ["train-eagle3", "--online", "--target", target, "--out", out, "--draft-vocab", "96"]
    assert main([*command, "--device", "cuda", *flags]) == 0
    more = ["--qat-int4", "--families", "topic, why", "--self-prompts", "300"]
    assert main([*command, *more]) == 0
    first, second = seen
    assert (first.device, first.variants, first.samples, first.gen_batch, first.batch, first.budget_s) == (
        "cuda",
        8,
        0,
        512,
        32,
        60.0,
    )
    assert (first.qat_int4, first.families, first.self_prompts) == (False, prompts.CORE, 0)
    assert (second.qat_int4, second.families, second.self_prompts) == (True, ("topic", "why"), 300)


def test_self_written_prompts_are_interleaved_with_the_families(monkeypatch: pytest.MonkeyPatch) -> None:
    assert online.interleaved(["a1", "a2", "a3", "a4"], ["b1", "b2"]) == ["a1", "b1", "a2", "a3", "b2", "a4"]
    assert online.interleaved(["a1"], []) == ["a1"] and online.interleaved([], ["b1"]) == ["b1"]
    from spec_backend_train import self_prompts

    calls: list[tuple[int, int]] = []

    def written(model: Any, tokenizer: Any, count: int, *, seed: int, batch: int) -> tuple[list[str], int]:
        calls.append((count, batch))
        return [f"written {i}" for i in range(count)], 1

    monkeypatch.setattr(self_prompts, "self_prompts", written)
    config = online.OnlineConfig(
        "t", "o", prompts=6, variants=1, families=("why",), self_prompts=3, gen_batch=9
    )
    asked = online.asked_prompts(config, None, None, lambda m: None)
    why = prompts.prompt_variants(1, families=["why"])[:6]
    assert asked == online.interleaved(why, ["written 0", "written 1", "written 2"]) and calls == [(3, 9)]
    plain = online.asked_prompts(dataclasses.replace(config, self_prompts=0), None, None, lambda m: None)
    assert plain == why and calls == [(3, 9)]  # none written when none are asked for


def test_an_online_run_refuses_self_prompts_without_a_chat_template(target: str, tmp_path: Path) -> None:
    config = online.OnlineConfig(
        target, str(tmp_path / "o"), prompts=2, variants=1, self_prompts=2, draft_vocab_size=96
    )
    with pytest.raises(ValueError, match="chat template"):
        online.run(config, lambda m: None)
