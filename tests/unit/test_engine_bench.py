"""``spec-backend bench e2e`` on a tiny model: several samples, medians with their ranges, ratios that
are the ratios of the table's medians (so they agree with the table and with each other)."""

from __future__ import annotations

import pytest
import torch

from spec_backend.tools.bench import format_report, run_e2e_bench
from spec_backend.tools.tiny import make_tiny_model


def test_e2e_bench_reports_medians_ranges_and_consistent_ratios(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = str(make_tiny_model(tmp_path_factory.mktemp("bench"), "llama", seed=0, with_tokenizer=True))
        report = run_e2e_bench(
            model=model,
            max_tokens=4,
            num_prompts=2,
            batch_size=2,
            samples=3,
            log=lambda _: None,
            progress=False,
        )
    finally:
        torch.set_num_threads(threads)
    rows = {(r["system"], r["batch"]): r for r in report["rows"]}
    assert len(rows) == 6 and report["setup"]["samples"] == 3
    for row in rows.values():
        assert row["tokens_per_s_min"] <= row["tokens_per_s"] <= row["tokens_per_s_max"]
        assert row["tokens"] == 2 * 4  # two prompts, four tokens each (no EOS in the tiny model)
        assert row["outputs_differing_from_transformers"] == 0  # greedy: every system, every sample
    plain_b1 = rows[("transformers generate", 1)]["tokens_per_s"]
    lookup_b1 = rows[("transformers prompt-lookup", 1)]["tokens_per_s"]
    ratios = report["ratios"]
    assert ratios["engine plain b1 / transformers plain b1"]["ratio"] == pytest.approx(
        rows[("engine, no speculation", 1)]["tokens_per_s"] / plain_b1, rel=1e-2
    )
    assert ratios["engine ngram b1 / transformers prompt-lookup b1"]["ratio"] == pytest.approx(
        rows[("engine, ngram K=4", 1)]["tokens_per_s"] / lookup_b1, rel=1e-2
    )
    for value in ratios.values():
        assert value["min"] <= value["max"]
    # two ratios over the same denominator agree with the ratio of their numerators
    b2 = (
        ratios["engine ngram b2 / transformers plain b1"]["ratio"]
        / ratios["engine plain b2 / transformers plain b1"]["ratio"]
    )
    assert b2 == pytest.approx(
        rows[("engine, ngram K=4", 2)]["tokens_per_s"] / rows[("engine, no speculation", 2)]["tokens_per_s"],
        rel=2e-2,
    )
    text = format_report(report)
    assert "ratios of the medians over 3 sample(s)" in text and "tokens/s (median)" in text


def test_e2e_bench_refuses_zero_samples() -> None:
    with pytest.raises(ValueError, match="samples must be an int >= 1, got 0"):
        run_e2e_bench(model="unused", samples=0)
